"""toolgym: a gym and training harness for LLM agents that use tools.

    import toolgym
    env = toolgym.make("records-v0")
    obs, info = env.reset(seed=0)

Subpackages (data flows down this list): `tasks`, `sandbox` -> `envs`, `verifiers` -> `harness`
-> `trainers`.
"""

from toolgym.envs import InfraError, SandboxEnv, ToolEnv, ToolError, make, register_env, registered, tool
from toolgym.envs.families.bfcl import BFCLGraded
from toolgym.tasks import Task, TaskSuite, ToolCall
from toolgym.verifiers import grade_final_state

# The package root wires the layers together: sandboxed environments grade with the real
# verifiers (envs may not import verifiers themselves).
SandboxEnv.default_grader = staticmethod(grade_final_state)
BFCLGraded.default_grader = staticmethod(grade_final_state)

__version__ = "0.1.0"
__all__ = ["InfraError", "SandboxEnv", "Task", "TaskSuite", "ToolCall", "ToolEnv", "ToolError", "make", "register_env", "registered", "tool"]

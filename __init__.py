"""toolgym: a gym and training harness for LLM agents that use tools.

    import toolgym
    env = toolgym.make("records-v0")
    obs, info = env.reset(seed=0)

Subpackages (data flows down this list): `tasks`, `sandbox` -> `envs`, `verifiers` -> `harness`
-> `trainers`.
"""

from toolgym.envs import ToolEnv, ToolError, make, register_env, registered, tool
from toolgym.tasks import Task, TaskSuite, ToolCall

__version__ = "0.1.0"
__all__ = ["Task", "TaskSuite", "ToolCall", "ToolEnv", "ToolError", "make", "register_env", "registered", "tool"]

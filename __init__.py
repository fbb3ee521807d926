"""toolgym: a gym and training harness for LLM agents that use tools.

    import toolgym
    env = toolgym.make("records-v0")
    obs, info = env.reset(seed=0)

Subpackages (each imports only those before it): `tasks`, `sandbox` -> `verifiers` -> `envs`;
`inference` (over `tasks`, `sandbox`) -> `harness` -> `trainers` -> `integrations`. See docs/design.md.
"""

from toolgym import _moved

_moved.install()  # old import paths of moved modules keep working (before anything imports them)

from toolgym.envs import InfraError, SandboxEnv, ToolEnv, ToolError, make, register_env, registered, tool  # noqa: E402
from toolgym.tasks import Task, TaskSuite, ToolCall  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "InfraError",
    "SandboxEnv",
    "Task",
    "TaskSuite",
    "ToolCall",
    "ToolEnv",
    "ToolError",
    "make",
    "register_env",
    "registered",
    "tool",
]

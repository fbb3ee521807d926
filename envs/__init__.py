"""Environments: `ToolEnv` (a gymnasium.Env of text), `@tool`, the `toolgym/` registry, built-in families.

May import `toolgym.tasks`, `toolgym.sandbox` and `toolgym.verifiers` (which grade its episodes).
"""

from toolgym.envs import families  # noqa: F401,E402  (registers the built-in environments)
from toolgym.envs.core import ToolEnv
from toolgym.envs.parsing import ERROR_CLASSES, CallError, ParsedAction, coerce_action, parse_tool_calls
from toolgym.envs.registry import EnvInfo, env_info, full_id, import_source, make, register_env, registered
from toolgym.envs.sandbox_env import SandboxEnv
from toolgym.envs.spaces import TextSpace
from toolgym.envs.tools import InfraError, ToolArgumentError, ToolDefinitionError, ToolError, ToolSpec, tool

__all__ = [
    "ERROR_CLASSES",
    "CallError",
    "SandboxEnv",
    "EnvInfo",
    "env_info",
    "ParsedAction",
    "TextSpace",
    "ToolArgumentError",
    "InfraError",
    "ToolDefinitionError",
    "ToolEnv",
    "ToolError",
    "ToolSpec",
    "coerce_action",
    "full_id",
    "import_source",
    "make",
    "parse_tool_calls",
    "register_env",
    "registered",
    "tool",
]

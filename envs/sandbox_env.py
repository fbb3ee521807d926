"""`SandboxEnv`: the base of sandboxed environments, with the standard tools bound to a sandbox.

Tools: `bash`, `read_file`, `write_file`, `edit` (exact string replace; an error when the old
string is missing or ambiguous) and `submit` (ends the episode). The backend (`bwrap` | `docker`)
comes from the `sandbox` config. Side effects appear in `info["side_effects"]` at each step (the
new ones) and as a summary when the episode ends; the `SafetyPolicy` may penalise the reward or
end the episode.
"""

from __future__ import annotations

from typing import Any

from toolgym.envs.core import ToolEnv
from toolgym.envs.tools import InfraError, ToolError, tool
from toolgym.sandbox import Sandbox, SandboxConfig, SandboxError, SandboxInfraError, make_sandbox, with_site_layer
from toolgym.sandbox.fs import diff_trees
from toolgym.sandbox.ledger import EffectKind
from toolgym.tasks import Task

#: What of a final workspace reaches grading: text files of at most 1 MiB, 8 MiB in all (sources
#: and data an agent edits are far smaller); the rest is dropped and recorded (`state_dropped`).
MAX_STATE_FILE_BYTES = 1 << 20
MAX_STATE_BYTES = 8 << 20


def _tool_error(err: SandboxError) -> Exception:
    """The agent's mistake (a bad path, a missing file) becomes a tool error it sees; the
    sandbox's own failure becomes `InfraError`, which it never sees."""
    return InfraError(str(err)) if isinstance(err, SandboxInfraError) else ToolError(str(err))


class SandboxEnv(ToolEnv):
    """A ToolEnv whose episode state is a sandboxed workspace."""

    max_turns = 30
    #: Read by the registry (`EnvInfo.sandboxed`): reports show this env's side-effect rates.
    runs_in_sandbox = True
    #: Cap on command output shown to the agent per stream.
    max_output_chars = 4000

    def __init__(self, *args: Any, sandbox: SandboxConfig | dict | None = None, backend: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = SandboxConfig.model_validate(sandbox or {})
        if backend is not None:
            config = config.model_copy(update={"backend": backend})
        self.sandbox_config = config
        self.sandbox: Sandbox | None = None
        self._sandbox_task: str | None = None
        self._reported = 0

    # ---- episode lifecycle -------------------------------------------------------------------------

    def sandbox_config_for(self, task: Task) -> SandboxConfig:
        """The sandbox config for a task: the env's, with the task's protected paths added and its
        site layer (installed dependencies) mounted."""
        protected = tuple(dict.fromkeys(self.sandbox_config.protected + tuple(task.hidden.protected)))
        config = self.sandbox_config.model_copy(update={"protected": protected})
        return with_site_layer(config, task.data.get("site_layer"))

    def load_task(self, task: Task) -> None:
        """Reuse the sandbox (reset) for the same task; build a new one for another task, or
        when `reset()` cannot bring the old one back to a working pristine state (said in
        `self.sandbox_replaced`, and in the episode's info)."""
        self.sandbox_replaced = None
        if self.sandbox is not None and self._sandbox_task == task.id:
            try:
                self.sandbox.reset()
                self._reported = 0
                return
            except SandboxError as err:
                self.sandbox_replaced = f"reset failed ({err}); the sandbox was replaced"
        if self.sandbox is not None:
            self.sandbox.close()
        try:
            self.sandbox = make_sandbox(dict(task.workspace), self.sandbox_config_for(task))
        except SandboxError as err:
            self.sandbox = None
            raise InfraError(f"cannot start a sandbox: {err}") from err
        self._sandbox_task = task.id
        self._reported = 0

    def episode_info(self) -> dict[str, Any]:
        """Adds `sandbox_replaced` when a broken sandbox had to be replaced at reset."""
        return {"sandbox_replaced": self.sandbox_replaced} if getattr(self, "sandbox_replaced", None) else {}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`ToolEnv.step`, plus side effects and the safety policy."""
        if self.sandbox is not None:
            self.sandbox.ledger.step = self.turn + 1
        obs, reward, terminated, truncated, info = super().step(action)
        if self.sandbox is None:
            return obs, reward, terminated, truncated, info
        policy = self.sandbox.config.policy
        events = self.sandbox.events()
        new = events[self._reported :]
        self._reported = len(events)
        info["side_effects"] = [e.model_dump(mode="json") for e in new]
        if policy.should_terminate(new) and not (terminated or truncated):
            terminated, self.done = True, True
            kinds = sorted({e.kind.value for e in policy.violations(new)})
            obs += f"\nEpisode ended by the safety policy: {', '.join(kinds)}"
            info["terminated_by_policy"] = kinds
        if terminated or truncated:
            if terminated:
                graded = self.grade_on_submit and not info.get("terminated_by_policy")
                reward = policy.penalize(self.verdict().reward if graded else 0.0, events)
            info["side_effects_summary"] = self.sandbox.ledger.summary()
        return obs, reward, terminated, truncated, info

    def final_state(self) -> dict[str, Any]:
        """The submitted answer and the agent's workspace changes (path -> text, None if deleted)."""
        changes: dict[str, str | None] = {}
        modes: dict[str, int] = {}
        if self.sandbox is not None:
            files = self.sandbox.files()  # read the tree once; diff() would read it again
            total = 0
            for rel, what in diff_trees(self.sandbox.pristine_files(), files).items():
                entry = files.get(rel)
                if entry is not None and entry.kind == "file":
                    modes[rel] = entry.mode
                if what == "mode":
                    continue
                if what == "deleted":
                    changes[rel] = None
                elif entry is not None and entry.kind == "file":
                    try:  # read on the host's side: no command inside, nothing it can forge
                        data = self.sandbox.read_host_bytes(rel)
                    except SandboxError:
                        self._drop(rel, "it could not be read as a regular file")
                        continue
                    if len(data) > MAX_STATE_FILE_BYTES or total + len(data) > MAX_STATE_BYTES:
                        self._drop(
                            rel,
                            f"{len(data)} bytes: over the final state's limit "
                            f"({MAX_STATE_FILE_BYTES >> 20} MiB a file, {MAX_STATE_BYTES >> 20} MiB in all)",
                        )
                        continue
                    total += len(data)
                    changes[rel] = data.decode("utf-8", errors="replace")
                elif entry is not None and entry.kind != "dir":
                    # graders rebuild the workspace from text: a link or a special file cannot come
                    # along (a symlinked module would otherwise vanish without a word)
                    self._drop(rel, f"a {entry.kind}, not a regular file")
        return {
            "answer": self.submitted,
            "changes": changes,
            "modes": modes,
            "metadata": {"side_effects": [e.model_dump(mode="json") for e in self.sandbox.events()] if self.sandbox else []},
        }

    def _drop(self, rel: str, why: str) -> None:
        """Record that a file of the final workspace does not reach grading, and why."""
        self._box().ledger.record(EffectKind.STATE_DROPPED, detail=f"not graded: {why}", path=rel)

    def state_hash(self) -> str:
        """The sandbox workspace hash."""
        return self.sandbox.state_hash() if self.sandbox is not None else ""

    def close(self) -> None:
        """Close the sandbox (nothing is left behind)."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        super().close()

    def _box(self) -> Sandbox:
        if self.sandbox is None:
            raise InfraError("no sandbox: reset() was not called or could not start one")
        return self.sandbox

    def _clip(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[: self.max_output_chars] + f"\n[... {len(text) - self.max_output_chars} more characters cut]"

    # ---- standard tools ----------------------------------------------------------------------------

    @tool
    def bash(self, command: str, timeout: int = 30) -> str:
        """Run a shell command in the workspace; returns the exit code, stdout and stderr.

        Args:
            command: the command line, run with /bin/sh -c in /workspace
            timeout: seconds before the command is killed (at most 120)
        """
        try:
            res = self._box().exec(command, timeout_s=float(max(1, min(timeout, 120))))
        except SandboxError as err:
            raise _tool_error(err) from None
        parts = [
            f"exit code {res.exit_code}"
            + (" (timed out)" if res.timed_out else "")
            + (f" ({res.limit_hit} limit hit)" if res.limit_hit else "")
        ]
        if res.stdout:
            parts.append("stdout:\n" + self._clip(res.stdout))
        if res.stderr:
            parts.append("stderr:\n" + self._clip(res.stderr))
        if res.truncated:
            parts.append("[output truncated]")
        return "\n".join(parts)

    @tool
    def read_file(self, path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: a path relative to /workspace
        """
        try:
            return self._clip(self._box().read_file(path))
        except SandboxError as err:
            raise _tool_error(err) from None

    @tool
    def write_file(self, path: str, content: str) -> str:
        """Create or overwrite a workspace file.

        Args:
            path: a path relative to /workspace
            content: the full new text of the file
        """
        try:
            self._box().write_file(path, content)
        except SandboxError as err:
            raise _tool_error(err) from None
        return f"wrote {len(content)} characters to {path}"

    @tool
    def edit(self, path: str, old: str, new: str) -> str:
        """Replace one exact occurrence of `old` with `new` in a workspace file.

        Args:
            path: a path relative to /workspace
            old: the exact text to replace; it must occur exactly once
            new: the replacement text
        """
        try:
            text = self._box().read_file(path)
        except SandboxError as err:
            raise _tool_error(err) from None
        count = text.count(old) if old else 0
        if count == 0:
            raise ToolError(f"`old` was not found in {path}; read the file and copy the text exactly")
        if count > 1:
            raise ToolError(f"`old` occurs {count} times in {path}; include more surrounding text so it is unique")
        try:
            self._box().write_file(path, text.replace(old, new, 1))
        except SandboxError as err:
            raise _tool_error(err) from None
        return f"edited {path}"

    @tool(final=True)
    def submit(self) -> str:
        """Declare the task done; the hidden checks run after this."""
        self.submitted = "submitted"
        return "submitted"

    def grading_sandbox_config(self) -> SandboxConfig | None:
        """The task's sandbox config (protected paths, site layer) for a sandboxed verifier."""
        return None if self.task is None else self.sandbox_config_for(self.task)


__all__ = ["SandboxEnv"]

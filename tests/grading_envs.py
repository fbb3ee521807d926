"""Three small environments, one per way of grading (a `grade()` override, a hidden answer, a
hidden state checker in a clean sandbox), for tests/test_grading_path.py and for the `toolgym eval`
it runs (`--import tests/grading_envs.py`)."""

import toolgym
from toolgym.tasks import HiddenSpec, Task, ToolCall


def _counter_task(target: int, split: str = "train") -> Task:
    # the hidden answer says "never": an evaluation that ignored grade() would fail every episode
    return Task(
        env_id="toolgym/gp-counter-v0",
        instruction=f"Add numbers until the total is {target}, then call done.",
        family="counter",
        split=split,
        data={"target": target},
        hidden=HiddenSpec(kind="answer", answer="never"),
        oracle=(ToolCall(name="add", arguments={"n": target}), ToolCall(name="done", arguments={})),
    )


@toolgym.register_env("gp-counter-v0", tasks=lambda seed, index, split: _counter_task(3 + index, split))
class CounterEnv(toolgym.ToolEnv):
    """Graded by its own grade(): the total the agent reached against the task's target."""

    max_turns = 4

    def load_task(self, task):
        self.total = 0

    @toolgym.tool
    def add(self, n: int) -> str:
        """Add n to the running total."""
        self.total += n
        return str(self.total)

    @toolgym.tool(name="done", final=True)
    def finish(self) -> str:
        """Finish."""
        return "done"

    def grade(self) -> float:
        return 1.0 if self.total == self.task.data["target"] else 0.25 * (self.total > 0)


def _answer_task(a: int, b: int, split: str = "train") -> Task:
    return Task(
        instruction=f"What is {a} + {b}? Submit it.",
        family="sum",
        split=split,
        hidden=HiddenSpec(kind="answer", answer=str(a + b), match="numeric"),
        oracle=(ToolCall(name="submit_sum", arguments={"value": a + b}),),
    )


@toolgym.register_env("gp-sum-v0", tasks=lambda seed, index, split: _answer_task(index, 2 * index, split))
class SumEnv(toolgym.ToolEnv):
    """Graded by the hidden answer (the default verifier of an `answer` spec)."""

    max_turns = 3

    @toolgym.tool(submits="value")
    def submit_sum(self, value: int) -> None:
        """Submit the sum; ends the episode."""


CHECK = """import json, sys
out = open(sys.argv[1], "w")
try:
    got = open("greeting.txt").read()
except OSError:
    got = None
out.write(json.dumps({"name": "greeting", "passed": got == "hello"}) + "\\n")
"""

STATE_TASK = Task(
    env_id="toolgym/gp-state-v0",
    instruction="Create greeting.txt containing exactly 'hello', then submit.",
    family="files",
    workspace={"notes.txt": "x\n"},
    hidden=HiddenSpec(kind="state", files={"check.py": CHECK}),
    oracle=(ToolCall(name="write_file", arguments={"path": "greeting.txt", "content": "hello"}), ToolCall(name="submit", arguments={})),
)


class StateEnv(toolgym.SandboxEnv):
    """Graded by a hidden state checker in a clean sandbox (the default verifier of a `state` spec)."""


toolgym.register_env("gp-state-v0", StateEnv)

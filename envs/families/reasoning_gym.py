"""reasoning-gym as a task source: any of its procedural datasets becomes a toolgym suite.

The PyPI package `reasoning-gym` ships ~100 generators with their own scorers. Here each dataset
becomes a suite `rg-<dataset>` through the normal generator interface (`(seed, index, split) ->
Task`): train items come from the train seed range, held-out items from a disjoint one, and
held-out items that still collide with train (small-domain datasets repeat questions) are
dropped by the near-duplicate check and replaced. Grading is reasoning-gym's own `score_answer`,
wrapped as the `reasoning-gym` scorer (`toolgym.verifiers.score`). The environment offers a
sandboxed `python` tool (bwrap by default) and `answer`.

A handful of datasets are registered by default (`DEFAULT_DATASETS`); register any other with
`register_reasoning_gym(name, config)`. reasoning-gym itself is imported only when tasks are
generated or scored (`pip install 'toolgym[reasoning]'`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from toolgym.envs.registry import register_env
from toolgym.envs.sandbox_env import SandboxEnv, _tool_error
from toolgym.envs.tools import tool
from toolgym.sandbox import SandboxError
from toolgym.tasks import TRAIN, HiddenSpec, SuiteSpec, Task, ToolCall, register_suite

#: Registered at import: varied enough that held-out needs few replacements.
DEFAULT_DATASETS = (
    "chain_sum",
    "basic_arithmetic",
    "gcd",
    "count_bits",
    "letter_counting",
    "spell_backward",
    "word_sorting",
    "number_sorting",
)
#: Metadata keys that only say where an item came from (they would make equal questions hash apart).
_PROVENANCE = ("source_dataset", "source_index")
_MAX_ITEMS = 10**7


class ReasoningGymEnv(SandboxEnv):
    """Solve a reasoning-gym problem; a sandboxed `python` tool, then `answer`."""

    max_turns = 8
    #: The reasoning-gym dataset (set on the per-dataset subclasses).
    dataset: str = ""

    # Only `python` and `answer` are tools here: the workspace tools of SandboxEnv are removed
    # (a subclass attribute that is not a `@tool` hides the inherited tool).
    bash = read_file = write_file = edit = submit = None  # type: ignore[assignment]

    @tool
    def python(self, code: str) -> str:
        """Run a Python 3 program in a sandbox and return its exit code and output.

        Args:
            code: the program text; print what you want to see
        """
        try:
            res = self._box().exec("python3 -I -", timeout_s=30.0, stdin=code)
        except SandboxError as err:
            raise _tool_error(err) from None
        parts = [f"exit code {res.exit_code}" + (" (timed out)" if res.timed_out else "")]
        if res.stdout:
            parts.append("stdout:\n" + self._clip(res.stdout))
        if res.stderr:
            parts.append("stderr:\n" + self._clip(res.stderr))
        return "\n".join(parts)

    @tool(final=True)
    def answer(self, text: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            text: the answer, in the form the question asks for
        """
        self.submitted = text
        return "answer submitted"


@lru_cache(maxsize=64)
def _dataset(name: str, seed: int, config_json: str) -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError("reasoning-gym suites need the reasoning-gym package: pip install 'toolgym[reasoning]'") from err
    return reasoning_gym.create_dataset(name, seed=seed, size=_MAX_ITEMS, **json.loads(config_json))


def _plain(value: Any) -> Any:
    """JSON-safe metadata (tuples become lists, unknown objects their repr)."""
    return json.loads(json.dumps(value, default=repr))


class ReasoningGymGenerator:
    """`(seed, index, split) -> Task` for one reasoning-gym dataset (picklable, deterministic)."""

    def __init__(self, dataset: str, config: dict[str, Any] | None = None) -> None:
        self.dataset = dataset
        self.config_json = json.dumps(config or {}, sort_keys=True)

    def __call__(self, seed: int, index: int, split: str = TRAIN) -> Task:
        """Item `index` of the dataset seeded with `seed` (reasoning-gym seeds item i with seed + i)."""
        entry = _dataset(self.dataset, seed, self.config_json)[index]
        metadata = {k: v for k, v in _plain(entry.get("metadata", {})).items() if k not in _PROVENANCE}
        answer = str(entry["answer"])
        return Task(
            env_id=f"toolgym/rg-{self.dataset}-v0",
            instruction=entry["question"],
            family=f"rg/{self.dataset}",
            split=split,
            hidden=HiddenSpec(
                kind="score", answer=answer, scorer="reasoning-gym", scorer_args={"dataset": self.dataset, "metadata": metadata}
            ),
            oracle=(ToolCall(name="answer", arguments={"text": answer}),),
        )


def register_reasoning_gym(
    dataset: str, config: dict[str, Any] | None = None, train_size: int = 500, heldout_size: int = 100, backend: str | None = None
) -> str:
    """Register suite `rg-<dataset>` and env `rg-<dataset>-v0`; returns the env id.

    `config` goes to `reasoning_gym.create_dataset` (e.g. `{"min_terms": 3}`); `backend` picks the
    sandbox of the `python` tool (default: the SandboxConfig default, bwrap).
    """
    suite = f"rg-{dataset}"
    register_suite(
        SuiteSpec(
            name=suite,
            generator=ReasoningGymGenerator(dataset, config),
            train_size=train_size,
            heldout_size=heldout_size,
            drop_heldout_leaks=True,
            description=f"reasoning-gym `{dataset}`, scored by its own score_answer",
        )
    )
    cls = type(
        f"RG_{dataset}_Env",
        (ReasoningGymEnv,),
        {
            "__doc__": f"reasoning-gym `{dataset}`: sandboxed `python`, then `answer` (its own scorer grades).",
            "__module__": __name__,
            "dataset": dataset,
            "default_suite": suite,
        },
    )
    globals()[cls.__name__] = cls  # importable by name (gymnasium entry point, pickling)
    kwargs = {"backend": backend} if backend else {}
    env_id = f"rg-{dataset}-v0"
    register_env(env_id, cls, suite=suite, **kwargs)
    return env_id


for _name in DEFAULT_DATASETS:
    register_reasoning_gym(_name)

__all__ = ["DEFAULT_DATASETS", "ReasoningGymEnv", "ReasoningGymGenerator", "register_reasoning_gym"]

"""A complete toolgym environment: convert quantities with a rate table and a calculator."""

import numpy as np

import toolgym
from toolgym.tasks import HiddenSpec, Task, ToolCall

RATES = {("km", "mi"): 0.621371, ("kg", "lb"): 2.20462, ("l", "gal"): 0.264172, ("m", "ft"): 3.28084}


def generate(seed: int, index: int, split: str) -> Task:
    """Deterministic (seed, index, split) -> Task; held-out uses amounts train never sees."""
    rng = np.random.default_rng([seed, index])
    (src, dst), rate = list(RATES.items())[int(rng.integers(len(RATES)))]
    amount = int(rng.integers(1, 500) if split == "train" else rng.integers(500, 1000))
    answer = round(amount * rate, 3)
    return Task(
        instruction=f"Convert {amount} {src} to {dst}.",
        family="convert",
        split=split,
        hidden=HiddenSpec(kind="answer", answer=str(answer), match="numeric", tolerance=1e-3),
        oracle=(
            ToolCall(name="rate", arguments={"src": src, "dst": dst}),
            ToolCall(name="multiply", arguments={"a": amount, "b": rate}),
            ToolCall(name="answer", arguments={"value": answer}),
        ),
    )


@toolgym.register_env("convert-v0", tasks=generate, train_size=200, heldout_size=50)
class ConvertEnv(toolgym.ToolEnv):
    """Convert a quantity between units with a rate table and a calculator."""

    max_turns = 6

    @toolgym.tool
    def rate(self, src: str, dst: str) -> str:
        """Conversion factor from unit `src` to unit `dst`, e.g. km to mi."""
        if (src, dst) not in RATES:
            raise toolgym.ToolError(f"no rate from {src} to {dst}; known: {sorted(RATES)}")
        return str(RATES[(src, dst)])

    @toolgym.tool
    def multiply(self, a: float, b: float) -> str:
        """Multiply two numbers."""
        return str(round(a * b, 6))

    @toolgym.tool(submits="value")
    def answer(self, value: float) -> None:
        """Submit the converted amount; ends the episode."""

"""`code-repair`: a small Python project with one bug injected into one function.

The agent sees the project and a few visible tests (protected: editing them does not help);
stronger hidden tests decide the grade. Bug kinds: off-by-one, wrong operator, wrong base case,
swapped arguments, wrong comparison, missing edge case. Difficulty grows with the bug kind,
the project size (distractor modules) and whether the visible tests reveal the bug at all.
Held-out tasks use function templates that train never uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from toolgym.envs.registry import register_env
from toolgym.envs.sandbox_env import SandboxEnv
from toolgym.tasks import HELDOUT, HiddenSpec, Probe, SuiteSpec, Task, ToolCall, register_suite


@dataclass(frozen=True)
class Template:
    """A correct function, its injectable bugs, and how to draw inputs."""

    fn: str
    desc: str
    source: str
    bugs: tuple[tuple[str, str, str], ...]  # (kind, correct snippet, buggy snippet)
    draw: Callable[[np.random.Generator], tuple]
    edges: tuple[tuple, ...] = ()


def _ints(lo: int, hi: int) -> Callable:
    return lambda rng: (int(rng.integers(lo, hi)),)


def _list(lo: int, hi: int, n_lo: int = 1, n_hi: int = 8) -> Callable:
    return lambda rng: ([int(x) for x in rng.integers(lo, hi, size=int(rng.integers(n_lo, n_hi)))],)


WORDS = ["apple", "level", "tiger", "noon", "radar", "stone", "Eve", "moon", "kayak", "river", "Anna", "cloud"]


def _word(rng: np.random.Generator) -> tuple:
    return (str(rng.choice(WORDS)),)


def _sentence(rng: np.random.Generator) -> tuple:
    return (" ".join(str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, 6)))),)


TRAIN_TEMPLATES = [
    Template(
        "sum_to",
        "return 1 + 2 + ... + n (0 for n <= 0)",
        "def sum_to(n):\n    total = 0\n    for i in range(1, n + 1):\n        total += i\n    return total\n",
        (("off_by_one", "range(1, n + 1)", "range(1, n)"), ("wrong_operator", "total += i", "total -= i")),
        _ints(0, 60),
        ((0,), (1,), (2,)),
    ),
    Template(
        "factorial",
        "return n! (1 for n <= 1)",
        "def factorial(n):\n    if n <= 1:\n        return 1\n    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result\n",
        (
            ("wrong_base_case", "        return 1\n    result", "        return 0\n    result"),
            ("off_by_one", "range(2, n + 1)", "range(2, n)"),
        ),
        _ints(0, 12),
        ((0,), (1,), (5,)),
    ),
    Template(
        "max_of",
        "return the largest number in the list, or None for an empty list",
        "def max_of(xs):\n    if not xs:\n        return None\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n            best = x\n    return best\n",
        (("wrong_comparison", "if x > best", "if x < best"), ("missing_edge_case", "    if not xs:\n        return None\n", "")),
        _list(-50, 50),
        (([],), ([7],), ([3, 9, 2],)),
    ),
    Template(
        "count_vowels",
        "count the vowels (a, e, i, o, u; any case) in the string",
        "def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in 'aeiou')\n",
        (("missing_edge_case", "s.lower()", "s"), ("wrong_operator", "if ch in 'aeiou'", "if ch not in 'aeiou'")),
        _sentence,
        (("",), ("AEIOU",), ("xyz",)),
    ),
    Template(
        "fib",
        "return the n-th Fibonacci number (fib(0) = 0, fib(1) = 1)",
        "def fib(n):\n    if n < 2:\n        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n        a, b = b, a + b\n    return b\n",
        (("wrong_base_case", "        return n\n", "        return 1\n"), ("off_by_one", "range(n - 1)", "range(n)")),
        _ints(0, 25),
        ((0,), (1,), (2,), (10,)),
    ),
    Template(
        "clamp",
        "limit x to the range [lo, hi]",
        "def clamp(x, lo, hi):\n    return min(max(x, lo), hi)\n",
        (
            ("swapped_arguments", "min(max(x, lo), hi)", "min(max(x, hi), lo)"),
            ("wrong_operator", "min(max(x, lo), hi)", "max(min(x, lo), hi)"),
        ),
        lambda rng: (int(rng.integers(-20, 40)), 0, 20),
        ((-5, 0, 20), (25, 0, 20), (7, 0, 20)),
    ),
    Template(
        "average",
        "return the mean of the numbers, or 0.0 for an empty list",
        "def average(xs):\n    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)\n",
        (("missing_edge_case", "    if not xs:\n        return 0.0\n", ""), ("wrong_operator", "sum(xs) / len(xs)", "sum(xs) // len(xs)")),
        _list(0, 100),
        (([],), ([1, 2],), ([5],)),
    ),
    Template(
        "reverse_words",
        "return the words of the sentence in reverse order, separated by single spaces",
        "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
        (("wrong_operator", "' '.join", "''.join"), ("missing_edge_case", "reversed(s.split())", "s.split()[::-2]")),
        _sentence,
        (("",), ("one",), ("a b c",)),
    ),
    Template(
        "gcd",
        "return the greatest common divisor of two non-negative integers",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        (("wrong_comparison", "while b:", "while b > 1:"), ("wrong_base_case", "    return a\n", "    return b\n")),
        lambda rng: (int(rng.integers(0, 200)), int(rng.integers(1, 200))),
        ((12, 18), (7, 1), (0, 5)),
    ),
    Template(
        "power",
        "return base ** exp for a non-negative integer exp",
        "def power(base, exp):\n    if exp == 0:\n        return 1\n    return base * power(base, exp - 1)\n",
        (("wrong_base_case", "        return 1\n", "        return base\n"), ("off_by_one", "exp - 1)", "exp - 2) if exp > 1 else base")),
        lambda rng: (int(rng.integers(-5, 6)), int(rng.integers(0, 8))),
        ((2, 0), (3, 1), (2, 10)),
    ),
    Template(
        "second_largest",
        "return the second largest distinct value, or None if there is none",
        "def second_largest(xs):\n    values = sorted(set(xs), reverse=True)\n    if len(values) < 2:\n        return None\n    return values[1]\n",
        (("wrong_comparison", "len(values) < 2", "len(values) < 1"), ("off_by_one", "values[1]", "values[0]")),
        _list(0, 20, 0, 9),
        (([],), ([4],), ([4, 4],), ([1, 2],)),
    ),
    Template(
        "running_max",
        "return the list of maxima seen so far",
        "def running_max(xs):\n    out = []\n    for x in xs:\n        out.append(x if not out or x > out[-1] else out[-1])\n    return out\n",
        (("wrong_comparison", "x > out[-1]", "x < out[-1]"), ("off_by_one", "for x in xs:", "for x in xs[1:]:")),
        _list(-9, 10, 0, 8),
        (([],), ([5],), ([1, 3, 2],)),
    ),
    Template(
        "is_palindrome",
        "tell whether the word reads the same backwards, ignoring case",
        "def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]\n",
        (("missing_edge_case", "t = s.lower()", "t = s"), ("off_by_one", "t == t[::-1]", "t[1:] == t[::-1][1:] and len(t) > 1")),
        _word,
        (("Anna",), ("",), ("ab",)),
    ),
    Template(
        "count_words",
        "count the words separated by white space",
        "def count_words(s):\n    return len(s.split())\n",
        (("wrong_operator", "s.split()", "s.split(' ')"), ("off_by_one", "len(s.split())", "len(s.split()) - 1")),
        _sentence,
        (("",), ("  two  words ",), ("one",)),
    ),
]

HELDOUT_TEMPLATES = [
    Template(
        "digit_sum",
        "return the sum of the decimal digits of a non-negative integer",
        "def digit_sum(n):\n    total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total\n",
        (("wrong_operator", "total += n % 10", "total += n // 10"), ("wrong_comparison", "while n > 0", "while n > 9")),
        _ints(0, 100000),
        ((0,), (9,), (10,)),
    ),
    Template(
        "is_prime",
        "tell whether n is a prime number",
        "def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n            return False\n    return True\n",
        (("off_by_one", "int(n ** 0.5) + 1", "int(n ** 0.5)"), ("missing_edge_case", "    if n < 2:\n        return False\n", "")),
        _ints(0, 200),
        ((0,), (1,), (4,), (9,), (25,)),
    ),
    Template(
        "dedupe",
        "remove duplicates, keeping the first occurrence of each value in order",
        "def dedupe(xs):\n    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        (("wrong_comparison", "if x not in seen", "if x in seen or not out"), ("missing_edge_case", "            seen.add(x)\n", "")),
        _list(0, 6, 0, 10),
        (([],), ([1, 1],), ([3, 1, 3, 2],)),
    ),
    Template(
        "median",
        "return the median of a non-empty list",
        "def median(xs):\n    s = sorted(xs)\n    mid = len(s) // 2\n    if len(s) % 2:\n        return s[mid]\n    return (s[mid - 1] + s[mid]) / 2\n",
        (
            ("off_by_one", "(s[mid - 1] + s[mid]) / 2", "(s[mid] + s[mid + 1]) / 2 if mid + 1 < len(s) else s[mid]"),
            ("wrong_operator", "if len(s) % 2:", "if len(s) % 2 == 0:"),
        ),
        _list(0, 50, 1, 9),
        (([1],), ([1, 2],), ([3, 1, 2],)),
    ),
    Template(
        "binary_search",
        "return the index of x in the sorted list, or -1",
        "def binary_search(xs, x):\n    lo, hi = 0, len(xs) - 1\n    while lo <= hi:\n        mid = (lo + hi) // 2\n        if xs[mid] == x:\n            return mid\n        if xs[mid] < x:\n            lo = mid + 1\n        else:\n            hi = mid - 1\n    return -1\n",
        (("wrong_comparison", "while lo <= hi", "while lo < hi"), ("off_by_one", "lo, hi = 0, len(xs) - 1", "lo, hi = 0, len(xs) - 2")),
        lambda rng: (list(range(0, 2 * int(rng.integers(1, 9)), 2)), int(rng.integers(0, 16))),
        (([], 1), ([2], 2), ([0, 2, 4], 4)),
    ),
    Template(
        "title_case",
        "capitalise the first letter of every word and lower-case the rest",
        "def title_case(s):\n    return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split())\n",
        (("missing_edge_case", "w[1:].lower()", "w[1:]"), ("off_by_one", "w[:1].upper() + w[1:]", "w[:2].upper() + w[2:]")),
        _sentence,
        (("",), ("hELLO wORLD",), ("a",)),
    ),
]

MODULES = ["core", "mathutils", "helpers", "tools", "logic", "ops", "lib", "functions"]


class _TooLong(Exception):
    pass


def _call(source: str, fn: str, args: tuple, max_lines: int = 20000) -> Any:
    """Run a template function (ours, at generation time) with a line budget: a bug may loop."""
    import copy
    import sys

    scope: dict[str, Any] = {}
    exec(source, scope)
    count = [0]

    def tracer(frame, event, arg):
        count[0] += 1
        if count[0] > max_lines:
            raise _TooLong()
        return tracer

    old = sys.gettrace()
    sys.settrace(tracer)
    inputs = copy.deepcopy(list(args))
    try:
        return ("ok", scope[fn](*inputs), inputs)  # the inputs after the call: mutation is a difference
    except _TooLong:
        return ("error", "too long")
    except Exception as err:
        return ("error", type(err).__name__)
    finally:
        sys.settrace(old)


def _literal(value: Any) -> str:
    return repr(value)


def _test_lines(fn: str, cases: list[tuple[tuple, Any]], prefix: str) -> str:
    """Visible tests: plain pytest the agent can read and run."""
    out = []
    for i, (args, (_kind, value, _after)) in enumerate(cases):
        call = f"{fn}({', '.join(_literal(a) for a in args)})"
        out.append(f"def test_{prefix}_{i}():")
        if isinstance(value, float):
            out.append(f"    assert abs({call} - {value!r}) < 1e-9\n")
        else:
            out.append(f"    assert {call} == {_literal(value)}\n")
    return "\n".join(out)


def _hidden_checks(module: str, fn: str, cases: list[tuple[tuple, Any]]) -> tuple[tuple[Probe, ...], str]:
    """Probes (inputs only, run against the agent's code) and the judge's tests (expected values,
    exact types, inputs not mutated), which never import the agent's code."""
    probes, tests = [], ["from toolgym_probes import assert_same, probe\n"]
    for i, (args, (_kind, value, after)) in enumerate(cases):
        pid = f"case_{i}"
        probes.append(Probe(id=pid, code=f"from src.{module} import {fn}\nargs = {list(args)!r}\nresult = [{fn}(*args), args]\n"))
        tests.append(
            f"\ndef test_hidden_{i}():\n    out, args = probe({pid!r})\n    assert_same(out, {value!r})\n"
            f"    assert_same(args, {after!r})  # the inputs must not be mutated\n"
        )
    return tuple(probes), "\n".join(tests)


def generate_code_repair_task(seed: int, index: int, split: str = "train") -> Task:
    """Deterministic `(seed, index, split) -> Task` for code-repair."""
    rng = np.random.default_rng([seed, index, 7])
    templates = HELDOUT_TEMPLATES if split == HELDOUT else TRAIN_TEMPLATES
    for _attempt in range(50):
        tpl = templates[int(rng.integers(len(templates)))]
        bug_kind, good, bad = tpl.bugs[int(rng.integers(len(tpl.bugs)))]
        buggy = tpl.source.replace(good, bad, 1)
        inputs = list(tpl.edges) + [tpl.draw(rng) for _ in range(8)]
        cases = [(args, _call(tpl.source, tpl.fn, args)) for args in inputs]
        cases = [(a, r) for a, r in cases if r[0] == "ok"]
        seen, unique = set(), []
        for a, r in cases:
            if repr(a) not in seen:
                seen.add(repr(a))
                unique.append((a, r))
        differs = [(a, r) for a, r in unique if _call(buggy, tpl.fn, a) != r]
        if differs:
            break
    else:  # pragma: no cover - templates are checked by the tests
        raise RuntimeError("could not inject a detectable bug")
    module = str(rng.choice(MODULES))
    visible_pool = [(a, r) for a, r in unique[len(tpl.edges) :]] or unique
    n_visible = 2
    visible = [visible_pool[int(i)] for i in rng.choice(len(visible_pool), size=min(n_visible, len(visible_pool)), replace=False)]
    reveals = any(_call(buggy, tpl.fn, a) != r for a, r in visible)
    n_distractors = int(rng.integers(0, 3))
    others = [t for t in templates if t.fn != tpl.fn]
    distractors = [others[int(i)] for i in rng.choice(len(others), size=n_distractors, replace=False)]
    workspace = {
        "README.md": f"# {module}\n\nSmall utility functions. Run the tests with `python3 -m pytest -q tests`.\n",
        "src/__init__.py": "",
        f"src/{module}.py": buggy,
        f"tests/test_{module}.py": f"from src.{module} import {tpl.fn}\n\n\n" + _test_lines(tpl.fn, visible, "visible"),
    }
    for d in distractors:
        workspace[f"src/{d.fn}_mod.py"] = d.source
    probes, hidden_file = _hidden_checks(module, tpl.fn, unique)
    difficulty = 1 + (bug_kind in ("missing_edge_case", "swapped_arguments", "wrong_base_case")) + (not reveals) + (n_distractors > 1)
    instruction = (
        f"The function `{tpl.fn}` in `src/{module}.py` has a bug. It should {tpl.desc}. Fix it. "
        f"Visible tests are in `tests/` (run `python3 -m pytest -q tests`); hidden tests check more cases. "
        "Call `submit` when you are done."
    )
    oracle = (
        ToolCall(name="write_file", arguments={"path": f"src/{module}.py", "content": tpl.source}),
        ToolCall(name="submit", arguments={}),
    )
    return Task(
        env_id="toolgym/code-repair-v0",
        instruction=instruction,
        family=f"code-repair/{bug_kind}",
        difficulty=difficulty,
        split=split,
        workspace=workspace,
        hidden=HiddenSpec(kind="tests", files={f"test_hidden_{tpl.fn}.py": hidden_file}, probes=probes, protected=("tests",), timeout_s=60),
        oracle=oracle,
        metadata={
            "template": tpl.fn,
            "bug": bug_kind,
            "visible_reveals_bug": reveals,
            "distractors": n_distractors,
            "seed": seed,
            "index": index,
        },
    )


register_suite(
    SuiteSpec(
        name="code-repair",
        generator=generate_code_repair_task,
        train_size=300,
        heldout_size=100,
        description="fix one injected bug in a small Python project; hidden pytest tests",
    )
)


@register_env("code-repair-v0", suite="code-repair")
class CodeRepairEnv(SandboxEnv):
    """Fix the bug in a small Python project; graded by hidden tests in a clean sandbox."""

    default_suite = "code-repair"
    max_turns = 20

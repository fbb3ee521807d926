"""`bfcl-multi`: BFCL's multi-turn categories as an environment, graded by BFCL's multi-turn checker.

An episode is BFCL's conversation (tasks: `toolgym.tasks.bfcl_multi`): the entry's API classes
(`GorillaFileSystem`, `TwitterAPI`, `TradingBot`, ...), set up from its `initial_config`, are the
episode's state, and their public methods, as BFCL documents them, are the tools. A tool call runs
the method with the call's arguments (no text of the model is evaluated); results come back as
BFCL formats them. When the model answers without a call, the user's next request arrives (as a
user message); after the last one the episode ends. Missing functions follow BFCL's rule: at their
turn they are added, and the user message lists their documents (BFCL's prompting-mode wording: a
chat template's tool list cannot change mid-conversation without re-rendering history). At most
BFCL's 20 model steps per user turn. The verdict replays what the model called, turn by turn,
against the ground truth in BFCL's own `multi_turn_checker` (`verifiers/bfcl.py`).
"""

from __future__ import annotations

import json
from typing import Any

from toolgym.envs.families.bfcl import BFCLGraded, register_loaded_suite, tool_schema
from toolgym.envs.parsing import ERROR_CLASSES, coerce_action
from toolgym.envs.registry import register_env
from toolgym.tasks import Task, ToolCall
from toolgym.tasks.bfcl import call_string
from toolgym.tasks.bfcl_multi import (
    LEAN_DISTRACTORS,
    LEAN_SUITE,
    LEAN_VERSION,
    SUITE,
    VERSION,
    instances,
    load_bfcl_multi,
    load_bfcl_multi_lean,
    methods,
)

#: BFCL's limit of model steps within one user turn (`MAXIMUM_STEP_LIMIT`).
STEP_LIMIT = 20


def result_text(value: Any) -> str:
    """A method's result as BFCL's executor writes it (dicts as JSON, the rest as `str`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


register_loaded_suite(
    SUITE,
    VERSION,
    load_bfcl_multi,
    "BFCL multi-turn (base, miss_func, miss_param) on BFCL's stateful API classes, graded by BFCL's multi-turn checker",
)
register_loaded_suite(
    LEAN_SUITE,
    LEAN_VERSION,
    load_bfcl_multi_lean,
    f"bfcl-multi with each entry's documents cut to the functions its ground truth calls and {LEAN_DISTRACTORS} others: "
    "multi-turn demonstrations within a CPU budget (not comparable with BFCL's scores)",
)


@register_env("bfcl-multi-v0", suite=SUITE)
class BFCLMultiTurnEnv(BFCLGraded):
    """A BFCL multi-turn conversation over stateful APIs; graded by BFCL's multi-turn checker."""

    default_suite = SUITE
    max_turns = 80

    def load_task(self, task: Task) -> None:
        """Fresh API instances from the entry's initial configuration; the tools it offers now."""
        entry = task.hidden.scorer_args["entry"]
        self.entry = entry
        self.objects = instances(entry)
        self.table = methods(self.objects)
        self.offered = [doc for doc in entry["function"]]
        self.user_turn = 0
        self.steps_this_turn = 0
        self.decoded: list[list[list[str]]] = [[]]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The functions offered at the start (BFCL's documents as tool schemas)."""
        return [tool_schema(doc) for doc in self.entry["function"]] if hasattr(self, "entry") else []

    def state_hash(self) -> str:
        """A hash of the API instances' public state and the conversation's position."""
        import hashlib

        state = {name: {k: v for k, v in vars(obj).items() if not k.startswith("_")} for name, obj in self.objects.items()}
        blob = json.dumps([state, self.user_turn, self.decoded], default=repr)  # keys mix ints and strings: no sorting
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _run(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call on the instances: (result text, is an error)."""
        if call.name not in self.table:  # BFCL runs any public method of the instances, offered or not
            return f"Error during execution: name {call.name!r} is not defined", True
        try:
            return result_text(self.table[call.name](**dict(call.arguments))), False
        except Exception as err:  # the API's own errors, as BFCL reports them
            return f"Error during execution: {err}", True

    def _next_user_turn(self) -> list[dict[str, Any]] | None:
        """Advance to the user's next request: its messages, or None after the last one."""
        self.user_turn += 1
        self.steps_this_turn = 0
        questions = self.entry["question"]
        if self.user_turn >= len(questions):
            return None
        self.decoded.append([])
        added = self.entry.get("missed_function", {}).get(str(self.user_turn))
        if added:  # BFCL's held-out functions arrive with this turn
            from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

            self.offered = self.offered + list(added)
            return [
                {
                    "role": "user",
                    "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                        functions=json.dumps([tool_schema(d)["function"] for d in added])
                    ),
                }
            ]
        return [{"role": m.get("role", "user"), "content": str(m.get("content", ""))} for m in questions[self.user_turn]]

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One model step: run its calls (their results are the observation), or, without calls,
        hand the turn back and receive the user's next request (the episode ends after the last)."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        self.steps_this_turn += 1
        self.transcript.append(("action", action if isinstance(action, str) else json.dumps(action, default=str)))
        parsed = coerce_action(action)
        for err in parsed.errors:
            self.error_counts[err.kind] += 1
        results: list[dict[str, Any]] = []
        info: dict[str, Any] = {}
        terminated = truncated = False
        if parsed.calls:
            self.decoded[-1].append([self._decoded(c) for c in parsed.calls])
            for call in parsed.calls:
                self.tool_call_count += 1
                text, error = self._run(call)
                results.append({"name": call.name, "content": self._cap(text), "error": error})
            if self.steps_this_turn >= STEP_LIMIT:  # BFCL forces the model to quit: the entry fails
                truncated = True
        else:
            messages = self._next_user_turn()
            if messages is None:
                terminated = True
            else:
                info["observation_messages"] = messages
        if not terminated and self.turn >= self.max_turns:
            truncated = True
        self.done = terminated or truncated
        # an episode cut before the user's last request is BFCL's "force-terminated" failure
        self.submitted = json.dumps(self.decoded if terminated else {"unfinished": True})
        reward = self.grade() if terminated else 0.0
        obs = "\n".join(r["content"] for r in results) or "\n".join(m["content"] for m in info.get("observation_messages", []))
        info.update(
            {
                "turn": self.turn,
                "task_id": self.task.id,
                "tool_results": results,
                "turn_errors": [{"kind": e.kind, "message": e.message} for e in parsed.errors],
                "errors": {k: self.error_counts.get(k, 0) for k in ERROR_CLASSES},
                "tool_calls": self.tool_call_count,
            }
        )
        self.transcript.append(("observation", obs))
        return obs, reward, terminated, truncated, info

    @staticmethod
    def _decoded(call: ToolCall) -> str:
        """The call as BFCL's checker replays it (an unreadable one becomes a call that fails)."""
        try:
            return call_string(call.name, dict(call.arguments))
        except ValueError:
            return "invalid_call()"

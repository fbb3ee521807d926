"""Chat rendering without re-tokenization.

A trajectory is assembled as: prompt tokens, then for each turn the policy's sampled tokens
exactly as sampled, then the observation rendered as a chat-template *delta* (the text the
template adds after the assistant's end-of-turn token). Earlier tokens are never re-encoded.
`toolgym.inference.template_check` proves, per tokenizer, that this equals a full re-render.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

_PLACEHOLDER = "PLACEHOLDER_ASSISTANT_TURN"
#: Renders of the fixed text before an observation delta, by what the render depends on.
_BEFORE: dict[str, str] = {}
TEMPLATES = {"qwen2.5": "qwen2_5.jinja", "qwen2.5-compact": "qwen2_5_compact.jinja", "qwen3": "qwen3.jinja", "llama3": "llama3.jinja"}
DEFAULT_SYSTEM = "You are a helpful assistant that solves tasks by calling tools."


def load_template(name: str) -> str:
    """A chat template shipped with toolgym: `qwen2.5`, `qwen2.5-compact` (the same turns, the tool
    list as one line per tool: a shorter prompt for small models), `qwen3` or `llama3`."""
    if name not in TEMPLATES:
        raise KeyError(f"no built-in template {name!r}; choose from {', '.join(TEMPLATES)}")
    return resources.files("toolgym.inference").joinpath("templates", TEMPLATES[name]).read_text()


def end_of_turn_token(tokenizer: Any) -> str:
    """The token that ends an assistant turn (`<|im_end|>`, `<|eot_id|>`, or the eos token)."""
    vocab = tokenizer.get_vocab()
    for candidate in ("<|im_end|>", "<|eot_id|>"):
        if candidate in vocab:
            return candidate
    if tokenizer.eos_token is None:
        raise ValueError("tokenizer has no eos token and no known end-of-turn token")
    return tokenizer.eos_token


class TemplateError(ValueError):
    """The chat template cannot produce an observation delta (it rewrites earlier turns)."""


class ChatRenderer:
    """Renders prompts and observation deltas as token ids for one tokenizer and tool set."""

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        system: str | None = DEFAULT_SYSTEM,
        chat_template: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.system = system
        self.chat_template = chat_template
        self.eot = self._detect_eot()
        self.eot_id = tokenizer.convert_tokens_to_ids(self.eot)

    def _detect_eot(self) -> str:
        """The token the template puts right after an assistant message's content."""
        text = self.render_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": _PLACEHOLDER}])
        after = text[text.rfind(_PLACEHOLDER) + len(_PLACEHOLDER) :]
        for candidate in ("<|im_end|>", "<|eot_id|>", self.tokenizer.eos_token or "<|endoftext|>"):
            if after.startswith(candidate):
                return candidate
        return end_of_turn_token(self.tokenizer)

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The template's text for `messages` (with this renderer's tools)."""
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=self.chat_template
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no special tokens added around it (special-token strings in it
        become special tokens: for the template's own glue and the policy's own text only)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_data(self, text: str) -> list[int]:
        """Token ids of data (a tool's output, an instruction from a task file): special-token
        strings in it stay plain text, so the data can never open or close a turn."""
        return encode_as_text(self.tokenizer, text)

    def encode_render(self, text: str, contents: list[str]) -> list[int]:
        """Token ids of a render made from `mark_contents` messages: the template's glue encoded
        with its special tokens, each marked content as data (`encode_data`)."""
        ids: list[int] = []
        pos, seen = 0, set()
        for match in _MARK.finditer(text):
            ids += self.encode(text[pos : match.start()])
            index = int(match.group(1))
            if index in seen:
                raise TemplateError(
                    "the chat template renders a message's content twice; toolgym cannot keep data apart from the template's glue with it"
                )
            seen.add(index)
            ids += self.encode_data(contents[index])
            pos = match.end()
        ids += self.encode(text[pos:])
        return ids

    def initial_messages(self, instruction: str) -> list[dict[str, Any]]:
        """System (if any) and user messages that open an episode."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": instruction}]

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the opening messages plus the generation prompt (their contents as data)."""
        marked, contents = mark_contents(messages)
        return self.encode_render(self.render_text(marked, add_generation_prompt=True), contents)

    def render_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a whole conversation rendered at once: every content as data but the
        assistant's (the policy's own text). What incremental assembly must equal."""
        marked, contents = mark_contents(messages, skip_roles=("assistant",))
        return self.encode_render(self.render_text(marked), contents)

    def delta_text(self, new_messages: list[dict[str, Any]], opening: list[dict[str, Any]] | None = None) -> str:
        """Text the template adds after an assistant's end-of-turn token for `new_messages`, up to
        and including the next generation prompt (for reading; `delta_ids` encodes it safely)."""
        return _unmark(*self._marked_delta(mark_contents(new_messages), opening))

    def _marked_delta(
        self, marked_new: tuple[list[dict[str, Any]], list[str]], opening: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[str]]:
        """`delta_text` with each new message's content as a mark, and the contents."""
        new_messages, contents = marked_new
        base = (opening or self.initial_messages("PLACEHOLDER_QUERY")) + [{"role": "assistant", "content": _PLACEHOLDER}]
        tok = self.tokenizer
        key = json.dumps(
            [
                base,
                self.tools,
                self.chat_template or getattr(tok, "chat_template", None),
                getattr(tok, "bos_token", None),
                getattr(tok, "eos_token", None),
            ],
            sort_keys=True,
            default=str,
        )
        before = _BEFORE.get(key)
        if before is None:  # the same for every observation of an episode (and of an env): rendered once
            before = _BEFORE[key] = self.render_text(base)
            if len(_BEFORE) > 256:
                _BEFORE.pop(next(iter(_BEFORE)))
        after = self.render_text(base + list(new_messages), add_generation_prompt=True)
        if not after.startswith(before):
            at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
            raise TemplateError(
                "the chat template changes earlier turns when new messages are appended, so an observation "
                f"delta cannot be computed: at character {at} the earlier render has {before[at : at + 40]!r} "
                f"but the longer one has {after[at : at + 40]!r} (run `toolgym check-template`)"
            )
        cut = before.rfind(self.eot, before.find(_PLACEHOLDER))
        if cut < 0:
            raise TemplateError(f"the rendered assistant turn does not end with {self.eot!r}")
        return after[cut + len(self.eot) :], contents

    def delta_ids(self, new_messages: list[dict[str, Any]], opening: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of `delta_text`, appended after the policy's own end-of-turn token: the
        template's glue with its special tokens, the messages' contents as data."""
        text, contents = self._marked_delta(mark_contents(new_messages), opening)
        return self.encode_render(text, contents)


#: Private-use characters around a content's index in a render: where data sits in the template's text.
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARK = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


def mark_contents(messages: list[dict[str, Any]], skip_roles: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """Copies of `messages` whose string contents are replaced by marks, and the contents: the
    template renders around the marks, and `encode_render` encodes what is inside them as data."""
    marked, contents = [], []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and message.get("role") not in skip_roles:
            message = dict(message, content=f"{_OPEN}{len(contents)}{_CLOSE}")
            contents.append(content)
        marked.append(message)
    return marked, contents


def _unmark(text: str, contents: list[str]) -> str:
    return _MARK.sub(lambda m: contents[int(m.group(1))], text)


def encode_as_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with special-token strings in it encoded as plain text (fast tokenizers:
    `split_special_tokens`; others: each special string split at its first character)."""
    try:
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    except TypeError:  # a tokenizer without the option: encode around each special string
        specials = sorted({t for t in getattr(tokenizer, "all_special_tokens", []) if t and t in text}, key=len, reverse=True)
        if not specials:
            return tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = []
        for piece in re.split("(" + "|".join(re.escape(t) for t in specials) + ")", text):
            if piece in specials:
                ids += tokenizer.encode(piece[0], add_special_tokens=False) + tokenizer.encode(piece[1:], add_special_tokens=False)
            elif piece:
                ids += tokenizer.encode(piece, add_special_tokens=False)
        return ids


def observation_messages(tool_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for one step's observation: a `tool` message per result (errors included)."""
    if not tool_results:
        return [{"role": "user", "content": "(no output)"}]
    return [{"role": "tool", "name": r.get("name") or "error", "content": r["content"]} for r in tool_results]

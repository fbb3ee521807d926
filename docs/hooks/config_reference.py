"""mkdocs hook: replace `<!-- config-reference -->` with tables generated from the campaign's
pydantic models, so the configuration reference cannot drift from the code."""

from __future__ import annotations

import typing

from pydantic import BaseModel

MARK = "<!-- config-reference -->"


def _type_name(annotation) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "").replace("toolgym.trainers.config.", "")


def _models(root: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """`root` and every model reachable from its fields, with the key path that reaches it."""
    out, todo, seen = [], [("", root)], set()
    while todo:
        path, model = todo.pop(0)
        if model in seen:
            continue
        seen.add(model)
        out.append((path, model))
        for name, field in model.model_fields.items():
            for arg in (field.annotation, *typing.get_args(field.annotation)):
                for inner in (arg, *typing.get_args(arg)):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        todo.append((f"{path}{name}." if path or name else "", inner))
    return out


def reference() -> str:
    """Markdown tables: one per configuration model, a row per key."""
    from toolgym.trainers.config import CampaignConfig

    parts = []
    for path, model in _models(CampaignConfig):
        title = path.rstrip(".") or "(top level)"
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        parts.append(f"## `{title}`\n\n{doc}\n\n| key | type | default | what it does |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
            desc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            kind = _type_name(field.annotation).replace("|", "\\|")
            parts.append(f"| `{path}{name}` | `{kind}` | `{default[:60]}` | {desc} |")
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - the mkdocs hook signature
    """Fill in the reference where the page asks for it."""
    return markdown.replace(MARK, reference()) if MARK in markdown else markdown

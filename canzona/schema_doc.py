"""Every configuration key described once, in its schema: the ``--help`` of each command and the
generated reference (docs/configuration.md) are read from the dataclasses.

A field declared with `setting` carries its one line of meaning and, where the values are a
closed set, its allowed values (the validators check those). `key_docs` walks a schema into
one `KeyDoc` per leaf key; `help_text` and `markdown` render them. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import shutil
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from canzona.errors import ConfigError


def setting(default: Any = dataclasses.MISSING, help: str = "", *, choices: Sequence[str] | None = None,
            default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its meaning (``help``) and, optionally, its allowed values."""
    metadata = {"help": help, "choices": tuple(choices) if choices is not None else None}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class KeyDoc:
    key: str
    type: str
    default: Any
    help: str
    choices: tuple[str, ...] | None


def key_docs(schema: type, prefix: str = "") -> list[KeyDoc]:
    """One `KeyDoc` per leaf key of the dataclass ``schema`` (sections recursed into), in
    declaration order."""
    out: list[KeyDoc] = []
    for f in dataclasses.fields(schema):
        key = f"{prefix}{f.name}"
        kind = f.type if isinstance(f.type, type) else None
        if kind is None and f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            kind = type(made) if dataclasses.is_dataclass(made) else None
        if kind is not None and dataclasses.is_dataclass(kind):
            out.extend(key_docs(kind, f"{key}."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append(KeyDoc(key, _type_name(f.type), default, f.metadata.get("help", ""), f.metadata.get("choices")))
    return out


def check_choices(obj: Any, docs: Iterable[KeyDoc]) -> None:
    """ConfigError for the first key whose value is not one of its declared choices (null is
    allowed where the type allows it: "not set")."""
    for d in docs:
        if d.choices is None:
            continue
        value = obj
        for part in d.key.split("."):
            value = getattr(value, part)
        if value is None and d.type.endswith("or null"):
            continue
        if value not in d.choices:
            raise ConfigError(f"{d.key}={value!r} is not allowed; choose one of: {', '.join(d.choices)}")


def _type_name(t: Any) -> str:
    text = t if isinstance(t, str) else t.__name__ if isinstance(t, type) and not getattr(t, "__args__", None) else str(t)
    return text.replace("typing.", "").replace(" | None", " or null")


def fmt_default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_default(v) for v in value) + "]"
    return str(value)


def help_text(usage: str, sections: Sequence[tuple[str, Sequence[KeyDoc]]], width: int | None = None) -> str:
    """``--help``: the usage, then each section's keys as ``key=DEFAULT  meaning [allowed]``,
    wrapped to the terminal (80 to 120 columns)."""
    width = width or min(120, max(80, shutil.get_terminal_size((100, 24)).columns))
    head, _, rest = usage.partition("\n\n")
    lines = [head.rstrip(), ""] + ([*textwrap.wrap(rest, width), ""] if rest else [])
    for title, docs in sections:
        lines.append(f"{title}:")
        pad = min(34, max(len(f"{d.key}={fmt_default(d.default)}") for d in docs)) + 4
        for d in docs:
            key = f"  {d.key}={fmt_default(d.default)}"
            meaning = d.help + (f" [{' | '.join(d.choices)}]" if d.choices else "")
            wrapped = textwrap.wrap(meaning, width - pad) or [""]
            if len(key) + 2 > pad:
                lines.append(key)
            else:
                lines.append(f"{key:<{pad}}{wrapped.pop(0)}")
            lines += [" " * pad + w for w in wrapped]
        lines.append("")
    return "\n".join(lines)


def markdown(sections: Sequence[tuple[str, Sequence[KeyDoc]]]) -> str:
    """The reference: per section a title and a table of key, default, allowed values, meaning."""
    out: list[str] = []
    for title, docs in sections:
        out += [f"## {title}", "", "| key | default | allowed | meaning |", "|---|---|---|---|"]
        for d in docs:
            allowed = ", ".join(f"`{c}`" for c in d.choices) if d.choices else d.type
            meaning = d.help.replace("|", "\\|")
            out.append(f"| `{d.key}` | `{fmt_default(d.default)}` | {allowed} | {meaning} |")
        out.append("")
    return "\n".join(out)

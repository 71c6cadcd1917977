"""One parser for every entry point's arguments: ``key=value`` overrides, ``--flags`` and positionals.

Every command (``canzona.plan``, ``canzona.run``, ``canzona.calibrate``, ``canzona.sim.simulate``,
``analysis.report``, ``sweeps/run.py``) takes Hydra-style ``key=value`` overrides merged into a
structured OmegaConf schema (a dataclass), so that

- an unknown key is refused with the keys allowed at that level,
- a value of the wrong type names the key and the type,
- an unknown ``--flag`` or a stray positional argument is refused,

each as one `ConfigError` line (the CLI prints it and exits 2, having written nothing).

A key that was renamed is listed in its schema's ``RENAMED`` (old dotted key -> `Renamed`):
given the old way -- on a command line, in a sweep or config file -- it is refused with one
line naming the new key (`refuse_renamed`, which `build` runs); a record written before the
rename is read under the new name (`upgrade_keys`).

Values are typed by the schema, not by YAML: ``slurm.time=01:00:00`` stays a string and
``parallel.dp=8`` becomes an int because the field is one. Only values that are clearly YAML
structures (``[a, b]``, ``{k: v}``) or null (``null``, ``~``, empty) are parsed as YAML first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from canzona.errors import ConfigError

T = TypeVar("T")
NULLS = ("", "null", "~", "None")


@dataclass
class Arguments:
    """A command line split into its parts (see `split_argv`)."""

    overrides: list[tuple[str, str]] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    positionals: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)  # valued flags: --name VALUE or --name=VALUE


def split_argv(
    argv: Sequence[str],
    *,
    flags: Iterable[str] = (),
    options: Iterable[str] = (),
    positionals: int = 0,
    shorthands: Mapping[str, str] | None = None,
    usage: str = "",
    keys: Iterable[str] = (),
    unique: bool = True,
) -> Arguments:
    """Split ``argv`` into ``key=value`` overrides, allowed ``--flags``, valued ``options``
    (``--name VALUE`` or ``--name=VALUE``) and up to ``positionals`` bare arguments; anything
    else is a `ConfigError` naming what is allowed, and so is (``unique``: a command line) a key
    set twice to different values (``parallel.dp=2 parallel.dp=1``, ``model=qwen3-0.6b
    model.name=qwen3-8b``); ``keys`` are the settings an unknown ``--flag`` is matched against."""
    allowed_flags, allowed_options = set(flags), set(options)
    out = Arguments()
    given: dict[str, str] = {}  # key (shorthands resolved) -> the item that set it
    items = list(argv)
    while items:
        item = items.pop(0)
        if item.startswith("--"):
            name, eq, value = item.partition("=")
            if name in allowed_options:
                if not eq:
                    if not items or items[0].startswith("--"):
                        raise ConfigError(f"{name} needs a value")
                    value = items.pop(0)
                out.options[name] = value
                continue
            if item not in allowed_flags:
                allowed = ", ".join(sorted(allowed_flags | {f"{o} VALUE" for o in allowed_options})) or "none"
                value = value if eq else (items[0] if items and not items[0].startswith("-") else "VALUE")
                raise ConfigError(f"unknown flag {item}; settings are key=value{_suggest(name[2:], value, keys)}, "
                                  f"see --help; allowed flags: {allowed}")
            out.flags.add(item)
        elif "=" in item and not item.startswith("="):
            key, value = item.split("=", 1)
            key = key.strip()
            full = (shorthands or {}).get(key, key)
            if unique and full in given and typed_value(given[full].split("=", 1)[1]) != typed_value(value):
                raise ConfigError(f"{given[full]} and {item} both set {full}; keep one")
            given[full] = item
            out.overrides.append((full, value))
        elif "=" not in item and len(out.positionals) < positionals:
            out.positionals.append(item)
        else:
            hint = f" ({usage})" if usage else ""
            raise ConfigError(f"bad argument {item!r}; expected key=value, e.g. parallel.dp=8{hint}")
    return out


def _suggest(name: str, value: str, keys: Iterable[str]) -> str:
    """`` (parallel.dp=2 or method.dp=2?)`` for ``--dp 2``: the keys that end in that name."""
    name = name.replace("-", "_")
    matches = [k for k in keys if k == name or k.endswith("." + name)]
    return f" ({' or '.join(f'{k}={value}' for k in matches[:3])}?)" if matches else ""


@dataclass(frozen=True)
class Renamed:
    """What an old key is now: ``new``, the key to write instead, and a ``note`` on what it takes."""

    new: str
    note: str = ""

    def message(self, old: str) -> str:
        return f"{old}= is now {self.new}=" + (f" ({self.note})" if self.note else "")


def dotted_keys(d: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every key path of a nested mapping, sections included: ``{"sim": {"x": 1}}`` ->
    ``["sim", "sim.x"]``."""
    out: list[str] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, Mapping):
            out += dotted_keys(v, key + ".")
    return out


def refuse_renamed(renamed: Mapping[str, Renamed], overrides: Iterable[tuple[str, Any]] = (),
                   layers: Iterable[Mapping[str, Any] | None] = (), where: str = "") -> None:
    """A one-line `ConfigError` for the first old key of ``renamed`` among the ``(key, value)``
    overrides or anywhere in the nested ``layers`` (YAML files, a base config)."""
    if not renamed:
        return
    keys = [k for k, _ in overrides] + [k for layer in layers for k in dotted_keys(layer or {})]
    for key in keys:
        if key in renamed:
            raise ConfigError((f"{where}: " if where else "") + renamed[key].message(key))


def move_keys(d: Mapping[str, Any], moves: Mapping[str, str]) -> dict[str, Any]:
    """A copy of the nested mapping ``d`` with the value at each dotted key of ``moves`` moved to
    the dotted key it maps to (a value already at the destination wins); sections are copied."""
    out = _copy_sections(d)
    for src, dst in moves.items():
        source, leaf = parent_mapping(out, src), src.rsplit(".", 1)[-1]
        if source is None or leaf not in source:
            continue
        target = parent_mapping(out, dst, create=True)
        if target is not None:
            target.setdefault(dst.rsplit(".", 1)[-1], source.pop(leaf))
            if not source and "." in src:  # a section emptied by the moves is no section of the schema
                holder = parent_mapping(out, src.rsplit(".", 1)[0])
                if holder is not None:
                    holder.pop(src.rsplit(".", 2)[-2], None)
    return out


def parent_mapping(d: dict[str, Any], key: str, create: bool = False) -> dict[str, Any] | None:
    """The mapping that holds the dotted ``key`` (made on the way with ``create``), or None."""
    node: Any = d
    for part in key.split(".")[:-1]:
        if create and isinstance(node, dict) and part not in node:
            node[part] = {}
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _copy_sections(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy_sections(v) if isinstance(v, Mapping) else v for k, v in d.items()}


def upgrade_keys(d: Mapping[str, Any], renamed: Mapping[str, Renamed]) -> dict[str, Any]:
    """A record written before the renames in ``renamed`` (a nested mapping) as it is written
    now: every old key under its new name."""
    return move_keys(d, {old: r.new for old, r in renamed.items()})


def typed_value(text: str) -> Any:
    """A command-line value as the schema should receive it (see the module docstring)."""
    stripped = text.strip()
    if stripped in NULLS:
        return None
    if stripped[:1] in "[{":
        try:
            return yaml.safe_load(stripped)
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse {text!r}: {str(e).splitlines()[0]}") from None
    return text


def build(
    schema: type[T] | Any,
    overrides: Iterable[tuple[str, str]] = (),
    *,
    base: Mapping[str, Any] | None = None,
    layers: Iterable[Mapping[str, Any] | None] = (),
    what: str = "config",
    renamed: Mapping[str, Renamed] | None = None,
) -> T:
    """Merge ``base``, then ``layers``, then the ``(key, text)`` overrides into ``schema`` (a
    dataclass or an already structured OmegaConf node) and return the resulting object; an old
    key of ``renamed`` anywhere among them is refused (`refuse_renamed`)."""
    overrides, layers = list(overrides), list(layers)
    refuse_renamed(renamed or {}, overrides, [base, *layers])
    node = schema if OmegaConf.is_config(schema) else OmegaConf.structured(schema)
    key = ""
    try:
        merged = OmegaConf.merge(node, dict(base or {}))
        for layer in layers:
            merged = OmegaConf.merge(merged, dict(layer or {}))
        for key, text in overrides:
            OmegaConf.update(merged, key, typed_value(text), merge=True, force_add=False)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        raise ConfigError(one_line(e, node, what, key)) from None


def one_line(e: OmegaConfBaseException, schema: Any, what: str = "config", key: str = "") -> str:
    """An OmegaConf error as one line; unknown keys list the keys allowed at their level."""
    msg = str(e).splitlines()[0].strip()
    full_key = getattr(e, "full_key", None) or key
    if "not in" in msg or "Missing key" in msg or "Key '" in msg and "not" in msg:
        parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
        allowed = allowed_keys(schema, parent)
        if allowed is not None:
            return f"unknown {what} key {full_key!r}; allowed under {parent or 'top level'}: {', '.join(allowed)}"
    return f"{full_key}: {msg}" if full_key else msg


def allowed_keys(schema: Any, parent: str) -> list[str] | None:
    node = schema if OmegaConf.is_config(schema) else OmegaConf.structured(schema)
    try:
        for part in filter(None, parent.split(".")):
            node = node[part]
        return sorted(node.keys())
    except Exception:  # noqa: BLE001 - the parent itself is unknown
        return None

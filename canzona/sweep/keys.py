"""Trial keys as sweep files and command lines write them: dotted `TrialConfig` paths.

``model`` and ``optimizer`` are shorthands for ``model.name`` and ``optimizer.name``. A key is
checked against the schema before any trial is built, so a typo names the keys allowed at its
level; values are written back as ``key=value`` overrides that YAML reads unchanged (what the
sbatch scripts and `config_overrides` rely on).
"""

from __future__ import annotations

import functools
from typing import Any

import yaml
from omegaconf import OmegaConf

from canzona.config import RENAMED, SHORTHANDS, TrialConfig
from canzona.errors import ConfigError
from canzona.overrides import refuse_renamed

SCHEMA = OmegaConf.structured(TrialConfig)  # built once: merging into it is 4x faster than rebuilding
TRIAL_SECTIONS = tuple(sorted(SCHEMA.keys()))


def normalize_key(key: str) -> str:
    key = key.strip()
    return SHORTHANDS.get(key, key)


def fmt_value(v: Any) -> str:
    """A value as it is written in a ``key=value`` override (YAML reads it back unchanged)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def parse_value(text: str) -> Any:
    """An axis value from the command line as YAML reads it (``2`` -> 2), so that it finds the
    label the sweep file's YAML gave the same value."""
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


def split_top_commas(text: str) -> list[str]:
    """'a,b,[1,2]' -> ['a', 'b', '[1,2]']: commas inside brackets do not split."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"a.b": value}`` (shorthands apply to leaf values only)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if prefix:
            key = f"{prefix}.{k}"
        else:  # shorthands (model=, optimizer=) only for a value, not for a nested section
            key = str(k) if isinstance(v, dict) else normalize_key(str(k))
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"trial key {key!r} conflicts with a value set at {p!r}")
        node[leaf] = v
    return out


def check_trial_key(key: str, where: str) -> None:
    """Raise `ConfigError` unless ``key`` names a `TrialConfig` value (a renamed key: one line
    naming the new one, `canzona.config.RENAMED`)."""
    refuse_renamed(RENAMED, [(key, None)], where=where)
    node: Any = SCHEMA
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not OmegaConf.is_config(node) or part not in node:
            parent = ".".join(parts[:i])
            allowed = sorted(node.keys()) if OmegaConf.is_config(node) else []
            raise ConfigError(
                f"{where}: unknown trial key {key!r}; allowed under {parent or 'top level'}: {', '.join(allowed)}"
            )
        node = node[part] if OmegaConf.is_dict(node[part]) else None  # a list or tuple is a value
    if OmegaConf.is_config(node):
        raise ConfigError(
            f"{where}: {key!r} is a section; set one of its keys: {', '.join(sorted(node.keys()))}"
        )


def trial_key_names() -> list[str]:
    """The trial keys as an error message lists them (sections as ``train.*``)."""
    return [f"{k}.*" if OmegaConf.is_config(SCHEMA[k]) else k for k in TRIAL_SECTIONS]


@functools.cache
def _defaults() -> dict[str, Any]:
    return flatten(TrialConfig().to_dict())


def is_list_value(key: str) -> bool:
    """Trial keys whose values are themselves lists (tuples in the schema)."""
    return isinstance(_defaults().get(key), (list, tuple))


def as_list(key: str, v: Any) -> list[Any]:
    """A YAML value that may be one value or a list of them -> the list of values."""
    if isinstance(v, list) and (not is_list_value(key) or (v and isinstance(v[0], list))):
        return v
    return [v]


def same_value(a: Any, b: Any) -> bool:
    """Equality that does not tell a tuple (schema default) from a list (YAML)."""
    return _norm(a) == _norm(b)


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def config_overrides(cfg: TrialConfig) -> list[str]:
    """The ``key=value`` overrides that rebuild ``cfg`` from the defaults (``out`` left out)."""
    default = _defaults()
    mine = flatten(cfg.to_dict())
    return [
        f"{k}={fmt_value(v)}" for k, v in mine.items() if k != "out" and not same_value(v, default.get(k))
    ]

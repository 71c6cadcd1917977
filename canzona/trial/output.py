"""Writing a trial's records (the files of `canzona.records`) into its folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from canzona.config import TrialConfig
from canzona.records import atomic_write_json, atomic_write_text
from canzona.trial.trace import chrome_trace


def write_records(cfg: TrialConfig, out: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """config.yaml, steps.jsonl, trace.json, then summary.json: its presence means the trial finished."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_json(out / "trace.json", chrome_trace(rows))
    atomic_write_json(out / "summary.json", summary)


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename (never half a file)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)

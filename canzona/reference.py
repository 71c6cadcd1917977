"""The command-line reference, generated from the schemas: each command's ``--help`` and
docs/configuration.md (``python -m canzona.reference > docs/configuration.md``; a test fails
when the file and this text differ).

Imports no torch: the trial schema (`canzona.config`) and the sweep settings are torch-free.
The report's, the validator's and the calibration's keys come from their own small schemas,
imported only when their section is rendered.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from canzona.schema_doc import KeyDoc, help_text, key_docs, markdown


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    summary: str
    keys: Callable[[], list[tuple[str, list[KeyDoc]]]]  # (section title, keys), imported when used


def _by_section(docs: Sequence[KeyDoc], what: str) -> list[tuple[str, list[KeyDoc]]]:
    """Keys grouped by their first part: top-level keys, then ``train.*`` and so on."""
    def section(d: KeyDoc) -> str:
        return d.key.split(".")[0] if "." in d.key else ""

    names = dict.fromkeys(section(d) for d in docs)
    return [(f"{what}: {n}.*" if n else what, [d for d in docs if section(d) == n]) for n in names]


def _trial_keys() -> list[tuple[str, list[KeyDoc]]]:
    from canzona.config import trial_key_docs

    return _by_section(trial_key_docs(), "trial keys")


def _sweep_keys() -> list[tuple[str, list[KeyDoc]]]:
    from canzona.sweep.settings import SETTINGS_DOCS

    return _by_section(SETTINGS_DOCS, "sweep keys")


def _schema_keys(module: str, cls: str) -> Callable[[], list[tuple[str, list[KeyDoc]]]]:
    def load() -> list[tuple[str, list[KeyDoc]]]:
        import importlib

        return [("keys", key_docs(getattr(importlib.import_module(module), cls)))]

    return load


def _simulate_keys() -> list[tuple[str, list[KeyDoc]]]:
    from canzona.hardware import DEFAULT_HARDWARE

    hardware = KeyDoc("hardware", "str", DEFAULT_HARDWARE, "hardware file: h100, h200, a100, local, or a YAML path", None)
    return [("keys", [hardware]), *_trial_keys()]


COMMANDS: tuple[Command, ...] = (
    Command("canzona.run", "python -m canzona.run [key=value ...] out=DIR [--overwrite]",
            "Run one trial: dp x tp ranks train their shards of the model for train.warmup + train.steps steps and rank 0 "
            "writes the records into out. --overwrite replaces the records an earlier run left in out. "
            "With dist.dry_run=true the listed ranks run on fake CUDA devices instead.", _trial_keys),
    Command("canzona.plan", "python -m canzona.plan [key=value ...] [--json | --program RANK]",
            "Print the plan of a trial (owners, buckets, micro-groups, loads) without running it; --json for "
            "the whole plan, --program RANK for that rank's lowered program.", _trial_keys),
    Command("canzona.sim.simulate", "python -m canzona.sim.simulate [hardware=NAME|PATH] [key=value ...] [--json]",
            "Project one trial's iteration and optimizer step from a hardware file by interpreting every "
            "rank's program.", _simulate_keys),
    Command("sweeps/run.py", "python sweeps/run.py sweep=NAME [key=value ...]\n       python sweeps/run.py list",
            "Run a sweep: every trial of the sweep file's grid (AXIS=v1,v2 keeps those values of an axis; a "
            "trial key sets a value for every trial, see python -m canzona.run --help), then its report. "
            "'list' shows the sweeps, their sweep profiles and axes.", _sweep_keys),
    Command("analysis.report", "python -m analysis.report SWEEP_DIR [key=value ...]",
            "Build the HTML report of a sweep folder and print the path of its index.html.",
            _schema_keys("analysis.report", "ReportArgs")),
    Command("canzona.sim.validate", "python -m canzona.sim.validate TRIAL_OR_SWEEP_DIR [key=value ...] [--json]\n"
            "       python -m canzona.sim.validate published [--json]\n"
            "       python -m canzona.sim.validate across SWEEP_DIR SWEEP_DIR [...] [--json]",
            "Predicted against measured, for every finished trial under the folder; 'published' projects the "
            "published points of validation/published_points.yaml instead, each on its own hardware file; "
            "'across' sets several measured sweeps of the same trials side by side, each predicted with the "
            "hardware file its report was built with (SWEEP_DIR/report/hardware.yaml), and splits the error "
            "into each trial's bias, each sweep's offset and the noise.",
            _schema_keys("canzona.sim.validate", "ValidateArgs")),
    Command("canzona.calibrate", "python -m canzona.calibrate out=PATH [key=value ...]",
            "Calibrate this machine into a hardware file (update, collective and model-pass times).",
            _schema_keys("canzona.calibrate.settings", "Settings")),
)


# Where each command's renamed keys are listed (`canzona.overrides.Renamed`): (commands, module, name).
RENAMED_IN: tuple[tuple[str, str, str], ...] = (
    ("canzona.run, canzona.plan, canzona.sim.simulate, sweeps/run.py (trial keys)", "canzona.config", "RENAMED"),
    ("sweeps/run.py", "canzona.sweep.settings", "RENAMED"),
    ("canzona.sim.simulate", "canzona.sim.simulate", "RENAMED"),
    ("canzona.sim.validate", "canzona.sim.validate", "RENAMED"),
    ("analysis.report", "analysis.report", "RENAMED"),
)


def renamed_table() -> str:
    """The renamed keys: each old key, where, what it is now; given the old way it is refused."""
    import importlib

    out = ["| old key | in | now | note |", "|---|---|---|---|"]
    for where, module, name in RENAMED_IN:
        for old, r in getattr(importlib.import_module(module), name).items():
            out.append(f"| `{old}` | {where} | `{r.new}` | {r.note.replace('|', chr(92) + '|')} |")
    return "\n".join(out) + "\n"


def command(name: str) -> Command:
    return next(c for c in COMMANDS if c.name == name)


def command_help(name: str) -> str:
    """What ``--help`` prints: the usage, what the command does, and every key it takes."""
    c = command(name)
    return help_text(f"usage: {c.usage}\n\n{c.summary}", c.keys())


def document() -> str:
    """docs/configuration.md."""
    parts = ["# Configuration reference", "",
             "Generated from the schemas by `python -m canzona.reference > docs/configuration.md` (a test "
             "keeps this file equal to it); every command's `--help` prints its part. Keys are `key=value` "
             "(Hydra style); `model=`, `optimizer=` and `method=` are shorthands for `model.name`, "
             "`optimizer.name` and `method.name`. A key given twice with different values, or an override that "
             "contradicts a sweep axis, is refused.", ""]
    for c in COMMANDS:
        parts += [f"# `{c.name}`", "", "```", c.usage, "```", "", c.summary, ""]
        if c.keys in (_trial_keys,) and c.name != "canzona.run":
            parts += ["Trial keys: as [`canzona.run`](#canzonarun).", ""]
            continue
        sections = c.keys()
        if c.name == "canzona.sim.simulate":
            sections = sections[:1]
            parts += ["Trial keys as [`canzona.run`](#canzonarun), and:", ""]
        parts.append(markdown(sections))
    parts += ["# Renamed keys", "",
              "Given the old way (a command line, a sweep file), an old key is refused with one line naming the new "
              "one; records written before a rename are read under the new name.", "", renamed_table()]
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(document())
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COMMANDS", "Command", "command_help", "document", "renamed_table"]

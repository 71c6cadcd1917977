"""``python sweeps/run.py sweep=NAME [key=value ...]`` -- expand, launch, resume, summarize.

Exit codes: 0 every run done; 1 some run failed (or the report failed); 2 bad arguments or
config, or the results folder is held by another sweep (one line on stderr, nothing written);
130 interrupted (running jobs are cancelled).
"""

from __future__ import annotations

import shutil
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import yaml

from canzona.cli import HELP, run_command
from canzona.errors import ConfigError
from canzona.hardware import Hardware, load_hardware
from canzona.records import (
    DRYRUN_CSV,
    HARDWARE_FILE,
    OLD_HARDWARE_FILE,
    SWEEP_FILE,
    atomic_write_json,
    atomic_write_text,
    writable_folder,
)
from canzona.sweep import bookkeeping as bk
from canzona.sweep.backends import backend_class, make_backend, run_stamp, submitit_parameters
from canzona.sweep.dryrun import memory_table
from canzona.sweep.expand import expand_sweep
from canzona.sweep.jobshape import JobShape, slurm_shape
from canzona.sweep.lock import ResultsLock
from canzona.sweep.loop import log_root, run_loop
from canzona.sweep.progress import summary_table, table
from canzona.sweep.project import stale_trials
from canzona.sweep.sbatch import write_sbatch_files
from canzona.sweep.sweepfile import CONFIGS_DIR, available_sweeps, load_sweep_file
from canzona.sweep.trials import ExpandedSweep, TrialRun

if TYPE_CHECKING:
    from canzona.calibrate.machine import SweepCalibration


def main(argv: list[str] | None = None, stream: TextIO | None = None, configs_dir: Path = CONFIGS_DIR) -> int:
    out = stream or sys.stdout

    def body(argv: list[str]) -> int:
        if argv and argv[0] == "list":
            if len(argv) > 1:
                raise ConfigError(f"'list' takes no other arguments (got {' '.join(argv[1:])})")
            return list_sweeps(out, configs_dir)
        sweep = expand_sweep(argv, configs_dir)
        check_environment(sweep)
        if not sweep.settings.list:  # a results folder we cannot write: one line, before anything runs
            writable_folder(sweep.settings.results, "results")
        lock = None if sweep.settings.list else ResultsLock(sweep.results_dir, [sys.argv[0], *argv])
        if lock is not None:  # a dry run runs nothing and touches no record: no lock
            lock.acquire()
        try:
            return run_sweep(sweep, out)
        finally:
            if lock is not None:
                lock.release()

    return run_command("sweeps/run.py", body, argv, help_words=(*HELP, "help"), stream=out)


def check_environment(sweep: ExpandedSweep) -> None:
    """What the sweep needs from this machine: sbatch for Slurm, a readable hardware file."""
    s = sweep.settings
    if s.cluster == "slurm" and not s.list and shutil.which("sbatch") is None:
        raise ConfigError("cluster=slurm needs sbatch on PATH (run on a login node), or add list=true")
    hardware = sweep.sim_hardware  # for every sweep: a profiles/local.yaml of before the rename is one line, exit 2
    if s.sim.hardware or s.cluster == "simulate":
        try:  # a missing or invalid hardware file: one line, exit 2
            load_hardware(hardware)
        except ConfigError as e:
            raise ConfigError(f"sim.hardware={hardware}: {e}") from None


def list_sweeps(out: TextIO, configs_dir: Path = CONFIGS_DIR) -> int:
    names = available_sweeps(configs_dir)
    if not names:
        print(f"no sweeps in {configs_dir}", file=out)
        return 0
    for name in names:
        sf = load_sweep_file(name, configs_dir)
        print(f"{name}: {sf.description}", file=out)
        for prof in sf.profiles or [None]:
            items = [f"sweep={name}"] + ([f"profile={prof}"] if prof else [])
            try:
                sweep = expand_sweep(items + ["list=true"], configs_dir)
                reps = f" x {sweep.repeats} repeats" if sweep.repeats > 1 else ""
                values = {a: list(dict.fromkeys(t.axes[a] for t in sweep.trials if a in t.axes)) for a in sweep.axes}
                info = f"{len(sweep.trials)} trials{reps}, cluster={sweep.settings.cluster}, axes:" + "".join(
                    f"\n      {a}={','.join(v)}" for a, v in values.items()
                )
            except ConfigError as e:
                info = f"invalid: {e}"
            default = " (default)" if prof is not None and prof == sf.default_profile else ""
            desc = (sf.raw["profiles"][prof].get("description") or "") if prof else ""
            print(f"  profile={prof}{default}: {info}" + (f"\n    {desc}" if desc else ""), file=out)
    return 0


# --------------------------------------------------------------------------- run
def run_sweep(sweep: ExpandedSweep, out: TextIO) -> int:
    s = sweep.settings
    rd = sweep.results_dir
    runs = sweep.runs()
    states = {r.id: bk.trial_state(rd / r.id) for r in runs}
    sim_hw = load_hardware(sweep.sim_hardware) if s.cluster == "simulate" else None
    restale = []
    if sim_hw is not None:  # projected with another content of the hardware file: stale
        restale = stale_trials(sweep, sim_hw, states)
        states.update({rid: bk.STALE for rid in restale})
    to_run = [r for r in runs if bk.should_run(states[r.id], s.rerun)]
    skipped = len(runs) - len(to_run)
    verb = f"to {backend_class(s).verb}"
    count = f"{len(sweep.trials)} trials" + (f" x {sweep.repeats} repeats = {len(runs)} runs" if sweep.repeats > 1 else "")
    head = (
        f"sweep {sweep.sweep}"
        + (f" profile={sweep.profile}" if sweep.profile else "")
        + f" cluster={s.cluster}"
        + (f" sim.hardware={sim_hw.name} ({sim_hw.source})" if sim_hw is not None else "")
        + ": "
        f"{count}, {len(to_run)} {verb}, {skipped} skipped (rerun={s.rerun}) -> {rd}/"
    )
    if s.list:
        return list_runs(sweep, runs, states, to_run, head, out)

    rd.mkdir(parents=True, exist_ok=True)
    invocation = run_stamp()
    bk.set_invocation(invocation)
    manifest = _manifest(sweep, runs, sim_hw, invocation)
    if sim_hw is not None:
        # the hardware file itself, beside the projections it made (provenance); a folder projected
        # before the rename has it as profile.yaml: one copy, under today's name
        atomic_write_text(rd / HARDWARE_FILE, yaml.safe_dump(sim_hw.raw, sort_keys=False))
        (rd / OLD_HARDWARE_FILE).unlink(missing_ok=True)
    atomic_write_json(rd / SWEEP_FILE, manifest)
    run_ids = {r.id for r in to_run}
    for r in runs:
        if states[r.id] == bk.DONE and r.id not in run_ids:
            bk.adopt(rd / r.id, r.record())
    print(head, file=out)
    if s.cluster == "simulate" and s.repeats > 1:
        print(f"[sweep] repeats={s.repeats} ignored: a projection is deterministic", file=out)
    if restale:
        assert sim_hw is not None
        print(
            f"[sweep] {len(restale)} trial(s) were projected with another content of hardware {sim_hw.name}: "
            "projecting them again",
            file=out,
        )
    out.flush()

    backend = make_backend(sweep, log_root(rd, invocation), sim_hw)
    calibration = _sweep_calibration(sweep, runs, to_run)
    code = run_loop(sweep, backend, to_run, skipped, out, between=None if calibration is None else calibration.between,
                    between_eta=None if calibration is None else calibration.remaining_s)
    if code == 130:
        return code
    final = {r.id: bk.trial_state(rd / r.id) for r in runs}
    manifest.update(
        ended=bk.now(),
        done=sum(v == bk.DONE for v in final.values()),
        failed=sum(v != bk.DONE for v in final.values()),
    )
    atomic_write_json(rd / SWEEP_FILE, manifest)
    failed = any(v != bk.DONE for v in final.values())
    if s.cluster == "dryrun":  # memory per rank, not timings: a table and dryrun.csv, no HTML report
        print(memory_table(sweep, runs), file=out)
        print(rd / DRYRUN_CSV, file=out)
        return 1 if failed else 0
    print(summary_table(rd, runs), file=out)
    out.flush()
    report_code = build_report(rd, out, hardware=None if sim_hw is not None else _report_hardware(sweep, runs, out,
                                                                                                     calibration))
    return max(1 if failed else 0, report_code)


def _manifest(sweep: ExpandedSweep, runs: list[TrialRun], sim_hw: Hardware | None, invocation: str) -> dict:
    """sweep.json: what this sweep is, its settings and its trials with their run folders, this
    invocation and every earlier one on this results folder (a resumed sweep)."""
    earlier = bk.read_json(sweep.results_dir / SWEEP_FILE) or {}
    folders: dict[str, list[str]] = {}
    for r in runs:
        folders.setdefault(r.trial.id, []).append(r.id)
    manifest = {
        "sweep": sweep.sweep,
        "profile": sweep.profile,
        "description": sweep.description,
        "sweep_file": str(sweep.path),
        "cluster": sweep.settings.cluster,
        "started": bk.now(),
        "settings": asdict(sweep.settings),
        "repeats": sweep.repeats,
        "trials": [{"id": t.id, "axes": t.axes, "runs": sorted(folders[t.id])} for t in sweep.trials],
        "order": [r.id for r in runs],
        "invocation": invocation,
        "invocations": [*earlier.get("invocations", []), invocation],
        "ended": None,
    }
    if sim_hw is not None:
        manifest.update(projected=True, sim_hardware=sim_hw.describe())
    return manifest


# --------------------------------------------------------------------------- list=true
def list_runs(
    sweep: ExpandedSweep, runs: list[TrialRun], states: dict[str, str], to_run: list[TrialRun], head: str, out: TextIO
) -> int:
    s = sweep.settings
    print(f"[list] {head}", file=out)
    run_ids = {r.id for r in to_run}
    header = ["run" if sweep.repeats > 1 else "trial", "axes", "ranks", "state", "action"]
    rows = [
        [r.id, r.trial.label(), str(r.world_size), states[r.id], "run" if r.id in run_ids else "skip"]
        for r in runs
    ]
    for line in table(rows, header):
        print(line, file=out)
    if s.cluster != "slurm":
        print("[list] nothing was run or written", file=out)
        return 0
    shapes: dict[JobShape, list[TrialRun]] = {}
    for r in to_run:
        shapes.setdefault(slurm_shape(r.cfg, s.slurm), []).append(r)
    name = s.slurm.job_name or f"canzona-{sweep.sweep}"
    for shape, members in shapes.items():
        kind = "job array" if s.slurm.array and len(members) > 1 else "job" if len(members) == 1 else "jobs"
        print(
            f"[list] {kind} of {len(members)} run(s): nodes={shape.nodes} tasks_per_node={shape.tasks_per_node} "
            f"gpus_per_node={shape.gpus_per_node} cpus_per_task={shape.cpus_per_task}",
            file=out,
        )
        print(f"          submitit parameters: {submitit_parameters(s, shape, name)}", file=out)
    if not to_run:
        print("[list] no sbatch scripts: nothing to run", file=out)
        return 0
    sbatch_dir = write_sbatch_files(sweep, to_run)
    print(
        f"[list] wrote {len(to_run)} sbatch scripts + submit_all.sh to {sbatch_dir}/ (the only files list=true writes)",
        file=out,
    )
    return 0


# --------------------------------------------------------------------------- report
def _calibrates(sweep: ExpandedSweep) -> bool:
    """Does this sweep's report predict with this machine's own calibration? Trials run here
    (cluster=local) with ``sim.calibrate`` and no hardware given (``sim.hardware``, hardware/local.yaml)."""
    s = sweep.settings
    return sweep.sim_hardware is None and s.cluster == "local" and s.sim.calibrate


def _threads_per_rank(runs: list[TrialRun]) -> int:
    threads = {r.trial.cfg.dist.threads_per_rank for r in runs}
    return next(iter(threads)) if len(threads) == 1 and isinstance(next(iter(threads)), int) else 1


def _sweep_calibration(sweep: ExpandedSweep, runs: list[TrialRun], to_run: list[TrialRun]) -> SweepCalibration | None:
    """This machine's calibration taken in slices between the runs (`SweepCalibration`), where
    the report calibrates and there are runs to spread it over; None otherwise."""
    if not to_run or not _calibrates(sweep):
        return None
    from canzona.calibrate.machine import SweepCalibration

    sim = sweep.settings.sim
    return SweepCalibration(_threads_per_rank(runs), len(to_run), sim.calibrate_slices, sim.calibrate_quick)


def _report_hardware(sweep: ExpandedSweep, runs: list[TrialRun], out: TextIO,
                     calibration: SweepCalibration | None = None) -> str | None:
    """The hardware file a measured sweep's report predicts its trials with: ``sim.hardware``, else
    hardware/local.yaml, else -- trials run on this machine (cluster=local) with
    ``sim.calibrate`` -- this machine's own calibration (`canzona.calibrate.machine`), made once:
    the median of the slices `calibration` took between the runs, or in a row now."""
    if not _calibrates(sweep):  # given, or local.yaml
        return sweep.sim_hardware
    try:
        from canzona.calibrate.machine import machine_hardware

        log = lambda line: print(line, file=out, flush=True)  # noqa: E731
        if calibration is not None:
            return str(calibration.finish(log))
        return str(machine_hardware(_threads_per_rank(runs), log, sweep.settings.sim.calibrate_quick))
    except Exception as e:  # noqa: BLE001 - a failed calibration must not lose the report
        print(f"[sweep] calibrating this machine failed ({type(e).__name__}: {e}); the report's predicted-vs-"
              f"measured section says how to make a hardware file", file=out)
        return None


def build_report(sweep_dir: Path, out: TextIO, hardware: str | None = None) -> int:
    """Build the sweep's report with `analysis.report.build_report`; its path is the last
    line printed. `hardware`: the hardware file of its predicted-vs-measured section (None: the
    report says how to make one). A failing report never loses results: it is shown, and the
    exit code says so (1)."""
    try:
        from analysis.report import build_report as report  # pandas, seaborn: imported when used

        path = report(Path(sweep_dir), hardware=hardware)
    except Exception as e:  # noqa: BLE001 - show it, keep the results
        out.flush()
        traceback.print_exc()
        print(
            f"[sweep] report FAILED: {type(e).__name__}: {e} (results are intact in {sweep_dir}/; "
            f"retry with python -m analysis.report {sweep_dir} once fixed)",
            file=sys.stderr,
        )
        return 1
    print(str(path), file=out)
    out.flush()
    return 0

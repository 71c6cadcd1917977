"""``python sweeps/run.py sweep=NAME [key=value ...]`` -- expand, launch, resume, summarize.

Exit codes: 0 every trial done; 1 some trial failed (or the report failed); 2 bad arguments or
config (one line on stderr, nothing written); 130 interrupted (running jobs are cancelled).
"""

from __future__ import annotations

import importlib
import inspect
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import TextIO

import yaml

from canzona.errors import ConfigError
from canzona.records import atomic_write_json, atomic_write_text
from canzona.sim.profile import load_profile
from canzona.sweep import bookkeeping as bk
from canzona.sweep.expand import (
    CONFIGS_DIR,
    Plan,
    SweepError,
    available_sweeps,
    build_plan,
    load_sweep_file,
    slurm_shape,
)
from canzona.sweep.launch import Handle, make_backend, run_stamp, submitit_parameters, write_sbatch_files
from canzona.sweep.progress import Progress, fmt_duration, summary_table
from canzona.sweep.project import project_trials, stale_trials

USAGE = """\
usage: python sweeps/run.py sweep=NAME [key=value ...]
       python sweeps/run.py list

sweep keys:  sweep=NAME|FILE.yaml  profile=local|paper|...  cluster=local|debug|slurm|simulate
             rerun=failed|all|none  dry_run=true  results=DIR  poll_s=1
             sim.profile=h100|h200|a100|local|PATH  sim.workers=0
               (cluster=simulate projects every trial with canzona.sim on that device profile,
                default h100, into results/<sweep>-<profile>-sim-<device>/; for a measured
                sweep sim.profile is what the report's predicted-vs-measured section uses,
                default profiles/local.yaml when it exists)
             local.max_ranks=4 local.parallel=1 local.mode=tasks|spawn local.timeout_min=20
             slurm.partition= slurm.account= slurm.qos= slurm.time=01:00:00 slurm.constraint=
             slurm.mem= slurm.gpus_per_node= slurm.tasks_per_node= slurm.cpus_per_task=
             slurm.setup='[module load cuda]' slurm.extra_sbatch='[--exclusive]' slurm.array=true
             slurm.array_parallelism=64 slurm.python= slurm.job_name=
axes:        AXIS=v1,v2 keeps those values of a grid axis (e.g. method=canzona,sync layout=dp2tp1)
trial keys:  any TrialConfig value for every trial (e.g. train.steps=3 canzona.alpha=0.5)
"""


def main(argv: list[str] | None = None, stream: TextIO | None = None, configs_dir: Path = CONFIGS_DIR) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = stream or sys.stdout
    if any(a in ("-h", "--help", "help") for a in argv):
        out.write(USAGE)
        return 0
    try:
        if argv and argv[0] == "list":
            if len(argv) > 1:
                raise SweepError(f"'list' takes no other arguments (got {' '.join(argv[1:])})")
            return list_sweeps(out, configs_dir)
        plan = build_plan(argv, configs_dir)
        if plan.settings.cluster == "slurm" and not plan.settings.dry_run and shutil.which("sbatch") is None:
            raise SweepError("cluster=slurm needs sbatch on PATH (run on a login node), or add dry_run=true")
        if plan.settings.sim.profile or plan.settings.cluster == "simulate":
            try:  # a missing or invalid device profile: one line, exit 2
                load_profile(plan.sim_profile)
            except ConfigError as e:
                raise SweepError(f"sim.profile={plan.sim_profile}: {e}") from None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_sweep(plan, out)


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
                plan = build_plan(items + ["dry_run=true"], configs_dir)
                info = f"{len(plan.trials)} trials, cluster={plan.settings.cluster}, axes: {', '.join(plan.axes)}"
            except ConfigError as e:
                info = f"invalid: {e}"
            default = " (default)" if prof is not None and prof == sf.default_profile else ""
            desc = (sf.raw["profiles"][prof].get("description") or "") if prof else ""
            print(f"  profile={prof}{default}: {info}" + (f"\n      {desc}" if desc else ""), file=out)
    return 0


# --------------------------------------------------------------------------- run
def run_sweep(plan: Plan, out: TextIO) -> int:
    s = plan.settings
    rd = plan.results_dir
    states = {t.id: bk.trial_state(rd / t.id) for t in plan.trials}
    sim_prof = load_profile(plan.sim_profile) if s.cluster == "simulate" else None
    restale = []
    if sim_prof is not None:  # projected with another profile content: stale
        restale = stale_trials(plan, sim_prof, states)
        states.update({tid: bk.STALE for tid in restale})
    to_run = [t for t in plan.trials if bk.should_run(states[t.id], s.rerun)]
    skipped = len(plan.trials) - len(to_run)
    verb = "to project" if sim_prof is not None else "to run"
    head = (
        f"sweep {plan.sweep}"
        + (f" profile={plan.profile}" if plan.profile else "")
        + f" cluster={s.cluster}"
        + (f" sim.profile={sim_prof.name} ({sim_prof.source})" if sim_prof is not None else "")
        + ": "
        f"{len(plan.trials)} trials, {len(to_run)} {verb}, {skipped} skipped (rerun={s.rerun}) -> {rd}/"
    )
    if s.dry_run:
        return dry_run(plan, states, to_run, head, out)

    rd.mkdir(parents=True, exist_ok=True)
    manifest = {
        "sweep": plan.sweep,
        "profile": plan.profile,
        "description": plan.description,
        "sweep_file": str(plan.path),
        "cluster": s.cluster,
        "started": bk.now(),
        "settings": _settings_dict(plan),
        "trials": [{"id": t.id, "axes": t.axes} for t in plan.trials],
        "ended": None,
    }
    if sim_prof is not None:
        manifest.update(projected=True, sim_profile=sim_prof.describe())
        # the profile itself, beside the projections it made (provenance)
        atomic_write_text(rd / "profile.yaml", yaml.safe_dump(sim_prof.raw, sort_keys=False))
    atomic_write_json(rd / "sweep.json", manifest)
    run_ids = {t.id for t in to_run}
    for t in plan.trials:
        if states[t.id] == bk.DONE and t.id not in run_ids:
            bk.adopt(rd / t.id)
    print(head, file=out)
    if restale:
        print(
            f"[sweep] {len(restale)} trial(s) were projected with another content of profile {sim_prof.name}: "
            "projecting them again",
            file=out,
        )
    out.flush()

    if sim_prof is not None:
        code = project_trials(plan, to_run, skipped, sim_prof, out)
    else:
        code = _execute(plan, to_run, skipped, out)
    if code == 130:
        return code
    final = {t.id: bk.trial_state(rd / t.id) for t in plan.trials}
    manifest.update(
        ended=bk.now(),
        done=sum(v == bk.DONE for v in final.values()),
        failed=sum(v != bk.DONE for v in final.values()),
    )
    atomic_write_json(rd / "sweep.json", manifest)
    print(summary_table(rd, plan.trials), file=out)
    out.flush()
    failed = any(v != bk.DONE for v in final.values())
    report_code = build_report(rd, out, profile=None if sim_prof is not None else plan.sim_profile)
    return max(1 if failed else 0, report_code)


def _settings_dict(plan: Plan) -> dict:
    from dataclasses import asdict

    return asdict(plan.settings)


def _execute(plan: Plan, to_run: list, skipped: int, out: TextIO) -> int:
    s = plan.settings
    rd = plan.results_dir.resolve()
    if not to_run:
        print(
            "[sweep] nothing to run: every trial is already recorded (rerun=all to run them again)", file=out
        )
        return 0
    log_root = rd / "submitit" / run_stamp()
    backend = make_backend(plan, log_root)
    parallel = s.local.parallel if s.cluster == "local" else (1 if s.cluster == "debug" else len(to_run))
    progress = Progress(len(to_run), skipped=skipped, parallel=parallel, stream=out)
    queue = list(to_run)
    running: list[Handle] = []
    submitted: list[Handle] = []
    try:
        while queue or running:
            free = backend.capacity - len(running)
            if queue and free > 0:
                batch, queue = queue[:free], queue[free:]
                pairs = []
                for t in batch:
                    bk.prepare(rd / t.id)
                    pairs.append((t, rd / t.id))
                handles, failures = backend.submit(pairs)
                for h in handles:
                    bk.write_status(
                        h.trial_dir,
                        "running",
                        error=None,
                        job_id=h.job_id,
                        started=bk.now(),
                        ended=None,
                        trial_id=h.trial.id,
                        cluster=s.cluster,
                        log_dir=h.log_dir,
                    )
                    progress.start(h.trial.id)
                    running.append(h)
                    submitted.append(h)
                for t, err in failures:
                    bk.write_status(
                        rd / t.id,
                        "failed",
                        error=err,
                        started=bk.now(),
                        ended=bk.now(),
                        trial_id=t.id,
                        cluster=s.cluster,
                    )
                    progress.finish(t.id, False, f"[sweep] FAILED {t.id}: {err}")
            finished = [h for h in running if h.done()]
            for h in finished:
                running.remove(h)
                _finalize(h, progress)
            progress.refresh()
            if running and not finished:
                time.sleep(s.poll_s)
    except KeyboardInterrupt:
        for h in running:
            h.cancel()
            bk.write_status(
                h.trial_dir,
                "failed",
                error="interrupted (sweep stopped by the user; job cancelled)",
                ended=bk.now(),
            )
        progress.close()
        print(
            f"[sweep] interrupted: cancelled {len(running)} running job(s); rerun the same command to resume",
            file=out,
        )
        return 130
    finally:
        progress.close()
        backend.close(submitted)
    return 0


def _finalize(h: Handle, progress: Progress) -> None:
    err = h.error
    if err is None and not (h.trial_dir / bk.SUMMARY).is_file():
        err = "the trial ended without writing summary.json"
    note = "(cluster=debug: the trial's output went to the console)" if h.cluster == "debug" else ""
    try:
        stdout, stderr = h.log_paths()
        bk.write_tails(h.trial_dir, stdout, stderr, note=note)
    except Exception as e:  # noqa: BLE001 - missing logs must not lose the status
        bk.write_tails(h.trial_dir, [], [], note=f"logs unavailable: {e}")
    wall = time.monotonic() - h.t0
    bk.write_status(
        h.trial_dir, "failed" if err else "done", error=err, ended=bk.now(), wall_s=round(wall, 2)
    )
    if err:
        progress.finish(h.trial.id, False, f"[sweep] FAILED {h.trial.id} ({fmt_duration(wall)}): {err}")
    else:
        progress.finish(h.trial.id, True, f"[sweep] done {h.trial.id} ({fmt_duration(wall)})")


# --------------------------------------------------------------------------- dry run
def dry_run(plan: Plan, states: dict[str, str], to_run: list, head: str, out: TextIO) -> int:
    s = plan.settings
    print(f"[dry run] {head}", file=out)
    run_ids = {t.id for t in to_run}
    rows = [
        [
            t.id,
            " ".join(f"{k}={v}" for k, v in t.axes.items()),
            str(t.world_size),
            states[t.id],
            "run" if t.id in run_ids else "skip",
        ]
        for t in plan.trials
    ]
    from canzona.sweep.progress import _table

    for line in _table(rows, ["trial", "axes", "ranks", "state", "action"]):
        print(line, file=out)
    if s.cluster != "slurm":
        print("[dry run] nothing was written", file=out)
        return 0
    shapes: dict = {}
    for t in to_run:
        shapes.setdefault(slurm_shape(t.cfg, s.slurm), []).append(t)
    name = s.slurm.job_name or f"canzona-{plan.sweep}"
    for shape, members in shapes.items():
        kind = "job array" if s.slurm.array and len(members) > 1 else "job" if len(members) == 1 else "jobs"
        print(
            f"[dry run] {kind} of {len(members)} trial(s): nodes={shape.nodes} tasks_per_node={shape.tasks_per_node} "
            f"gpus_per_node={shape.gpus_per_node} cpus_per_task={shape.cpus_per_task}",
            file=out,
        )
        print(f"          submitit parameters: {submitit_parameters(s, shape, name)}", file=out)
    if not to_run:
        print("[dry run] no sbatch scripts: nothing to run", file=out)
        return 0
    sbatch_dir = write_sbatch_files(plan, to_run)
    print(
        f"[dry run] wrote {len(to_run)} sbatch scripts + submit_all.sh to {sbatch_dir}/ (the only files a dry run writes)",
        file=out,
    )
    return 0


# --------------------------------------------------------------------------- report
def build_report(sweep_dir: Path, out: TextIO, profile: str | None = None) -> int:
    """Call analysis.report.build_report(sweep_dir) if it exists; its path is the last line.
    `profile`: the device profile for the report's predicted-vs-measured section (passed when
    build_report takes a ``profile`` argument; None: the report says how to make one). A failing
    prediction never fails the report: the section shows the error."""
    try:
        mod = importlib.import_module("analysis.report")
    except ModuleNotFoundError as e:
        if e.name in ("analysis", "analysis.report"):
            print("[sweep] no report: analysis.report is not available yet", file=out)
            return 0
        traceback.print_exc()
        print(
            f"[sweep] report FAILED: importing analysis.report raised {e!r} (results are intact in {sweep_dir}/)",
            file=sys.stderr,
        )
        return 1
    except Exception as e:  # noqa: BLE001 - show it, keep the results
        traceback.print_exc()
        print(
            f"[sweep] report FAILED: importing analysis.report raised {e!r} (results are intact in {sweep_dir}/)",
            file=sys.stderr,
        )
        return 1
    build = getattr(mod, "build_report", None)
    if not callable(build):
        print("[sweep] no report: analysis.report has no build_report(sweep_dir)", file=out)
        return 0
    try:
        takes_profile = "profile" in inspect.signature(build).parameters
    except (TypeError, ValueError):
        takes_profile = False
    try:
        path = build(Path(sweep_dir), profile=profile) if takes_profile else build(Path(sweep_dir))
    except Exception as e:  # noqa: BLE001 - show it, keep the results
        out.flush()
        traceback.print_exc()
        print(
            f"[sweep] report FAILED: build_report({sweep_dir}) raised {type(e).__name__}: {e} "
            f"(results are intact; retry with analysis.report once fixed)",
            file=sys.stderr,
        )
        return 1
    print(str(path), file=out)
    out.flush()
    return 0

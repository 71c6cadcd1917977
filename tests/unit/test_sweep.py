"""Sweep expansion, overrides, errors, trial ids, bookkeeping, progress and list=true (no trials run)."""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from canzona.config import load_config
from canzona.errors import ConfigError
from canzona.sweep import bookkeeping as bk
from canzona.sweep.backends import parse_extra_sbatch
from canzona.sweep.cli import build_report, main
from canzona.sweep.expand import expand_sweep
from canzona.sweep.handles import headline
from canzona.sweep.ids import run_id, trial_id
from canzona.sweep.keys import config_overrides, split_top_commas
from canzona.sweep.procs import kill_descendants
from canzona.sweep.progress import Progress, summary_table
from canzona.sweep.settings import time_minutes
from canzona.sweep.sweepfile import available_sweeps

REPO = Path(__file__).resolve().parents[2]


def plan(*items: str, configs_dir: Path | None = None):
    return expand_sweep(list(items), configs_dir) if configs_dir else expand_sweep(list(items))


@functools.cache
def shipped(*items: str):
    """A plan of the shipped sweeps, built once per argument list (do not mutate it)."""
    return expand_sweep(list(items))


def write_sweep(tmp_path: Path, text: str, name: str = "mini") -> Path:
    d = tmp_path / "configs"
    d.mkdir(exist_ok=True)
    (d / f"{name}.yaml").write_text(textwrap.dedent(text))
    return d


MINI = """
    description: test sweep
    fixed: {model.name: qwen3-0.6b, model.width_div: 16, model.num_layers: 2, train.steps: 2}
    grid:
      method: [canzona, sync, adamw]
      optimizer.name: [muon, soap]
      layout:
        dp2: {parallel.dp: 2}
        tp2: {parallel.tp: 2}
    exclude:
      - {method: sync, layout: tp2}
    include:
      - {method: layerwise, optimizer.name: shampoo, layout: dp2, train.seed: 7}
    rules:
      - {when: {method: adamw}, set: {optimizer.name: adamw}}
"""


# --------------------------------------------------------------------------- shipped sweeps
def test_shipped_sweeps_listed():
    assert {"qwen3_scaling", "smoke"} <= set(available_sweeps())


def test_qwen3_scaling_local_profile_fits_a_small_machine():
    p = shipped("sweep=qwen3_scaling")
    assert p.profile == "local" and p.settings.cluster == "local"
    methods = {t.cfg.method.label for t in p.trials}
    assert methods == {"canzona", "sync", "layerwise", "adamw"}
    for t in p.trials:
        c = t.cfg
        assert c.world_size <= 4 and c.dist.threads_per_rank == 1 and c.dist.device == "cpu"
        assert c.model.width_div > 1 and c.model.num_layers <= 4
        assert (c.optimizer.name == "adamw") == (c.method.label == "adamw")
    opts = {t.cfg.optimizer.name for t in p.trials}
    assert {"muon", "shampoo", "soap", "adamw"} <= opts
    # decisive: every trial repeated, interleaved, so the report's intervals see run-to-run spread
    assert p.repeats >= 3
    # and small: the README's first command must stay well under 6 minutes on 2 cores, which is
    # mostly the start of each run (~3 s with local.mode=worker) plus the 8B steps (0.2-1 s each)
    assert p.settings.local.mode == "worker"
    runs = p.runs()
    assert len(runs) <= 80
    assert sum(r.cfg.train.steps + r.cfg.train.warmup for r in runs if r.cfg.model.name == "qwen3-8b") <= 120


def test_qwen3_scaling_moe_profiles_run_the_moe_models_with_expert_parallelism():
    """profile=moe: the scaled Qwen3-30B-A3B on 2-4 CPU ranks with EP 2, every method, repeated;
    profile=moe_projection: both MoE models at full size on 256 GPUs for the simulator."""
    local = shipped("sweep=qwen3_scaling", "profile=moe")
    assert local.settings.cluster == "local" and local.repeats >= 3
    assert {t.cfg.method.label for t in local.trials} == {"canzona", "sync", "layerwise", "adamw"}
    for t in local.trials:
        c = t.cfg
        assert c.model_cfg().moe and c.parallel.ep == 2 and c.world_size <= 4 and c.dist.device == "cpu"
        assert c.model.width_div > 1 and c.model_cfg().num_experts == 8
        assert c.parallel.tp == 1 or c.sequence_parallel
    assert {(t.cfg.parallel.dp, t.cfg.parallel.tp) for t in local.trials} == {(2, 1), (4, 1), (2, 2)}
    proj = shipped("sweep=qwen3_scaling", "profile=moe_projection")
    assert proj.settings.cluster == "simulate"
    assert {t.cfg.model.name for t in proj.trials} == {"qwen3-30b-a3b", "qwen3-235b-a22b"}
    assert {t.cfg.method.label for t in proj.trials} == {"canzona", "sync", "layerwise", "atomic", "adamw"}
    assert all(t.world_size == 256 and t.cfg.sequence_parallel and t.cfg.model.width_div == 1 for t in proj.trials)
    assert {t.cfg.parallel.ep for t in proj.trials} == {16, 64}
    assert all(t.cfg.train.recompute == "full" for t in proj.trials if t.cfg.model.name == "qwen3-235b-a22b")


def test_qwen3_scaling_paper_profile_is_full_size_on_up_to_256_gpus():
    p = shipped("sweep=qwen3_scaling", "profile=paper")
    assert p.settings.cluster == "slurm" and p.settings.slurm.gpus_per_node == 8
    sizes = {t.cfg.model.name for t in p.trials}
    assert sizes == {f"qwen3-{s}" for s in ("0.6b", "1.7b", "4b", "8b", "14b", "32b")}
    assert all(t.cfg.model.width_div == 1 and t.cfg.model.num_layers is None for t in p.trials)
    worlds = {t.world_size for t in p.trials}
    assert max(worlds) == 256 and all(w % 8 == 0 for w in worlds)
    assert all(t.cfg.dist.device == "cuda" for t in p.trials)
    assert {"shampoo", "soap", "muon"} <= {t.cfg.optimizer.name for t in p.trials}


def test_qwen3_scaling_paper_authors_profile_is_paper_projection_at_the_authors_settings():
    """The authors' launch script (Megatron-Canzona scripts/canzona/train.sh): sequence 2048,
    DDP buckets of 4e8 elements, its global batch of 128 at every DP size (micro-batch 8 with 2
    micro-batches at DP 8, 8 at DP 16, 4 at DP 32, 2 at DP 64), GPT-2's tokenizer, tied output
    layers and sequence parallelism; every other value and every trial as in paper_projection."""
    authors = shipped("sweep=qwen3_scaling", "profile=paper_authors")
    base = shipped("sweep=qwen3_scaling", "profile=paper_projection")
    assert authors.settings.cluster == "simulate"
    assert [t.axes for t in authors.trials] == [t.axes for t in base.trials]
    for a, b in zip(authors.trials, base.trials):
        assert (a.cfg.train.seq_len, a.cfg.bucket.size) == (2048, 400_000_000)
        dp, accum, micro = a.cfg.parallel.dp, a.cfg.train.grad_accum, a.cfg.train.micro_batch
        assert dp * accum * micro == 128 and micro <= 8 and b.cfg.train.grad_accum == 1
        mc = a.cfg.model_cfg()
        assert a.cfg.parallel.sequence_parallel and not b.cfg.parallel.sequence_parallel
        assert mc.tied_embeddings and mc.vocab == -(-50257 // (128 * a.cfg.parallel.tp)) * 128 * a.cfg.parallel.tp
        a_dict, b_dict = a.cfg.to_dict(), b.cfg.to_dict()
        for d in (a_dict, b_dict):
            for key in ("seq_len", "micro_batch", "grad_accum"):
                d["train"].pop(key)
            d["bucket"].pop("size")
            for key in ("vocab", "tied_embeddings"):
                d["model"].pop(key)
            d["parallel"].pop("sequence_parallel")
        assert a_dict == b_dict


def test_every_trial_rebuilds_from_its_overrides():
    for p in (shipped("sweep=qwen3_scaling"), shipped("sweep=qwen3_scaling", "profile=paper")):
        for t in p.trials:
            assert load_config(config_overrides(t.cfg)) == t.cfg


# --------------------------------------------------------------------------- expansion
def test_grid_exclude_include_rules_and_dedup(tmp_path):
    d = write_sweep(tmp_path, MINI)
    p = plan("sweep=mini", configs_dir=d)
    combos = {(t.cfg.method.label, t.cfg.optimizer.name, t.cfg.parallel.dp, t.cfg.parallel.tp) for t in p.trials}
    assert ("sync", "muon", 1, 2) not in combos  # excluded
    assert ("layerwise", "shampoo", 2, 1) in combos  # included
    # adamw x {muon, soap} collapses to one trial per layout (the rule sets the optimizer)
    assert sum(t.cfg.method.label == "adamw" for t in p.trials) == 2
    # canzona 2x2 + sync 2x1 + adamw 2 + include 1
    assert len(p.trials) == 4 + 2 + 2 + 1
    inc = next(t for t in p.trials if t.cfg.method.label == "layerwise")
    assert inc.cfg.train.seed == 7
    assert all(t.cfg.train.steps == 2 for t in p.trials)
    assert len({t.id for t in p.trials}) == len(p.trials)
    adamw = next(t for t in p.trials if t.cfg.method.label == "adamw")
    assert adamw.axes["optimizer.name"] == "adamw"  # labels show what the rules made


def test_trial_overrides_and_axis_selection(tmp_path):
    d = write_sweep(tmp_path, MINI)
    p = plan("sweep=mini", "train.steps=3", "planner.alpha=0.5", configs_dir=d)
    assert all(t.cfg.train.steps == 3 and t.cfg.planner.alpha == 0.5 for t in p.trials)
    p = plan("sweep=mini", "method=canzona,sync", "layout=dp2", configs_dir=d)
    assert {(t.cfg.method.label, t.cfg.parallel.dp) for t in p.trials} == {("canzona", 2), ("sync", 2)}
    # a new value for a scalar axis replaces the axis; the include (layerwise) is filtered out
    p = plan("sweep=mini", "optimizer=shampoo", "method=canzona", configs_dir=d)
    assert {t.cfg.optimizer.name for t in p.trials} == {"shampoo"} and len(p.trials) == 2
    # a value only an include names selects that include and does not join the grid
    p = plan("sweep=mini", "method=canzona,layerwise", configs_dir=d)
    assert sorted((t.cfg.method.label, t.cfg.optimizer.name) for t in p.trials) == [
        ("canzona", "muon"), ("canzona", "muon"), ("canzona", "soap"), ("canzona", "soap"), ("layerwise", "shampoo")]


def test_peers_profile_selects_peers_added_by_include():
    """``method=megatron_zero1`` (included with optimizer adamw) once crossed the muon grid and failed."""
    p = shipped("sweep=qwen3_scaling", "profile=peers", "method=adamw,megatron_zero1,torchtitan_distmuon")
    got = sorted((t.cfg.method.label, t.cfg.optimizer.name, t.cfg.parallel.dp, t.cfg.parallel.tp) for t in p.trials)
    assert ("megatron_zero1", "adamw", 2, 2) in got and ("torchtitan_distmuon", "muon", 2, 1) in got
    assert {m for m, *_ in got} == {"adamw", "megatron_zero1", "torchtitan_distmuon"}
    assert sum(m == "torchtitan_distmuon" for m, *_ in got) == 1


def test_ids_are_stable_readable_and_content_addressed(tmp_path):
    d = write_sweep(tmp_path, MINI)
    a = [t.id for t in plan("sweep=mini", configs_dir=d).trials]
    b = [t.id for t in plan("sweep=mini", "cluster=slurm", "rerun=all", configs_dir=d).trials]
    assert a == b  # sweep settings do not change ids
    c = [t.id for t in plan("sweep=mini", "train.steps=3", configs_dir=d).trials]
    assert set(a).isdisjoint(c)
    t = plan("sweep=mini", configs_dir=d).trials[0]
    assert t.id.startswith("0.6b-canzona-muon-dp2tp1-") and len(t.id.rsplit("-", 1)[1]) == 10
    cfg = t.cfg
    cfg.out = "/somewhere"
    assert trial_id(cfg) == t.id  # the output folder is not part of the id
    assert trial_id(load_config([])) == trial_id(load_config(["out=/x"]))


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "items, fragment",
    [
        (
            ["sweep=qwen3_scaling", "clustr=slurm"],
            "unknown key 'clustr'; sweep keys: sweep, profile, cluster",
        ),
        (["sweep=qwen3_scaling", "train.stepz=3"], "allowed under train: dtype, fail_at_step"),
        (["sweep=qwen3_scaling", "slurm.partiton=gpu"], "allowed under slurm: account, array"),
        (["sweep=nope"], "unknown sweep 'nope'; available: "),
        (["train.steps=3"], "missing sweep=NAME; available: "),
        (["sweep=qwen3_scaling", "profile=huge"], "allowed: local, paper"),
        (["sweep=qwen3_scaling", "cluster=k8s"], "choose one of: local, debug, slurm"),
        (["sweep=qwen3_scaling", "rerun=some"], "choose one of: failed, all, none"),
        (["sweep=qwen3_scaling", "size=70b"], "allowed: 0.6b, 8b"),
        (["sweep=qwen3_scaling", "parallel.tp=3"], "parallel.tp=3 contradicts axis layout=dp2tp1"),
        (["sweep=qwen3_scaling", "planner.alpha=2"], "planner.alpha=2.0 must be in [0, 1]"),
        (["sweep=qwen3_scaling", "method=adam"], "is not a preset or a peer; choose one of: canzona, sync, layerwise"),
        (["sweep=qwen3_scaling", "train.recompute=selective"], "train.recompute='selective' is not allowed; "
                                                               "choose one of: none, full"),
        (["sweep=qwen3_scaling", "train.steps=many"], "train.steps"),
        (["sweep=qwen3_scaling", "profile=paper", "cluster=local"], "allows at most local.max_ranks=4"),
        (["sweep=qwen3_scaling", "profile=paper", "slurm.tasks_per_node=16"], "exceeds slurm.gpus_per_node"),
        (["sweep=qwen3_scaling", "profile=paper", "slurm.time=soon"], "is not a Slurm time"),
        (["sweep=qwen3_scaling", "cluster=slurm", "slurm.tasks_per_node=3"], "do not fill whole nodes"),
        (["sweep=qwen3_scaling", "oops"], "expected key=value"),
        # renamed keys: one line naming the new one (canzona.sweep.settings.RENAMED, canzona.config.RENAMED)
        (["sweep=qwen3_scaling", "dry_run=true"], "dry_run= is now list= (list=true lists the runs"),
        (["sweep=qwen3_scaling", "sim.profile=h100"], "sim.profile= is now sim.hardware= (the hardware file"),
        (["sweep=qwen3_scaling", "canzona.cost_profile=a100"],
         "command line: canzona.cost_profile= is now planner.cost_hardware="),
        (["sweep=qwen3_scaling", "canzona.measured_profile=t.yaml"],
         "command line: canzona.measured_profile= is now planner.measured_table="),
    ],
)
def test_bad_arguments_give_one_line_errors(items, fragment):
    with pytest.raises(ConfigError) as e:
        expand_sweep(items)
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg


def test_cli_error_exits_2_and_writes_nothing(tmp_path, capsys):
    results = tmp_path / "results"
    rc = main(["sweep=qwen3_scaling", f"results={results}", "train.stepz=1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert not results.exists()


def test_renamed_keys_are_refused_in_sweep_files_and_on_the_command_line(tmp_path, capsys):
    """The hardware keys' old names (``sim.profile``, ``canzona.cost_profile``) wherever a sweep
    takes keys: one line pointing to the new name, exit 2, nothing written; ``profile=`` is still
    the sweep profile."""
    d = write_sweep(tmp_path, MINI.replace("train.steps: 2}", "train.steps: 2, canzona.cost_profile: a100}"), "fixed")
    with pytest.raises(ConfigError, match=r"fixed.yaml fixed: canzona.cost_profile= is now planner.cost_hardware="):
        plan("sweep=fixed", configs_dir=d)
    d = write_sweep(tmp_path, MINI + "    sweep: {sim: {profile: h200}}\n", "settings")
    with pytest.raises(ConfigError, match=r"^sim.profile= is now sim.hardware="):
        plan("sweep=settings", configs_dir=d)
    d = write_sweep(tmp_path, MINI.replace("layout:\n", "size:\n        a: {canzona: {measured_profile: t.yaml}}\n"
                                                    "      layout:\n"), "axis")
    with pytest.raises(ConfigError, match=r"axis size.a: canzona.measured_profile= is now planner.measured_table="):
        plan("sweep=axis", configs_dir=d)
    results = tmp_path / "results"
    assert main(["sweep=qwen3_scaling", "profile=paper_projection", "sim.profile=h200", f"results={results}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: sim.profile= is now sim.hardware=") and not results.exists()
    p = plan("sweep=qwen3_scaling", "profile=paper_projection", "sim.hardware=h200", "list=true")
    assert p.profile == "paper_projection" and p.sim_hardware == "h200"
    assert p.results_dir.name == "qwen3_scaling-paper_projection-sim-h200"


def test_trial_ids_survive_renamed_and_added_keys():
    """Ids recorded before a key was renamed (canzona.cost_profile -> planner.cost_hardware) or
    added (MoE, batched Muon, the step's timer barrier at its value of before) name the same
    trials: these are the ids the harness gave at 73bf1f3. A new key set away from its neutral
    value, or a changed value, makes a new trial."""
    recorded = {
        (): "0.6b-canzona-muon-dp1tp1-e24a81ebcd",
        ("model=qwen3-8b", "parallel.dp=4", "planner.cost_hardware=a100"): "8b-canzona-muon-dp4tp1-6330b7a0e7",
        ("optimizer=shampoo", "method=sync", "parallel.tp=2", "train.steps=3"): "0.6b-sync-shampoo-dp1tp2-567333f772",
    }
    for overrides, want in recorded.items():  # as they ran then: no timer barrier before the step
        assert trial_id(load_config([*overrides, "dist.step_barrier=false"])) == want, overrides
        # with the barrier (today's default) the step measures something else: a new trial
        assert trial_id(load_config(list(overrides))) != want, overrides
    base = trial_id(load_config([]))
    assert trial_id(load_config(["optimizer.batch_equal_shapes=true"])) != base
    assert trial_id(load_config(["bucket.expert_size=1000000"])) != base
    assert trial_id(load_config(["planner.cost_hardware=a100"])) != base  # the value still counts


def test_cli_as_a_script_exits_2(tmp_path):
    r = subprocess.run(
        [sys.executable, str(REPO / "sweeps" / "run.py"), "sweep=qwen3_scaling", "layout=dp9"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "allowed: dp2tp1, dp2tp2" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_bad_sweep_files(tmp_path):
    d = write_sweep(tmp_path, "grid: {method: [canzona]}\nfixd: {}\n", "typo")
    with pytest.raises(ConfigError, match="unknown key 'fixd'; allowed: description"):
        plan("sweep=typo", configs_dir=d)
    d = write_sweep(tmp_path, "grid: {methd: [canzona]}\n", "badaxis")
    with pytest.raises(ConfigError, match="unknown trial key 'methd'"):
        plan("sweep=badaxis", configs_dir=d)
    d = write_sweep(tmp_path, "grid: {method: [canzona]}\nexclude: [{size: a}]\n", "badex")
    with pytest.raises(ConfigError, match="exclude key 'size' is not an axis"):
        plan("sweep=badex", configs_dir=d)
    d = write_sweep(tmp_path, "grid: {method: [canzona, sync]}\nexclude: [{method: synk}]\n", "exvalue")
    with pytest.raises(ConfigError, match="method.name='synk' is not a value of axis method.name; allowed: canzona, sync"):
        plan("sweep=exvalue", configs_dir=d)


def test_sweep_given_as_a_path(tmp_path):
    d = write_sweep(tmp_path, MINI)
    p = expand_sweep([f"sweep={d / 'mini.yaml'}", f"results={tmp_path / 'r'}"])
    assert p.sweep == "mini" and p.results_dir == tmp_path / "r" / "mini"


def test_settings_values():
    p = plan(
        "sweep=qwen3_scaling",
        "profile=paper",
        "slurm.partition=gpu",
        "slurm.account=proj",
        "slurm.time=02:30:00",
        "slurm.setup=[module load cuda/12.4, source ~/venv/bin/activate]",
        "slurm.extra_sbatch=[--signal=USR1@90]",
        "list=true",
    )
    s = p.settings
    assert (s.slurm.partition, s.slurm.account, s.slurm.time, s.list) == ("gpu", "proj", "02:30:00", True)
    assert s.slurm.setup == ["module load cuda/12.4", "source ~/venv/bin/activate"]
    assert time_minutes(s.slurm.time) == 150


def test_small_helpers():
    assert split_top_commas("a,b,[1,2],c") == ["a", "b", "[1,2]", "c"]
    assert [time_minutes(x) for x in ("90", "30:00", "01:30:00", "1-00", "1-00:30:00")] == [
        90,
        30,
        90,
        1440,
        1470,
    ]
    assert parse_extra_sbatch(["--exclusive", "--signal=USR1@90", "--gres gpu:8"]) == {
        "exclusive": True,
        "signal": "USR1@90",
        "gres": "gpu:8",
    }
    trace = (
        "Job (task=1) failed during processing with trace:\n----------------------\n"
        'Traceback (most recent call last):\n  File "x.py", line 1\n'
        "RuntimeError: injected failure on rank 1 at step 1\n\n----------------------\n"
        "You can check full logs with 'job.stderr(1)' and 'job.stdout(1)'or at paths:\n  - /a.err\n  - /a.out\n"
    )
    assert headline(Exception(trace)) == "RuntimeError: injected failure on rank 1 at step 1"
    assert headline(ValueError("bad\nmore")) == "ValueError: bad"


def test_kill_descendants_leaves_no_process():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess,time; subprocess.Popen(['sleep','60']); time.sleep(60)"]
    )
    try:
        import time

        deadline = time.monotonic() + 10
        found: list[int] = []
        while time.monotonic() < deadline:
            from canzona.sweep.procs import _children

            if _children().get(parent.pid):
                break
            time.sleep(0.05)
        found = kill_descendants(parent.pid)
        assert len(found) == 1
    finally:
        parent.kill()
        parent.wait()


# --------------------------------------------------------------------------- bookkeeping
def test_trial_states_and_rerun_policy(tmp_path):
    d = tmp_path / "t"
    assert bk.trial_state(d) == bk.NEW
    d.mkdir()
    bk.write_status(d, "running", job_id="12", started=bk.now())
    assert bk.trial_state(d) == bk.STALE
    (d / "summary.json").write_text("{}")
    assert bk.trial_state(d) == bk.DONE
    bk.write_status(d, "failed", error="boom")
    assert bk.trial_state(d) == bk.FAILED
    rec = json.loads((d / "status.json").read_text())
    assert rec["job_id"] == "12" and rec["error"] == "boom"  # merged, not replaced
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]
    table = {
        "all": {bk.NEW: True, bk.FAILED: True, bk.STALE: True, bk.DONE: True},
        "failed": {bk.NEW: True, bk.FAILED: True, bk.STALE: True, bk.DONE: False},
        "none": {bk.NEW: True, bk.FAILED: False, bk.STALE: False, bk.DONE: False},
    }
    for rerun, row in table.items():
        for state, want in row.items():
            assert bk.should_run(state, rerun) is want, (rerun, state)
    bk.prepare(d)
    assert list(d.iterdir()) == []


def test_adopt_and_tails(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / "summary.json").write_text("{}")  # e.g. submitted by hand from sbatch/
    bk.adopt(d)
    assert bk.read_status(d)["status"] == "done" and bk.read_status(d)["adopted"] is True
    logs = []
    for rank in range(2):
        p = tmp_path / f"r{rank}.err"
        p.write_text("".join(f"line {i}\n" for i in range(500)) if rank else "")
        logs.append(p)
    bk.write_tails(d, [logs[0]], logs)
    err = (d / "stderr.txt").read_text()
    assert "==> rank 1" in err and "rank 0" not in err and "line 499" in err and "line 200\n" not in err


# --------------------------------------------------------------------------- progress
class _Clock:
    """The clock of canzona.sweep.progress, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr("canzona.sweep.progress._clock", c)
    return c


def test_progress_non_tty_prints_one_line_per_finished_run(clock):
    buf = io.StringIO()
    p = Progress(3, skipped=2, stream=buf, tty=False, parallel=1)
    p.start("a")
    for _ in range(5):
        clock.t += 10
        p.refresh()  # the sweep's poll loop: nothing printed
    p.finish("a", True, "[sweep] done a (50s)")
    p.start("b")
    clock.t += 10
    p.refresh()
    p.finish("b", False, "[sweep] FAILED b (10s): RuntimeError: boom\nsecond line")
    p.finish("c", False, "[sweep] FAILED c: submission failed: sbatch refused")  # never started
    p.close()
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue() and "\033" not in buf.getvalue()
    assert len(lines) == 1 + 3, lines  # the start line, then exactly one line per finished run
    assert "3 run(s) to run" in lines[0] and "2 skipped (already recorded: resumed)" in lines[0]
    assert lines[1] == "[sweep] 1/3 finished | 0 failed | 0 running | 50s elapsed | ETA 1m40s | done a (50s)"
    assert lines[2].startswith("[sweep] 2/3 finished | 1 failed | 0 running | 1m00s elapsed | ETA ")
    assert lines[2].endswith("| FAILED b (10s): RuntimeError: boom second line")
    assert lines[3] == (
        "[sweep] 3/3 finished | 2 failed | 0 running | 1m00s elapsed | FAILED c: submission failed: sbatch refused"
    )
    assert p.done == 1 and p.failed == 2 and p.pending == 0


def test_progress_message_none_names_the_run_and_its_duration(clock):
    buf = io.StringIO()
    p = Progress(2, stream=buf, tty=False)
    p.start("a")
    clock.t += 7
    p.finish("a", True, None)
    assert buf.getvalue().splitlines()[-1].endswith("| done a (7s)")
    assert "none skipped" in buf.getvalue().splitlines()[0]


def test_progress_eta_is_none_until_a_run_finished_then_measured(clock):
    p = Progress(10, parallel=2, stream=io.StringIO(), tty=False)
    p.start("r0")
    p.start("r1")
    clock.t += 100
    assert p.eta() is None and "ETA" not in p.line()  # no guess before a run has finished
    p.finish("r0", True, None)  # 100 s; r1 still running, 8 pending, 2 slots
    # r1's slot is free at 0 s (its 100 s are spent), the other now: 8 runs of 100 s over 2 slots
    assert p.eta() == pytest.approx(400.0)
    p.start("r2")  # a warm slot: its duration will be what the ETA uses
    clock.t += 30
    p.finish("r1", True, None)  # 130 s, cold
    p.finish("r2", True, None)  # 30 s, warm: the cold starts no longer count
    assert p.per_run() == pytest.approx(30.0)
    # 7 pending, nothing running, 2 slots of 30 s: ceil(7 / 2) = 4 rounds
    assert p.eta() == pytest.approx(120.0)


def test_progress_eta_uses_parallel_slots_and_the_tail(clock):
    """median x remaining / parallel in the bulk, but the last run still takes a whole run."""
    p = Progress(3, parallel=4, stream=io.StringIO(), tty=False)
    p.start("a")
    clock.t += 60
    p.finish("a", True, None)
    assert p.eta() == pytest.approx(60.0)  # 2 pending on 4 slots run side by side, not 2 x 60 / 4
    p = Progress(9, parallel=1, stream=io.StringIO(), tty=False)
    p.start("a")
    clock.t += 60
    p.finish("a", True, None)
    p.start("b")
    clock.t += 20
    assert p.eta() == pytest.approx(40 + 7 * 60)  # what b has left, then 7 runs one after another


def test_progress_eta_adds_the_work_still_to_come_between_runs(clock):
    """The calibration slices still to take (`SweepCalibration.remaining_s`) are part of the ETA."""
    left = [90.0]
    p = Progress(3, parallel=1, stream=io.StringIO(), tty=False, extra=lambda: left[0])
    p.start("a")
    clock.t += 60
    p.finish("a", True, None)
    assert p.eta() == pytest.approx(2 * 60 + 90)
    left[0] = 0.0  # the slices taken
    assert p.eta() == pytest.approx(2 * 60)
    assert "ETA 2m00s" in p.line()


def test_progress_heartbeat_only_when_asked(clock):
    buf = io.StringIO()
    p = Progress(2, stream=buf, tty=False, heartbeat_s=60)
    p.start("a")
    clock.t += 61
    p.refresh()
    p.refresh()
    assert len(buf.getvalue().splitlines()) == 2 and "1 running" in buf.getvalue().splitlines()[1]


def test_progress_tty_draws_one_live_status_line(clock, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # the live line is cut to the terminal width
    buf = io.StringIO()
    p = Progress(3, skipped=1, parallel=2, stream=buf, tty=True)
    p.start("alpha")
    p.start("beta")
    clock.t += 30
    p.refresh()
    first, text = buf.getvalue().split("\n", 1)
    assert "ETA once a run has finished" in first
    assert "running: alpha, beta" in text and "ETA" not in text
    p.finish("alpha", True, "[sweep] done alpha (30s)")
    p.start("gamma")
    clock.t += 10
    p.refresh()
    p.finish("beta", False, "[sweep] FAILED beta (40s): RuntimeError: boom")
    p.close()
    p.close()  # twice, as the sweep's interrupt path does: harmless
    text = buf.getvalue()
    assert "1 skipped (already recorded: resumed)" in text
    assert "\r" in text or "\x1b[" in text  # redrawn in place
    assert "1/3" in text and "2/3" in text and "1 failed" in text and "runs/min" in text
    assert "ETA " in text and "running: gamma" in text
    # a failure is printed above the status line, a success only moves the bar
    assert "[sweep] FAILED beta (40s): RuntimeError: boom\n" in text and "done alpha" not in text


def test_summary_table(tmp_path):
    p = plan("sweep=smoke")
    a, b = p.trials
    (tmp_path / a.id).mkdir()
    bk.write_status(tmp_path / a.id, "done")
    (tmp_path / a.id / "summary.json").write_text(
        json.dumps({"iteration_ms_median": 12.5, "optimizer_step_ms_median": 3.25})
    )
    (tmp_path / b.id).mkdir()
    bk.write_status(tmp_path / b.id, "failed", error="RuntimeError: injected")
    text = summary_table(tmp_path, p.trials)
    assert "(1 done, 1 failed, 0 other)" in text and "12.5" in text and "3.2" in text
    assert f"{b.id}: RuntimeError: injected" in text
    assert len(text.splitlines()) < 40


def test_summary_table_groups_never_pool_models_or_layouts(tmp_path):
    """Past max_rows the table has a row per model x layout x method x optimizer: medians are
    taken over the runs of one such group only."""
    from types import SimpleNamespace

    def run(name, model, dp, tp, it_ms, method="canzona", width_div=16):
        cfg = load_config([f"method={method}", f"model.name={model}", f"model.width_div={width_div}",
                           "model.num_layers=2", f"parallel.dp={dp}", f"parallel.tp={tp}"])
        (tmp_path / name).mkdir()
        bk.write_status(tmp_path / name, "done")
        (tmp_path / name / "summary.json").write_text(
            json.dumps({"iteration_ms_median": it_ms, "optimizer_step_ms_median": it_ms / 10})
        )
        return SimpleNamespace(id=name, cfg=cfg)

    runs = [
        run("a1", "qwen3-0.6b", 2, 1, 10.0),
        run("a2", "qwen3-0.6b", 2, 1, 14.0),  # a repeat of a1's group: pooled with it
        run("b1", "qwen3-1.7b", 2, 1, 900.0),
        run("c1", "qwen3-0.6b", 1, 2, 50.0),
        run("d1", "qwen3-0.6b", 2, 1, 70.0, method="sync"),
    ]
    text = summary_table(tmp_path, runs, max_rows=3)
    rows = {tuple(line.split()[:4]): line.split()[4:] for line in text.splitlines()[4:]}
    assert rows[("qwen3-0.6b/w16l2", "dp2tp1", "canzona", "muon")] == ["2", "2", "0", "12.0", "1.2"]
    assert rows[("qwen3-1.7b/w16l2", "dp2tp1", "canzona", "muon")] == ["1", "1", "0", "900.0", "90.0"]
    assert rows[("qwen3-0.6b/w16l2", "dp1tp2", "canzona", "muon")] == ["1", "1", "0", "50.0", "5.0"]
    assert rows[("qwen3-0.6b/w16l2", "dp2tp1", "sync", "muon")] == ["1", "1", "0", "70.0", "7.0"]
    assert len(rows) == 4 and "model x layout x method x optimizer" in text


# --------------------------------------------------------------------------- list=true, the list verb, report hook
def test_local_dry_run_writes_nothing(tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["sweep=qwen3_scaling", "list=true", f"results={results}"]) == 0
    out = capsys.readouterr().out
    assert "nothing was run or written" in out and "0.6b-canzona-muon-dp2tp1-" in out
    assert not results.exists()


def test_slurm_dry_run_writes_only_sbatch_scripts(tmp_path, capsys):
    results = tmp_path / "results"
    rc = main(
        [
            "sweep=qwen3_scaling",
            "profile=paper",
            "list=true",
            f"results={results}",
            "slurm.partition=gpu",
            "slurm.account=proj",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert [p.name for p in results.iterdir()] == ["qwen3_scaling"]
    assert [p.name for p in (results / "qwen3_scaling").iterdir()] == ["sbatch"]
    scripts = sorted((results / "qwen3_scaling" / "sbatch").glob("*.sh"))
    p = shipped("sweep=qwen3_scaling", "profile=paper")
    assert len(scripts) == len(p.trials) + 1  # + submit_all.sh
    assert "nodes=32 tasks_per_node=8 gpus_per_node=8" in out and "'slurm_partition': 'gpu'" in out
    t = next(t for t in p.trials if t.world_size == 256)
    text = (results / "qwen3_scaling" / "sbatch" / f"{t.id}.sh").read_text()
    for line in (
        "#SBATCH --nodes=32",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
        "#SBATCH --exclusive",
    ):
        assert line in text
    srun = text.rstrip().splitlines()[-1]
    assert (
        srun.startswith("srun ")
        and "-m canzona.run" in srun
        and f"out={results.resolve() / 'qwen3_scaling' / t.id}" in srun
    )
    overrides = srun.split("-m canzona.run ", 1)[1].rsplit(" out=", 1)[0].split()
    assert load_config(overrides) == t.cfg
    for s in scripts:
        assert subprocess.run(["bash", "-n", str(s)]).returncode == 0


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "qwen3_scaling:" in out and "profile=local (default)" in out and "profile=paper" in out
    # every axis with the values its trials take, per profile
    local = out.split("profile=local (default)", 1)[1].split("profile=paper", 1)[0]
    assert "      method.name=canzona,sync,layerwise,adamw\n" in local and "      size=0.6b,8b\n" in local
    assert "      layout=dp2tp1,dp2tp2\n" in local


def test_report_hook(tmp_path, capsys, monkeypatch):
    got = {}

    def fake(d, out=None, hardware="auto"):
        got["hardware"] = hardware
        return Path(d) / "report" / "index.html"

    monkeypatch.setattr("analysis.report.build_report", fake)
    out = io.StringIO()
    assert build_report(tmp_path, out, hardware="h100") == 0
    assert out.getvalue().splitlines()[-1] == str(tmp_path / "report" / "index.html")
    assert got["hardware"] == "h100"

    def broken(d, out=None, hardware="auto"):
        raise ValueError("no trials")

    monkeypatch.setattr("analysis.report.build_report", broken)
    out = io.StringIO()
    assert build_report(tmp_path, out) == 1
    err = capsys.readouterr().err
    assert "ValueError: no trials" in err and "report FAILED" in err  # shown, not hidden


# --------------------------------------------------------------------------- repetitions
def test_repeats_interleave_the_methods_of_a_point(tmp_path):
    d = write_sweep(tmp_path, MINI)
    p = plan("sweep=mini", "repeats=3", configs_dir=d)
    runs = p.runs()
    assert p.repeats == 3 and len(runs) == 3 * len(p.trials)
    assert len({r.id for r in runs}) == len(runs)
    for r in runs:  # repetition 1 keeps the trial's folder; k > 1 gets a suffix
        assert r.id == (r.trial.id if r.repeat == 1 else f"{r.trial.id}-r{r.repeat}")
        assert run_id(r.trial.id, r.repeat) == r.id
        assert r.record() == {"trial_id": r.trial.id, "repeat": r.repeat, "repeats": 3}

    def point(t):
        return (t.cfg.model, t.cfg.parallel, t.cfg.train)

    # repetition-major: every trial once before any trial twice
    assert [r.repeat for r in runs] == sorted(r.repeat for r in runs)
    blocks = {rep: [r.trial.id for r in runs if r.repeat == rep] for rep in (1, 2, 3)}
    assert all(set(b) == {t.id for t in p.trials} for b in blocks.values())
    by_id = {t.id: t for t in p.trials}
    seen: list = []  # the trials of one point run back to back ...
    for tid in blocks[1]:
        if not seen or seen[-1] != point(by_id[tid]):
            assert point(by_id[tid]) not in seen, "a point's trials are split within a repetition"
            seen.append(point(by_id[tid]))
    # ... trials that differ only in their method next to each other ...
    compared: dict[str, list[int]] = {}
    for i, tid in enumerate(blocks[1]):
        d = by_id[tid].cfg.to_dict()
        d.pop("method")
        compared.setdefault(repr(d), []).append(i)
    assert any(len(ix) > 1 for ix in compared.values())
    assert all(ix == list(range(ix[0], ix[0] + len(ix))) for ix in compared.values()), compared
    # ... and every other repetition reverses each point's order
    for rep in (2, 3):
        for pt in seen:
            fwd = [x for x in blocks[1] if point(by_id[x]) == pt]
            got = [x for x in blocks[rep] if point(by_id[x]) == pt]
            assert got == (fwd[::-1] if rep == 2 else fwd)


def test_repeats_setting_is_checked_and_ignored_by_projections(tmp_path):
    with pytest.raises(ConfigError, match="repeats=0 is not allowed"):
        expand_sweep(["sweep=smoke", "repeats=0"])
    with pytest.raises(ConfigError, match="repeats"):
        expand_sweep(["sweep=smoke", "repeats=two"])
    p = expand_sweep(["sweep=smoke", "repeats=4", "cluster=simulate"])
    assert p.repeats == 1 and len(p.runs()) == len(p.trials)


def test_dry_run_lists_every_run(tmp_path, capsys):
    assert main(["sweep=smoke", "repeats=2", "list=true", f"results={tmp_path / 'r'}"]) == 0
    out = capsys.readouterr().out
    assert "2 trials x 2 repeats = 4 runs, 4 to run" in out and out.count("-r2 ") == 2
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- results lock
def test_results_lock_refuses_a_second_holder_and_names_the_first(tmp_path):
    from canzona.sweep.lock import HOLDER_NAME, ResultsLock

    folder = tmp_path / "results" / "s"
    with ResultsLock(folder, ["sweeps/run.py", "sweep=s"]):
        holder = json.loads((folder / HOLDER_NAME).read_text())
        assert holder["command"].endswith("sweeps/run.py sweep=s") and holder["pid"] > 0
        before = sorted(p.name for p in folder.iterdir())
        with pytest.raises(ConfigError) as e:
            with ResultsLock(folder, ["second"]):
                pass
        msg = str(e.value)
        assert "in use by another sweep" in msg and f"pid {holder['pid']}" in msg and "sweep=s" in msg
        assert "\n" not in msg and sorted(p.name for p in folder.iterdir()) == before
    assert not (folder / HOLDER_NAME).exists()
    # a holder file left behind by a sweep that died does not block: the OS lock went with it
    (folder / HOLDER_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "started": "x", "command": "y"}))
    with ResultsLock(folder, ["third"]):
        assert json.loads((folder / HOLDER_NAME).read_text())["command"].endswith("third")


# --------------------------------------------------------------------------- Slurm end states
def test_slurm_states_from_accounting_or_the_controller():
    from canzona.sweep.slurm_state import SlurmStates, parse_states, query

    assert parse_states("12|CANCELLED by 0|None\n12_[3-9]|PENDING|None\n12.batch|CANCELLED\n13_1|TIMEOUT|TimeLimit\n") == {
        "12": parse_states("12|CANCELLED|None")["12"],
        "13_1": parse_states("13_1|TIMEOUT|TimeLimit")["13_1"],
    }
    calls = []

    def no_sacct(cmd):  # a dev cluster: accounting disabled, the controller knows
        calls.append(cmd[0])
        if cmd[0] == "sacct":
            return None
        return "7|CANCELLED|None\n8_0|RUNNING|None\n8_1|OUT_OF_MEMORY|OutOfMemory\n"

    got = query(["7", "8_0", "8_1", "9"], no_sacct)
    assert {k: v.state for k, v in got.items()} == {"7": "CANCELLED", "8_0": "RUNNING", "8_1": "OUT_OF_MEMORY"}
    assert calls == ["sacct", "squeue"]
    assert got["8_1"].describe("8_1") == "Slurm ended job 8_1: OUT_OF_MEMORY (OutOfMemory)"

    w = SlurmStates(interval_s=0.0, grace_s=0.0, run=no_sacct)
    w.watch("8_0")
    assert w.ended_without_result("8_0") is None  # still running
    assert w.ended_without_result("7") == "Slurm ended job 7: CANCELLED"
    assert w.ended_by_slurm("7") == "Slurm ended job 7: CANCELLED" and w.ended_by_slurm("8_0") is None
    # a job that ended on its own but left no result is given time for its result to appear
    slow = SlurmStates(interval_s=0.0, grace_s=0.0, lost_s=3600.0, run=lambda cmd: "5|COMPLETED|None\n")
    assert slow.ended_without_result("5") is None


# --------------------------------------------------------------------------- the run loop
class _Handle:
    """A run that never ends by itself (the loop's view of any backend's handle)."""

    def __init__(self, run, run_dir):
        self.run, self.run_dir, self.cluster, self.t0 = run, run_dir, "fake", 0.0
        self.job_id, self.log_dir, self.error, self.cancelled = f"job-{run.id}", None, None, False

    def done(self):
        return False

    def log_paths(self):
        return [], []

    def cancel(self):
        self.cancelled = True


def test_run_loop_on_ctrl_c_records_running_runs_interrupted_and_returns_130(tmp_path):
    """Whatever the backend: Ctrl-C while runs are in flight stops them (cancel), records them
    failed ("interrupted"), leaves the queued ones untouched, closes the backend and returns 130."""
    from canzona.sweep.backend import Backend
    from canzona.sweep.loop import INTERRUPTED, run_loop

    class Fake(Backend):
        capacity, cluster = 2, "fake"

        def submit(self, runs):
            return [_Handle(r, d) for r, d in runs], []

        def wait(self, running, timeout_s):
            raise KeyboardInterrupt

        def close(self, handles):
            self.closed = handles

    p = plan("sweep=qwen3_scaling", f"results={tmp_path}")
    runs = p.runs()[:3]
    backend = Fake(p, tmp_path / "logs")
    out = io.StringIO()
    assert run_loop(p, backend, runs, 0, out) == 130
    assert out.getvalue().splitlines()[-1] == (
        "[sweep] interrupted: stopped 2 running run(s); rerun the same command to resume")
    assert [h.run.id for h in backend.closed] == [r.id for r in runs[:2]] and all(h.cancelled for h in backend.closed)
    for r in runs[:2]:
        st = bk.read_status(p.results_dir / r.id)
        assert st["status"] == "failed" and st["error"] == INTERRUPTED and st["job_id"] == f"job-{r.id}"
        assert st["cluster"] == "fake" and st["trial_id"] == r.trial.id
    assert not (p.results_dir / runs[2].id).exists()  # still queued: never started
    assert bk.trial_state(p.results_dir / runs[0].id) == bk.FAILED  # a rerun runs it again


def test_a_ctrl_c_while_a_status_is_written_is_held_until_the_block_ends() -> None:
    """The sweep loop records a run and updates its running list inside `held_interrupts`: a real
    SIGINT delivered in the block lets the block finish, then raises KeyboardInterrupt."""
    import os
    import signal

    from canzona.sweep.loop import held_interrupts

    # A process started in the background by a non-interactive shell (a CI script's `cmd &`)
    # inherits SIGINT ignored, and Python then installs no handler of its own: install it here,
    # as an interactive `python sweeps/run.py` has it, and restore what the process had.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        steps = []
        with pytest.raises(KeyboardInterrupt):
            with held_interrupts():
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("after the signal")
        assert steps == ["after the signal"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with held_interrupts():  # no signal: nothing raised
            steps.append("quiet")
        assert steps[-1] == "quiet"
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_an_inherited_ignored_sigint_stays_ignored() -> None:
    """Where the process was started with SIGINT ignored, `held_interrupts` leaves it so."""
    import os
    import signal

    from canzona.sweep.loop import held_interrupts

    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with held_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_a_list_valued_trial_key_is_a_value_not_a_section() -> None:
    """``optimizer.ns_coefficients=[...]`` on a sweep's command line is a trial value (it crashed
    with OmegaConf's traceback when the tuple was taken for a section)."""
    from canzona.errors import ConfigError
    from canzona.sweep.keys import check_trial_key

    check_trial_key("optimizer.ns_coefficients", "command line")
    with pytest.raises(ConfigError, match="is a section"):
        check_trial_key("optimizer", "command line")

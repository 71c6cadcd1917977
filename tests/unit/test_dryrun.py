"""The dry run's parts that need no fake CUDA device: its config keys, the memory ledger (on fake
CPU tensors), the collective size rules, the analytic count and the report. The dry runs
themselves (worker processes on fake CUDA) are in tests/dist/test_dryrun_fake.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from canzona.config import dry_run_ranks, load_config
from canzona.errors import ConfigError
from canzona.plan.from_config import make_plan
from canzona.program.lower import lower
from canzona.trial.dryrun import dry_run_trial
from canzona.trial.dryrun.observe import CollectiveError, Observer, _check_sizes
from canzona.trial.dryrun.report import GIB, build_report, expected_bytes, format_table, write_report

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model=qwen3-0.6b", "model.width_div=8", "model.num_layers=2", "parallel.dp=2", "parallel.tp=2"]


# ------------------------------------------------------------------------------------ config
def test_dry_run_ranks_accepts_ranks_words_and_lists() -> None:
    assert dry_run_ranks("0,255", 256) == [0, 255]
    assert dry_run_ranks("first,last", 256) == [0, 255]
    assert dry_run_ranks("last, 3, 3, first", 8) == [0, 3, 7]
    assert dry_run_ranks([5, "last"], 8) == [5, 7]
    with pytest.raises(ConfigError, match=r"dist.dry_run_ranks='0,256': rank 256 is not in the job's ranks 0..255"):
        dry_run_ranks("0,256", 256)
    with pytest.raises(ConfigError, match=r"'middle' is not a rank"):
        dry_run_ranks("first,middle", 256)


def test_dry_run_keys_are_validated_only_for_a_dry_run() -> None:
    cfg = load_config([*SMALL, "dist.dry_run=true", "dist.dry_run_ranks=0,last", "dist.dry_run_memory_gb=141"])
    assert (cfg.dist.dry_run, cfg.dist.dry_run_memory_gb) == (True, 141.0)
    load_config([*SMALL, "dist.dry_run_ranks=99"])  # not a dry run: not read
    with pytest.raises(ConfigError, match=r"rank 4 is not in the job's ranks 0..3"):
        load_config([*SMALL, "dist.dry_run=true", "dist.dry_run_ranks=4"])
    with pytest.raises(ConfigError, match=r"dist.device=cpu is not allowed"):
        load_config([*SMALL, "dist.dry_run=true", "dist.device=cpu"])
    with pytest.raises(ConfigError, match=r"dist.dry_run_memory_gb=-1.0 must be a positive"):
        load_config([*SMALL, "dist.dry_run=true", "dist.dry_run_memory_gb=-1"])
    with pytest.raises(ConfigError, match=r"dist.device=cpu is not allowed"):  # the API checks the same
        dry_run_trial(load_config([*SMALL, "dist.device=cpu"]), "first")


def test_cli_refuses_a_bad_rank_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "canzona.run", *SMALL, "dist.dry_run=true", "dist.dry_run_ranks=0,9", f"out={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: dist.dry_run_ranks='0,9': rank 9 is not in the job's ranks 0..3"]
    assert not out.exists()


# ------------------------------------------------------------------------------------ ledger
def test_ledger_books_each_storage_once_to_its_role_or_phase() -> None:
    """Views share their storage; a free ends the block; the peak's breakdown is by role where
    one was named, else build -> parameters, forward -> activations, anything else transient."""
    observer = Observer({}, device_type="cpu")  # fake CPU tensors stand in for fake CUDA ones
    ledger = observer.ledger
    with FakeTensorMode(), observer:
        with ledger.phase("build"):
            weight = torch.empty(100)  # 400 B
        grads = torch.empty(50)  # 200 B, named below
        ledger.label([grads], "gradients")
        with ledger.phase("forward"):
            act = torch.empty(1000)  # 4000 B
            view = act.view(10, 100)  # no new storage
        with ledger.phase("compute"):
            tmp = torch.empty(300)  # 1200 B: the peak, 5800 B
            tmp.add_(1.0)
            del tmp
        del act, view
        with ledger.phase("apply"):
            small = torch.empty(10)
    assert ledger.peak == 5800
    assert ledger.peak_where == ("compute", 0)
    at_peak = ledger.breakdown(ledger.peak_event)
    assert {k: at_peak[k] for k in ("parameters", "gradients", "activations", "transient", "total")} == {
        "parameters": 400, "gradients": 200, "activations": 4000, "transient": 1200, "total": 5800}
    assert at_peak["transient_by_phase"] == {"compute": 1200}
    now = ledger.breakdown()
    assert (now["total"], now["transient"], now["activations"]) == (640, 40, 0)
    assert ledger.live == 640
    del weight, grads, small


# ------------------------------------------------------------------------------------ collectives
def test_collective_size_rules() -> None:
    t = torch.empty
    _check_sizes("_allgather_base_", "w", (t(8), t(2)), 4)
    _check_sizes("_reduce_scatter_base_", "w", (t(2), t(8)), 4)
    _check_sizes("alltoall_base_", "w", (t(6), t(5), None, [1, 2, 3], [2, 2, 1]), 3)
    _check_sizes("alltoall_base_", "w", (t(6), t(6), None, [], []), 3)
    with pytest.raises(CollectiveError, match=r"w: output of 7 elements for an input of 2"):
        _check_sizes("_allgather_base_", "w", (t(7), t(2)), 4)
    with pytest.raises(CollectiveError, match=r"w: input of 9 elements for an output of 2"):
        _check_sizes("_reduce_scatter_base_", "w", (t(2), t(9)), 4)
    with pytest.raises(CollectiveError, match=r"w: input splits \[2, 2\] do not cut its 5 rows into 3"):
        _check_sizes("alltoall_base_", "w", (t(6), t(5), None, [1, 2, 3], [2, 2]), 3)
    with pytest.raises(CollectiveError, match=r"w: output of 7 rows does not split evenly into 3"):
        _check_sizes("alltoall_base_", "w", (t(7), t(6), None, [], []), 3)


# ------------------------------------------------------------------------------------ report
def test_expected_state_of_adamw_is_two_fp32_words_per_main_parameter() -> None:
    """ZeRO-1 AdamW: every rank updates its shard (main parameters, fp32) and keeps exp_avg and
    exp_avg_sq for it; the flat buffers are bf16 parameters and fp32 gradients on CUDA."""
    cfg = load_config([*SMALL, "method=adamw", "optimizer=adamw"])
    plan = make_plan(cfg, device="cuda")
    for program in lower(plan):
        want = expected_bytes(plan, program, cfg.optimizer)
        assert want["parameters"] == 2 * plan.layout.numel and want["gradients"] == 4 * plan.layout.numel
        assert want["main_parameters"] > 0
        assert want["optimizer_state"] == 2 * want["main_parameters"]


def _rank(rank: int, peak_gib: float) -> dict:
    categories = dict.fromkeys(("parameters", "gradients", "main_parameters", "optimizer_state", "activations"), 0)
    at_peak = {**categories, "transient": int(peak_gib * GIB), "total": int(peak_gib * GIB), "transient_by_phase": {}}
    return {"rank": rank, "dp_rank": rank // 2, "tp_rank": rank % 2, "expected": {},
            "memory": {"peak_bytes": int(peak_gib * GIB), "peak_phase": "backward", "peak_iteration": 2,
                       "at_peak": at_peak},
            "program_check": [], "collectives": []}


def test_report_fails_a_rank_over_the_limit_and_writes_whole_files(tmp_path: Path) -> None:
    cfg = load_config([*SMALL, "dist.dry_run=true"])
    report = build_report(cfg, [_rank(3, 100.0), _rank(0, 60.0)], [], [], 1.0)
    assert [r["rank"] for r in report["ranks"]] == [0, 3]
    assert report["ranks"][1]["fits_gb"] == {"80": False, "141": True}
    assert report["errors"] == [
        "rank 3 (dp 1, tp 1) would run out of memory: peak 100.00 GiB in backward of iteration 2 exceeds "
        "dist.dry_run_memory_gb=80"]
    table = format_table(report)
    assert "fits 80  fits 141" in table and "NO" in table and "error: rank 3" in table
    write_report(tmp_path, report)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dryrun.json", "dryrun.txt"]
    assert (tmp_path / "dryrun.txt").read_text() == table


# ------------------------------------------------------------------------------------ speed-ups
def _key_parts(mode: FakeTensorMode, args: tuple, prep) -> tuple[list, str | None]:
    from torch._subclasses.fake_tensor import _BypassDispatchCache

    out: list = []
    try:
        prep(mode, out, args, None, [])
    except _BypassDispatchCache as e:
        return out, e.reason
    return out, None


def test_fast_cache_key_is_torchs_key() -> None:
    """`fastkey._prep` writes exactly what torch's ``_prep_args_for_hash`` writes, and refuses
    caching for the same reasons, over the arguments ops get: numbers, dtypes, lists, strided
    fake tensors of every layout a rank makes (views, offsets, transposes, channels-last,
    autograd leaves), and arguments it leaves to torch (a real tensor, another mode's tensor)."""
    from canzona.trial.dryrun import fastkey

    if not fastkey.supported():  # another torch: the fast key must stay out, torch's own is used
        assert not fastkey.install() and FakeTensorMode._prep_args_for_hash is fastkey._torch_prep
        return
    mode, other = FakeTensorMode(), FakeTensorMode()
    with mode:
        base = torch.empty(8, 4, 6, 10)
        grad = torch.empty(3, 5, requires_grad=True)
        cases = [
            (base, 1, 2.5, True, None, "x", torch.float32, torch.device("cpu"), torch.strided,
             torch.contiguous_format),
            (base.transpose(1, 3), base[2:, 1], base.view(32, 60)[5:], base.permute(0, 2, 3, 1)),
            (base.contiguous(memory_format=torch.channels_last), grad, grad.t(), torch.empty(0)),
            ([base, [grad, 3]], {"dim": 1, "out": base}, (torch.empty(2, dtype=torch.bfloat16),)),
        ]
    with other:
        foreign = torch.empty(2)
    cases += [(torch.ones(2),), (foreign,)]  # torch's own path: a real tensor, not our fake
    for args in cases:
        assert _key_parts(mode, args, fastkey._prep) == _key_parts(mode, args, fastkey._torch_prep), args


def test_fast_cache_key_falls_back_to_torch_on_any_difference(monkeypatch, capsys) -> None:
    """A key the fast path gets wrong is replaced by torch's and the fast path is removed."""
    from torch._subclasses.fake_tensor import FakeTensorMode as Mode

    from canzona.trial.dryrun import fastkey

    if not fastkey.supported():  # another torch: nothing is installed, so nothing can fall back
        assert not fastkey.install() and Mode._prep_args_for_hash is fastkey._torch_prep
        return
    mode = FakeTensorMode()
    with mode:
        t = torch.empty(4, 4)
    want = _key_parts(mode, (t, 2), fastkey._torch_prep)
    monkeypatch.setattr(fastkey, "_flatten", lambda t, result: result.append("wrong"))
    monkeypatch.setattr(fastkey, "_count", 0)  # within the keys it checks
    try:
        assert fastkey.install() and Mode._prep_args_for_hash is fastkey._checked
        assert _key_parts(mode, (t, 2), Mode._prep_args_for_hash) == want
        assert Mode._prep_args_for_hash is fastkey._torch_prep  # uninstalled
        assert "differed from torch's" in capsys.readouterr().err
    finally:
        fastkey.uninstall()
    monkeypatch.setattr(fastkey, "_SOURCES", {**fastkey._SOURCES, "extract_tensor_metadata": "0" * 16})
    assert not fastkey.supported() and not fastkey.install()  # another torch: its own code


def test_fake_cache_entries_pass_between_processes_as_plain_data(tmp_path: Path) -> None:
    """`fakecache.export` writes the entries a process added (ops and metadata, not tensors),
    `merge` adds the missing ones to another cache under equal keys and removes the file; an
    entry naming an object of one process (here: a process group's script object) stays out."""
    from torch._subclasses.fake_tensor import FakeTensorMode as Mode
    from torch._subclasses.fake_tensor import _DispatchCacheBypassEntry, _DispatchCacheKey

    from canzona.trial.dryrun import fakecache

    saved = dict(Mode.cache)
    try:
        Mode.cache.clear()
        with FakeTensorMode():
            a = torch.empty(16, 8)
            (a @ a.t()).relu().sum(dim=0)
        odd = _DispatchCacheKey((torch.ops.aten.mm.default, object()))
        Mode.cache[odd] = _DispatchCacheBypassEntry("test")
        made = dict(Mode.cache)
        assert fakecache.export(tmp_path / "x.cache", 0) == len(made) - 1
        Mode.cache.clear()
        assert fakecache.merge(tmp_path / "x.cache") == len(made) - 1 and not (tmp_path / "x.cache").exists()
        assert set(Mode.cache) == set(made) - {odd}
        assert all(Mode.cache[k] == v for k, v in made.items() if k != odd)
        assert fakecache.merge(tmp_path / "missing.cache") == 0
    finally:
        Mode.cache.clear()
        Mode.cache.update(saved)

"""Filesystem problems, broken sweep files and renamed keys are one line on stderr, exit 2, nothing
written."""

from __future__ import annotations

from pathlib import Path

import pytest

from canzona.run import main as run_main
from canzona.sweep.cli import main as sweep_main

TINY = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize("kind", ["file", "virtual"])
def test_trial_out_that_cannot_be_a_folder(tmp_path: Path, capsys, kind: str) -> None:
    target = tmp_path / "a-file" if kind == "file" else Path("/proc/canzona-no-such/out")
    if kind == "file":
        target.write_text("x")
    assert run_main([*TINY, f"out={target}"]) == 2
    line = _one_error_line(capsys)
    assert f"out={target}" in line
    assert ("is not a folder" in line) if kind == "file" else ("cannot write there" in line)
    assert not Path("/proc/canzona-no-such").exists()


@pytest.mark.parametrize("kind", ["file", "virtual"])
def test_sweep_results_that_cannot_be_a_folder(tmp_path: Path, capsys, kind: str) -> None:
    target = tmp_path / "a-file" if kind == "file" else Path("/proc/canzona-no-such")
    if kind == "file":
        target.write_text("x")
    assert sweep_main(["sweep=smoke", f"results={target}"]) == 2
    line = _one_error_line(capsys)
    assert f"results={target}" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == (["a-file"] if kind == "file" else [])


def test_sweep_yaml_error_names_line_and_column(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\ngrid:\n  method: [canzona, sync\n")
    assert sweep_main([f"sweep={bad}", f"results={tmp_path / 'r'}"]) == 2
    line = _one_error_line(capsys)
    assert f"{bad}: invalid YAML at line 4, column 1:" in line and "flow sequence" in line
    assert not (tmp_path / "r").exists()


def test_trial_refuses_an_out_holding_an_earlier_runs_records(tmp_path: Path, capsys) -> None:
    (tmp_path / "summary.json").write_text('{"earlier": true}')
    (tmp_path / "config.yaml").write_text("earlier: true\n")
    assert run_main([*TINY, f"out={tmp_path}"]) == 2
    line = _one_error_line(capsys)
    assert "holds an earlier run's records (config.yaml, summary.json)" in line and "--overwrite" in line
    assert (tmp_path / "summary.json").read_text() == '{"earlier": true}'


@pytest.mark.slow
def test_overwrite_replaces_the_records_even_when_the_new_run_fails(tmp_path: Path, capsys) -> None:
    """--overwrite removes the earlier records first, so a run that fails leaves none that look
    complete (and one that succeeds leaves its own)."""
    (tmp_path / "summary.json").write_text('{"earlier": true}')
    rc = run_main([*TINY, "parallel.dp=2", "dist.threads_per_rank=1", "train.fail_on_rank=1",
                   "train.fail_at_step=0", f"out={tmp_path}", "--overwrite"])
    assert rc == 1 and not (tmp_path / "summary.json").exists()
    assert run_main([*TINY, "train.steps=1", "train.warmup=0", f"out={tmp_path}", "--overwrite"]) == 0
    assert "earlier" not in (tmp_path / "summary.json").read_text()


@pytest.mark.parametrize(
    ("first", "second", "key"),
    [("parallel.dp=2", "parallel.dp=1", "parallel.dp"),
     ("model=qwen3-0.6b", "model.name=qwen3-8b", "model.name"),
     ("method=canzona", "method.name=sync", "method.name")],
)
def test_a_key_set_twice_to_different_values_is_refused(tmp_path: Path, capsys, first: str, second: str,
                                                         key: str) -> None:
    assert run_main([*TINY, first, second, f"out={tmp_path / 'o'}"]) == 2
    line = _one_error_line(capsys)
    assert f"{first} and {second} both set {key}" in line
    assert not (tmp_path / "o").exists()


def test_the_same_value_twice_is_not_a_conflict() -> None:
    from canzona.config import load_config, parse_cli

    cfg, _ = parse_cli(["parallel.dp=2", "parallel.dp=2", "model=qwen3-0.6b", "model.name=qwen3-0.6b"])
    assert cfg.parallel.dp == 2
    # programs layer overrides (a later one wins); only a command line refuses a contradiction
    assert load_config(["parallel.dp=2", "parallel.dp=4"]).parallel.dp == 4


def test_an_override_that_contradicts_an_axis_value_is_refused(tmp_path: Path, capsys) -> None:
    """qwen3_scaling's ``size`` axis sets model.name: overriding it would run 8B in trials named 0.6b."""
    assert sweep_main(["sweep=qwen3_scaling", "size=0.6b", "model.name=qwen3-8b", f"results={tmp_path}",
                       "list=true"]) == 2
    line = _one_error_line(capsys)
    assert "model.name=qwen3-8b contradicts axis size=0.6b, which sets model.name=qwen3-0.6b" in line
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- renamed keys
@pytest.mark.parametrize("old, new", [("canzona.cost_profile=a100", "planner.cost_hardware="),
                                      ("canzona.measured_profile=t.yaml", "planner.measured_table=")])
def test_a_renamed_trial_key_points_to_its_new_name(tmp_path: Path, capsys, old: str, new: str) -> None:
    from canzona.plan.__main__ import main as plan_main
    from canzona.sim.simulate import main as simulate_main

    key = old.split("=")[0]
    for main, argv in ((run_main, [*TINY, old, f"out={tmp_path / 'out'}"]), (plan_main, [*TINY, old]),
                       (simulate_main, [*TINY, old])):
        assert main(argv) == 2
        assert _one_error_line(capsys).startswith(f"error: {key}= is now {new} (")
    assert not (tmp_path / "out").exists()


def test_the_commands_old_profile_key_points_to_hardware(tmp_path: Path, capsys) -> None:
    """``profile=`` of the simulator, the validator and the report named a hardware file: each
    says ``hardware=`` now (the sweep's ``profile=`` is its sweep profile, kept)."""
    from analysis.report import main as report_main
    from canzona.sim.simulate import main as simulate_main
    from canzona.sim.validate import main as validate_main

    for main, argv in ((simulate_main, [*TINY, "profile=h100"]), (validate_main, [str(tmp_path), "profile=h100"]),
                       (report_main, [str(tmp_path), "profile=none"])):
        assert main(argv) == 2
        assert _one_error_line(capsys).startswith("error: profile= is now hardware= (")
    assert not any(tmp_path.iterdir())
    assert simulate_main([*TINY, "hardware=a100"]) == 0 and " on a100 (projected): " in capsys.readouterr().out
    assert validate_main([str(tmp_path), "hardware=h100"]) == 0
    assert capsys.readouterr().out.startswith("hardware h100 (spec-derived); 0 trials")


# --------------------------------------------------------------------------- concurrent checks
def _check_at_once(barrier, folder: str, results) -> None:
    from canzona.errors import ConfigError
    from canzona.records import writable_folder

    barrier.wait()
    try:
        writable_folder(folder, "out")
        results.put(None)
    except ConfigError as e:
        results.put(str(e))


def test_writable_folder_from_several_processes_at_once(tmp_path: Path) -> None:
    """Four processes check the same new nested path at the same moment, 25 times: none is
    refused (the check before issue 29 refused one in most rounds, with "File exists", "No such
    file or directory" or "exists and is not a folder"), and nothing is left behind."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    for r in range(25):
        base = tmp_path / f"round{r}"
        base.mkdir()
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_check_at_once, args=(barrier, str(base / "NEW" / "PATH"), results))
                 for _ in range(4)]
        for p in procs:
            p.start()
        errors = [e for e in (results.get(timeout=30) for _ in procs) if e]
        for p in procs:
            p.join(timeout=30)
        assert not errors, f"round {r}: {errors}"
        assert not any(base.iterdir()), f"round {r} left {sorted(base.rglob('*'))}"

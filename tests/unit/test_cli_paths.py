"""Filesystem problems and broken sweep files are one line on stderr, exit 2, nothing written."""

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

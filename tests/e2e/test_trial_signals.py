"""`canzona.run` owns its ranks: SIGINT or SIGTERM to the launcher stop every rank and exit 130
with one line, and a launcher killed with SIGKILL takes its ranks (and the forkserver they were
forked from) with it (`canzona.trial.lifeline`). Real processes, checked by pid; an interrupted
run leaves no records that look complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
LONG = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "parallel.dp=2", "train.steps=100000",
        "train.seq_len=16", "train.micro_batch=1", "dist.threads_per_rank=1"]


def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(proc.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(pred, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def interruptible() -> None:
    """In the child before exec: SIGINT as a terminal delivers it. A test run started in the
    background of a non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler, as ``nohup`` intends; Ctrl-C is what is tested here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_launcher_ends_every_rank(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "canzona.run", *LONG, f"out={out}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    try:
        # the ranks are running once the forkserver has two children (they train, not yet done)
        assert _wait_until(lambda: len(_descendants(proc.pid)) >= 4 and proc.poll() is None, 120), "no ranks started"
        time.sleep(2)
        tree = _descendants(proc.pid)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
        if sig != signal.SIGKILL:
            assert proc.returncode == 130, err
            lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("[canzona]", "/"))
                     and "warnings.warn" not in ln]
            assert lines == ["interrupted: the trial's ranks were stopped; this run wrote no records"], err
        assert _wait_until(lambda: not any(_alive(p) for p in tree), 30), [p for p in tree if _alive(p)]
        assert not (out / "summary.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()

"""Live progress (done / running / failed / pending, ETA) and the end-of-sweep summary table.

On a terminal the status line is redrawn in place; anywhere else (CI logs, pipes) a plain line
is printed whenever the counts change, and at least every `heartbeat_s` while trials run.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

from canzona.sweep.bookkeeping import load_summary, read_status


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    def __init__(
        self,
        total: int,
        skipped: int = 0,
        parallel: int = 1,
        stream: TextIO | None = None,
        tty: bool | None = None,
        heartbeat_s: float = 30.0,
        min_interval_s: float = 0.0,
    ) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.total, self.skipped, self.parallel = total, skipped, max(1, parallel)
        self.done = self.failed = self.running = 0
        self.durations: list[float] = []
        self.started: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.heartbeat_s = heartbeat_s
        self.min_interval_s = min_interval_s  # non-tty: at most one count line this often (unless forced)
        self._last_line = ""
        self._last_print = 0.0
        self._drawn = False

    @property
    def pending(self) -> int:
        return self.total - self.done - self.failed - self.running

    def start(self, key: str) -> None:
        self.started[key] = time.monotonic()
        self.running += 1
        self.refresh()

    def finish(self, key: str, ok: bool, message: str | None) -> None:
        """Count a trial as finished; print `message` (None: only the counts)."""
        t = self.started.pop(key, None)
        if t is not None:
            self.durations.append(time.monotonic() - t)
            self.running -= 1
        if ok:
            self.done += 1
        else:
            self.failed += 1
        if message is None:
            self.refresh()
        else:
            self.event(message)

    def eta(self) -> float | None:
        remaining = self.pending + self.running
        if remaining == 0:
            return 0.0
        if not self.durations:
            return None
        mean = statistics.fmean(self.durations)
        now = time.monotonic()
        running_left = sum(max(0.0, mean - (now - t)) for t in self.started.values())
        return (self.pending * mean + running_left) / self.parallel

    def line(self) -> str:
        s = (
            f"[sweep] {self.done}/{self.total} done | {self.running} running | {self.failed} failed | "
            f"{self.pending} pending"
        )
        if self.skipped:
            s += f" | {self.skipped} skipped"
        return s + f" | elapsed {fmt_duration(time.monotonic() - self.t0)} | ETA {fmt_duration(self.eta())}"

    def _clear(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\033[K")
            self._drawn = False

    def event(self, message: str) -> None:
        self._clear()
        self.stream.write(message.rstrip("\n") + "\n")
        self.stream.flush()
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        line = self.line()
        now = time.monotonic()
        if self.tty:
            width = shutil.get_terminal_size((120, 20)).columns
            self.stream.write("\r\033[K" + line[: width - 1])
            self._drawn = True
            self.stream.flush()
            return
        counts = line.split(" | elapsed")[0]
        if (
            force
            or (counts != self._last_line and now - self._last_print >= self.min_interval_s)
            or (self.running and now - self._last_print >= self.heartbeat_s)
        ):
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line, self._last_print = counts, now

    def close(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()


# --------------------------------------------------------------------------- summary
def _metric(summary: dict[str, Any] | None, key: str) -> float | None:
    v = (summary or {}).get(key)
    return float(v) if isinstance(v, (int, float)) else None


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out


def summary_table(results_dir: Path, runs: list[Any], max_rows: int = 24, width: int = 110) -> str:
    """One screen: a row per run (or per method x optimizer when there are many), failures last.
    ``runs``: anything with ``id`` (the folder) and ``cfg`` (`canzona.sweep.trials.TrialRun`)."""
    recs = []
    for t in runs:
        d = Path(results_dir) / t.id
        st = read_status(d) or {}
        summ = load_summary(d)
        status = (
            "done" if summ is not None and st.get("status") != "failed" else (st.get("status") or "not run")
        )
        recs.append((t, status, summ, st))
    n_done = sum(r[1] == "done" for r in recs)
    n_failed = sum(r[1] == "failed" for r in recs)
    lines = [
        f"Sweep results: {results_dir}  ({n_done} done, {n_failed} failed, {len(recs) - n_done - n_failed} other)"
    ]
    header = ["trial", "status", "iter ms", "opt step ms", "param sync ms"]
    if len(recs) <= max_rows:
        rows = [
            [
                t.id,
                status,
                _ms(_metric(s, "iteration_ms_median")),
                _ms(_metric(s, "optimizer_step_ms_median")),
                _ms(_metric(s, "param_sync_ms_median")),
            ]
            for t, status, s, _ in recs
        ]
        lines += table(rows, header)
    else:
        groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for r in recs:
            groups[(r[0].cfg.method.label, r[0].cfg.optimizer.name)].append(r)
        rows = []
        for (method, opt), rs in groups.items():
            opt_ms = [m for m in (_metric(r[2], "optimizer_step_ms_median") for r in rs) if m is not None]
            it_ms = [m for m in (_metric(r[2], "iteration_ms_median") for r in rs) if m is not None]
            rows.append(
                [
                    f"{method}/{opt}",
                    str(len(rs)),
                    str(sum(r[1] == "done" for r in rs)),
                    str(sum(r[1] == "failed" for r in rs)),
                    _ms(statistics.median(it_ms) if it_ms else None),
                    _ms(statistics.median(opt_ms) if opt_ms else None),
                ]
            )
        lines += table(
            rows, ["method/optimizer", "runs", "done", "failed", "median iter ms", "median opt ms"]
        )
    failures = [(t, st) for t, status, _, st in recs if status == "failed"]
    if failures:
        lines.append(f"Failed ({len(failures)}; see <trial>/stderr.txt):")
        for t, st in failures[:8]:
            err = str(st.get("error") or "?").replace("\n", " ")
            line = f"  {t.id}: {err}"
            lines.append(line if len(line) <= width else line[: width - 1] + "...")
        if len(failures) > 8:
            lines.append(f"  ... and {len(failures) - 8} more")
    return "\n".join(lines)

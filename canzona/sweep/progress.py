"""Sweep progress (a live status line on a terminal, one line per finished run elsewhere) and
the end-of-sweep summary table.

On a terminal, one status line drawn in place with rich: a bar, finished / total, failures, the
measured rate, elapsed time, the ETA and the running run(s); failures are printed above it.
Anywhere else (CI logs, pipes): one line when the first run starts (how many runs are to go and
how many were skipped, i.e. already recorded by an earlier invocation), then exactly one line
per finished run, with the counts and the ETA -- no redraws, no repeated counters.

The ETA is measured, never guessed: none is shown until a run of this sweep has finished; then
it is the median duration of this sweep's finished runs (of those that did not pay a slot's
cold start, once there are any: the first ``parallel`` runs start the workers) laid onto
``parallel`` slots -- the running runs first, for what their median leaves of them, then every
pending run -- i.e. about median x remaining runs / parallel -- plus whatever else the sweep
still has to do between its runs, as measured so far (``extra``: the machine's calibration
slices still to take, `canzona.calibrate.machine.SweepCalibration.remaining_s`).
"""

from __future__ import annotations

import heapq
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from canzona.sweep.bookkeeping import load_summary, read_status

_clock = time.monotonic  # every time the progress reads (tests set their own)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fmt_rate(runs: int, seconds: float) -> str | None:
    """Measured throughput: runs per minute (per hour below one a minute)."""
    if runs <= 0 or seconds <= 0:
        return None
    per_min = runs * 60.0 / seconds
    return f"{per_min:.1f} runs/min" if per_min >= 1 else f"{per_min * 60:.1f} runs/h"


def _one_line(message: str) -> str:
    return " ".join(message.split())


class Progress:
    """What a sweep's loop reports: `start` when a run is handed out, `finish` when it ends,
    `refresh` in between (redraws the terminal line), `close` at the end.

    ``total``: runs this invocation runs; ``skipped``: runs of the sweep already recorded (not
    rerun); ``parallel``: how many run at once. ``tty``: None = ``stream.isatty()``.
    ``heartbeat_s``: off by default; a number makes the non-terminal output add a status line at
    least that often while runs are going (for CI systems that kill silent jobs).
    ``min_interval_s``: the terminal line is redrawn at most this often (unless forced).
    ``extra``: seconds of work the sweep still does between its runs (added to the ETA)."""

    BAR = 24  # width of the terminal's bar, in characters

    def __init__(
        self,
        total: int,
        skipped: int = 0,
        parallel: int = 1,
        stream: TextIO | None = None,
        tty: bool | None = None,
        heartbeat_s: float | None = None,
        min_interval_s: float = 0.0,
        extra: Callable[[], float] | None = None,
    ) -> None:
        self.stream = stream or sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self._terminal = bool(isatty and isatty())  # a real one: rich measures its width
        self.tty = self._terminal if tty is None else tty
        self.total, self.skipped, self.parallel = total, skipped, max(1, parallel)
        self.done = self.failed = self.running = 0
        self.durations: list[float] = []  # seconds of every finished run that was started
        self.started: dict[str, float] = {}  # running run -> its start (monotonic)
        self.t0 = _clock()
        self.heartbeat_s = heartbeat_s
        self.min_interval_s = min_interval_s
        self.extra = extra
        self._n_started = 0
        self._slot: dict[str, bool] = {}  # running run -> warm (not one of the first `parallel` started)
        self._timed: list[tuple[float, bool]] = []  # (duration, warm) per finished run
        self._began = False
        self._closed = False
        self._last_print = _clock()
        self._last_draw = 0.0
        self._live: Any = None  # rich.progress.Progress on a terminal
        self._task: Any = None

    # ------------------------------------------------------------------ counts and estimates
    @property
    def pending(self) -> int:
        return self.total - self.done - self.failed - self.running

    @property
    def finished(self) -> int:
        return self.done + self.failed

    def per_run(self) -> float | None:
        """The median measured duration of this sweep's finished runs (warm ones once any
        finished), None before the first."""
        warm = [d for d, w in self._timed if w]
        pool = warm or [d for d, _ in self._timed]
        return statistics.median(pool) if pool else None

    def eta(self) -> float | None:
        """Seconds until every run has finished: None until one finished, 0 when none is left."""
        if self.pending + self.running <= 0:
            return 0.0
        d = self.per_run()
        if d is None:
            return None
        now = _clock()
        slots = [max(0.0, d - (now - t)) for t in self.started.values()]
        slots += [0.0] * max(0, self.parallel - len(slots))
        heapq.heapify(slots)
        for _ in range(max(0, self.pending)):
            heapq.heapreplace(slots, slots[0] + d)
        return max(slots) + (self.extra() if self.extra is not None else 0.0)

    def _running_text(self, limit: int = 3) -> str:
        names = list(self.started)
        if not names:
            return ""
        shown = ", ".join(names[:limit])
        return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")

    def line(self) -> str:
        """The status as one plain line (what the non-terminal output prints)."""
        parts = [
            f"[sweep] {self.finished}/{self.total} finished",
            f"{self.failed} failed",
            f"{self.running} running",
            f"{fmt_duration(_clock() - self.t0)} elapsed",
        ]
        eta = self.eta()
        if eta is not None and self.pending + self.running > 0:
            parts.append(f"ETA {fmt_duration(eta)}")
        return " | ".join(parts)

    def begin_line(self) -> str:
        s = f"[sweep] {self.total} run(s) to run"
        if self.parallel > 1:
            s += f", {self.parallel} at a time"
        return (
            s
            + (f"; {self.skipped} skipped (already recorded: resumed)" if self.skipped else "; none skipped")
            + "; ETA once a run has finished"
        )

    # ------------------------------------------------------------------ events
    def start(self, key: str) -> None:
        self._begin()
        self.started[key] = _clock()
        self._slot[key] = self._n_started >= self.parallel
        self._n_started += 1
        self.running += 1
        self.refresh(force=True)

    def finish(self, key: str, ok: bool, message: str | None) -> None:
        """Count a run as finished and report it in one line: `message` (e.g. ``[sweep] FAILED
        <id> (12s): <error>``), or None for ``done <key> (<its duration>)``."""
        self._begin()
        t = self.started.pop(key, None)
        warm = self._slot.pop(key, False)
        took = None
        if t is not None:
            took = _clock() - t
            self.durations.append(took)
            self._timed.append((took, warm))
            self.running -= 1
        if ok:
            self.done += 1
        else:
            self.failed += 1
        if message is None:
            message = f"done {key}" + (f" ({fmt_duration(took)})" if took is not None else "")
        message = _one_line(message).removeprefix("[sweep] ")
        if self.tty:
            if not ok:
                self._print_above(f"[sweep] {message}")
            self.refresh(force=True)
        else:
            self._write(f"{self.line()} | {message}")

    def event(self, message: str) -> None:
        """A line of its own (above the status line on a terminal)."""
        self._begin()
        if self.tty:
            self._print_above(message.rstrip("\n"))
            self.refresh(force=True)
        else:
            self._write(message.rstrip("\n"))

    def refresh(self, force: bool = False) -> None:
        now = _clock()
        if not self.tty:
            if self.heartbeat_s and self.running and now - self._last_print >= self.heartbeat_s:
                self._write(self.line())
            return
        if self._closed or not (force or now - self._last_draw >= self.min_interval_s):
            return
        self._ensure_live()
        self._draw()
        self._live.refresh()
        self._last_draw = now

    def close(self) -> None:
        if self._live is not None and not self._closed:
            self._draw()
            self._live.stop()
        self._closed = True
        self.stream.flush()

    # ------------------------------------------------------------------ output
    def _begin(self) -> None:
        if self._began:
            return
        self._began = True
        self._write(self.begin_line())  # on a terminal too: before the status line is drawn

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last_print = _clock()

    def _tty_info(self) -> str:
        elapsed = _clock() - self.t0
        parts = [f"{self.finished}/{self.total}"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        rate = fmt_rate(self.finished, elapsed)
        if rate:
            parts.append(rate)
        parts.append(f"{fmt_duration(elapsed)} elapsed")
        eta = self.eta()
        if eta is not None and self.pending + self.running > 0:
            parts.append(f"ETA {fmt_duration(eta)}")
        running = self._running_text(limit=2)
        if running:
            parts.append(f"running: {running}")
        return " · ".join(parts)

    def _ensure_live(self) -> None:
        if self._live is not None:
            return
        from rich.console import Console  # a terminal only: plain output needs no rich
        from rich.progress import BarColumn, TextColumn
        from rich.progress import Progress as RichProgress
        from rich.table import Column

        console = Console(
            file=self.stream,
            force_terminal=True,
            width=None if self._terminal else shutil.get_terminal_size((120, 20)).columns,
        )
        self._live = RichProgress(
            TextColumn("[sweep]", markup=False, table_column=Column(no_wrap=True)),
            BarColumn(
                bar_width=self.BAR,
                complete_style="green",
                finished_style="green",
                table_column=Column(no_wrap=True),
            ),
            TextColumn("{task.fields[info]}", markup=False, table_column=Column(no_wrap=True)),
            console=console,
            auto_refresh=False,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._task = self._live.add_task("sweep", total=max(1, self.total), completed=self.finished, info="")
        self._draw()
        self._live.start()

    def _draw(self) -> None:
        """Update the status line, its text cut to the terminal (the bar keeps its width)."""
        info = self._tty_info()
        room = max(12, self._live.console.width - len("[sweep]") - self.BAR - 3)
        if len(info) > room:
            info = info[: room - 1] + "…"
        self._live.update(self._task, completed=self.finished, info=info)

    def _print_above(self, text: str) -> None:
        if self._live is None or self._closed:
            self._write(text)
            return
        self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)


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


def _model(cfg: Any) -> str:
    """The model a run trained, scaled variants named apart (qwen3-0.6b/w16l2)."""
    m = getattr(cfg, "model", None)
    name = str(getattr(m, "name", "?"))
    div, layers = getattr(m, "width_div", 1) or 1, getattr(m, "num_layers", None)
    return name if div == 1 and layers is None else f"{name}/w{div}l{layers if layers is not None else 'all'}"


def _layout(cfg: Any) -> str:
    par = getattr(cfg, "parallel", None)
    ep = getattr(par, "ep", 1)
    return f"dp{getattr(par, 'dp', '?')}tp{getattr(par, 'tp', '?')}" + (f"ep{ep}" if isinstance(ep, int) and ep > 1 else "")


def _median(values: list[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def summary_table(results_dir: Path, runs: list[Any], max_rows: int = 24, width: int = 110) -> str:
    """One screen: a row per run, failures last; when there are more than ``max_rows`` runs, a
    row per model x layout x method x optimizer (its runs' medians pooled there only: no median
    mixes models or layouts). ``runs``: anything with ``id`` (the folder) and ``cfg``
    (`canzona.sweep.trials.TrialRun`)."""
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
        groups: dict[tuple[str, str, str, str], list[Any]] = defaultdict(list)
        for r in recs:
            cfg = r[0].cfg
            groups[(_model(cfg), _layout(cfg), cfg.method.label, cfg.optimizer.name)].append(r)
        rows = []
        for (model, layout, method, opt), rs in groups.items():
            rows.append(
                [
                    model,
                    layout,
                    method,
                    opt,
                    str(len(rs)),
                    str(sum(r[1] == "done" for r in rs)),
                    str(sum(r[1] == "failed" for r in rs)),
                    _ms(_median([_metric(r[2], "iteration_ms_median") for r in rs])),
                    _ms(_median([_metric(r[2], "optimizer_step_ms_median") for r in rs])),
                ]
            )
        lines.append(
            f"{len(recs)} runs: one row per model x layout x method x optimizer (medians over its runs)"
        )
        lines += table(
            rows,
            [
                "model",
                "layout",
                "method",
                "optimizer",
                "runs",
                "done",
                "failed",
                "median iter ms",
                "median opt ms",
            ],
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

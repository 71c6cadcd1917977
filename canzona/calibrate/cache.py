"""This machine's calibration cache: measured optimizer costs per (host, device, torch version),
taken the first time a plan needs them, kept outside the repository and reused after.

Where: the directory ``planner.cost_cache`` names, else ``$CANZONA_CACHE_DIR``, else
``$XDG_CACHE_HOME/canzona``, else ``~/.cache/canzona``. One YAML file per identity -- host,
device (on a CPU: its model and the torch threads per rank, which change every relative
cost), torch version -- named after it. It holds the matmul rates, elementwise AdamW per
element and per tensor, and per optimizer setting (`settings_key`: the optimizer's own
options) one entry per kernel shape (`canzona.calibrate.kernels`). A plan that needs shapes the
file lacks times just those and adds them (seconds); every write holds a file lock
(``<file>.lock``, so concurrent trials and sweep workers take turns instead of timing at once)
and replaces the file atomically. A file that cannot be read, has another format, or belongs to
another identity is moved aside (``<file>.bad-<time>``) with a message and taken anew. Each
process says once per file where its numbers came from ("calibration taken|extended|reused: PATH").
"""

from __future__ import annotations

import copy
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from canzona.errors import ConfigError
from canzona.optim import registry
from canzona.optim.rule import Settings, Shape

ENV = "CANZONA_CACHE_DIR"
FORMAT = "canzona-calibration/1"
LOCK_TIMEOUT_S = 900.0  # another process may be timing a large plan's shapes


def cache_dir(configured: str | None = None) -> Path:
    """The cache directory (see the module docstring for the order)."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "canzona"


@dataclass(frozen=True)
class Identity:
    """What a calibration is valid for: timings taken elsewhere are not this machine's."""

    host: str
    device: str  # "cpu: <model>, N thread(s)" or "cuda: <GPU name>"
    torch: str

    def as_dict(self) -> dict[str, str]:
        return {"host": self.host, "device": self.device, "torch": self.torch}

    def file_name(self) -> str:
        def slug(text: str) -> str:
            return "".join(c if c.isalnum() or c in ".-" else "-" for c in text).strip("-").lower()[:60]

        return f"{slug(self.host)}_{slug(self.device)}_torch-{slug(self.torch)}.yaml"


def this_device(kind: str, threads: int) -> Identity:
    """The identity of this host's ``kind`` device (cpu | cuda) timed with ``threads`` threads."""
    import torch

    if kind == "cuda":
        device = f"cuda: {torch.cuda.get_device_name(torch.cuda.current_device())}"
    else:
        device = f"cpu: {_cpu_model()}, {threads} thread{'s' if threads != 1 else ''}"
    return Identity(platform.node() or "unknown-host", device, str(torch.__version__))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def settings_key(optimizer: str, settings: Settings) -> str:
    """The optimizer and the values of its own options: timings of one setting are not another's
    (Newton-Schulz steps or dtype change every matrix's time)."""
    d = registry.get(optimizer)

    def plain(v: Any) -> Any:
        return tuple(plain(x) for x in v) if isinstance(v, (list, tuple)) else v

    return f"{optimizer}(" + ", ".join(f"{o.name}={plain(getattr(settings, o.name))!r}" for o in d.options) + ")"


@dataclass(frozen=True)
class Calibration:
    """A loaded cache file (plain data: it is what rank 0 broadcasts to the other ranks)."""

    path: str
    identity: dict[str, str]
    date: str
    rates: dict[str, float]
    elementwise: dict[str, float]
    updates: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def describe(self) -> str:
        i = self.identity
        return f"measured: {_home(self.path)} ({i['host']}, {i['device']}, torch {i['torch']}, {self.date})"

    def table(self, optimizer: str, settings: Settings) -> dict[str, dict[str, Any]]:
        return self.updates.get(settings_key(optimizer, settings), {})


def _home(path: str) -> str:
    home = str(Path.home())
    return "~" + path[len(home):] if path.startswith(home + os.sep) else path


@dataclass(frozen=True)
class Need:
    """Kernel shapes a plan needs for one optimizer setting."""

    optimizer: str
    settings: Settings
    shapes: tuple[Shape, ...]


def ensure(kind: str, threads: int, needs: Iterable[Need], directory: str | None = None,
           log: Callable[[str], Any] | None = None) -> tuple[Calibration, list[str]]:
    """This device's calibration with every needed kernel shape in it, timing what is missing
    (under the file lock). Returns it and what was timed now (``"<setting> MxN"``; empty when
    the cache had everything). ``log`` (default: stderr) hears where the numbers came from."""
    say = log or _stderr
    ident = this_device(kind, threads)
    path = cache_dir(directory) / ident.file_name()
    needs = [n for n in needs if registry.get(n.optimizer).matrix]
    data = _read(path, ident, say)
    if data is not None and not _missing(data, needs):
        _announce(say, "reused", path, data)
        return _calibration(path, data), []
    from filelock import FileLock, Timeout

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
            data = _read(path, ident, say)  # another process may have written it meanwhile
            missing = _missing(data or {}, needs)
            if data is not None and not missing:
                _announce(say, "reused", path, data)
                return _calibration(path, data), []
            status = "taken" if data is None else "extended"
            data = _measure(kind, threads, ident, data, missing)
            _write(path, data)
    except Timeout:
        raise ConfigError(f"the calibration cache {path} stayed locked for {LOCK_TIMEOUT_S:.0f} s: another "
                          "process is timing into it (a lock dies with its process)") from None
    except OSError as e:
        raise ConfigError(f"the calibration cache cannot be written at {path.parent} ({e.strerror or e}); set "
                          f"{ENV} or planner.cost_cache to a writable folder") from None
    _announce(say, status, path, data, len(missing))
    return _calibration(path, data), [f"{key} {s[0]}x{s[1]}" for key, _, _, s in missing]


# ---------------------------------------------------------------------------------- internals
_announced: set[tuple[str, str]] = set()  # (path, status) said once per process
# path -> ((mtime, size), content): a process that plans often parses each version once
_parsed: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _announce(say: Callable[[str], Any], status: str, path: Path, data: dict[str, Any], count: int = 0) -> None:
    if (str(path), status) in _announced and status == "reused":
        return
    _announced.add((str(path), status))
    what = {"taken": "calibration taken", "extended": f"calibration extended by {count} shape(s)",
            "reused": "calibration reused"}[status]
    say(f"[canzona] cost: {what}: {path} ({data['identity']['device']}, torch {data['identity']['torch']})")


def _missing(data: dict[str, Any], needs: list[Need]) -> list[tuple[str, str, Settings, Shape]]:
    """(settings key, optimizer, settings, shape) of every needed shape the table lacks."""
    have = data.get("updates") or {}
    out: list[tuple[str, str, Settings, Shape]] = []
    seen: set[tuple[str, Shape]] = set()
    for need in needs:
        key = settings_key(need.optimizer, need.settings)
        for shape in need.shapes:
            shape = (int(shape[0]), int(shape[1]))
            if f"{shape[0]}x{shape[1]}" not in have.get(key, {}) and (key, shape) not in seen:
                seen.add((key, shape))
                out.append((key, need.optimizer, need.settings, shape))
    return out


def _read(path: Path, ident: Identity, say: Callable[[str], Any]) -> dict[str, Any] | None:
    """The cache file's content, or None when there is none; a file that is not a calibration
    of this identity is moved aside (with a message) and counts as none."""
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        seen = _parsed.get(str(path))
        data = seen[1] if seen and seen[0] == stamp else _parse(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, yaml.YAMLError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        return _set_aside(path, f"is not a readable calibration ({reason})", say)
    if data["identity"] != ident.as_dict():
        theirs = data["identity"]
        return _set_aside(path, f"belongs to {theirs.get('host')} / {theirs.get('device')} / torch "
                                f"{theirs.get('torch')}, not this {ident.host} / {ident.device} / torch {ident.torch}", say)
    _parsed[str(path)] = (stamp, data)
    return data


def _parse(text: str) -> dict[str, Any]:
    """Check the structure and every number (ValueError naming the first problem)."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"format is not {FORMAT}")
    if not isinstance(data.get("identity"), dict) or not {"host", "device", "torch"} <= set(data["identity"]):
        raise ValueError("identity must give host, device and torch")
    data["identity"] = {k: str(data["identity"][k]) for k in ("host", "device", "torch")}
    for section, keys in (("rates", ("float32", "bfloat16")), ("elementwise", ("seconds_per_element", "tensor_overhead_s"))):
        values = data.get(section)
        if not isinstance(values, dict):
            raise ValueError(f"{section} is missing")
        for k in keys:
            _number(values.get(k), f"{section}.{k}")
    updates = data.get("updates") or {}
    if not isinstance(updates, dict):
        raise ValueError("updates must be a mapping")
    for key, table in updates.items():
        if not isinstance(table, dict):
            raise ValueError(f"updates[{key!r}] must be a mapping")
        for shape, entry in table.items():
            m, _, n = str(shape).partition("x")
            if not (m.isdigit() and n.isdigit()) or not isinstance(entry, dict):
                raise ValueError(f"updates[{key!r}][{shape!r}] is not an MxN entry")
            for k in ("step_s", "refresh_s"):
                if k in entry or k == "step_s":
                    _number(entry.get(k), f"updates[{key!r}][{shape!r}].{k}")
    data["updates"] = updates
    return data


def _number(v: Any, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{what} is {v!r}, not a non-negative number")


def _set_aside(path: Path, why: str, say: Callable[[str], Any]) -> None:
    aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}")
    try:
        os.replace(path, aside)
        say(f"[canzona] cost: the calibration cache {path} {why}; moved it to {aside.name} and taking a new one")
    except OSError:
        say(f"[canzona] cost: the calibration cache {path} {why}; taking a new one")
    return None


def _measure(kind: str, threads: int, ident: Identity, data: dict[str, Any] | None,
             missing: list[tuple[str, str, Settings, Shape]]) -> dict[str, Any]:
    """Time what ``data`` lacks on this device (rates and elementwise when new) and merge."""
    import torch

    from canzona.calibrate.clock import Clock
    from canzona.calibrate.kernels import CAP_S, Job, matmul_rates, time_elementwise, time_kernel_updates
    from canzona.host_memory import retain_freed_memory
    from canzona.optim.section import OptimizerSection

    before = torch.get_num_threads()
    if kind == "cpu":
        torch.set_num_threads(threads)
        retain_freed_memory()  # time the updates as a trial's CPU rank runs them (`canzona.host_memory`)
    try:
        clock = Clock(torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else "cpu")
        now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data = copy.deepcopy(data)  # the parsed content may be shared with earlier Calibrations
        if data is None:
            data = {"format": FORMAT, "identity": ident.as_dict(), "created": now,
                    "rates": matmul_rates(clock), "elementwise": time_elementwise(clock, OptimizerSection()),
                    "updates": {}}
        jobs = [Job(key, o, s, shape) for key, o, s, shape in missing]
        for key, table in time_kernel_updates(clock, jobs, data["rates"], CAP_S.get(kind, CAP_S["cpu"])).items():
            data["updates"].setdefault(key, {}).update(table)
        data["updated"] = now
        return data
    finally:
        torch.set_num_threads(before)
        if kind == "cuda":  # the launcher's GPU is rank 0's too: hand the probes' memory back
            torch.cuda.empty_cache()


def _write(path: Path, data: dict[str, Any]) -> None:
    from canzona.records import atomic_write_text

    header = ("# canzona calibration cache (canzona/calibrate/cache.py): seconds measured on this host and device,\n"
              "# read by the planner's measured cost model; delete the file to take a new one.\n")
    atomic_write_text(path, header + yaml.safe_dump(data, sort_keys=False, width=140))


def _calibration(path: Path, data: dict[str, Any]) -> Calibration:
    return Calibration(str(path), dict(data["identity"]), str(data.get("updated") or data.get("created", "")),
                       dict(data["rates"]), dict(data["elementwise"]), data["updates"])

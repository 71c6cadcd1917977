"""The processes below a process (Linux ``/proc``): what a failed or interrupted run leaves
behind must not outlive it -- rank processes are children of a forkserver, not of whoever
started the run, so killing the run's own process is not enough."""

from __future__ import annotations

import os
import signal


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def kill_descendants(pid: int) -> list[int]:
    """SIGKILL every descendant of ``pid`` (Linux /proc); returns their pids."""
    if not os.path.isdir("/proc"):
        return []
    tree = _children()
    found, stack = [], list(tree.get(pid, []))
    while stack:
        p = stack.pop()
        found.append(p)
        stack.extend(tree.get(p, []))
    for p in found:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return found

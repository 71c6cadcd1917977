"""The command-line shell every entry point shares.

A command (``python -m canzona.run``, ``canzona.plan``, ``canzona.sim.simulate``,
``canzona.sim.validate``, ``canzona.calibrate``, ``analysis.report``, ``python sweeps/run.py``) is
declared once in `canzona.reference.COMMANDS` -- its usage, what it does and its keys, from which
its ``--help`` and docs/configuration.md are generated -- and runs its body through
`run_command`, which owns what every command does alike:

- ``-h`` / ``--help`` anywhere: the generated help on stdout, exit 0, nothing else runs;
- a `ConfigError` from the body -- a bad key or value, a folder it cannot use, a missing
  argument -- is misuse: one line ``error: ...`` on stderr naming it, exit `MISUSE` (2).

What else a body reports (a failed run, an interrupted one) and its own exit status are its own.
Imports no torch: ``--help`` and a bad key answer without loading it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from canzona.errors import ConfigError

MISUSE = 2  # the exit status of a command given a bad key, value or argument
HELP = ("-h", "--help")


def run_command(name: str, body: Callable[[list[str]], int], argv: Sequence[str] | None = None, *,
                help_words: Sequence[str] = HELP, stream: TextIO | None = None) -> int:
    """Run command ``name``'s ``body`` on ``argv`` (default: this process's arguments) and
    return the exit status: its help (``help_words``, written to ``stream``, default stdout)
    or the body's status, `MISUSE` when it raises a `ConfigError` (`refuse`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in help_words for a in args):
        from canzona.reference import command_help

        text = command_help(name)
        (stream or sys.stdout).write(text if text.endswith("\n") else text + "\n")
        return 0
    try:
        return body(args)
    except ConfigError as e:
        return refuse(e)


def usage(name: str) -> str:
    """Command ``name``'s usage from the reference, its forms on one line (for an error line)."""
    from canzona.reference import command

    return " | ".join(form.strip() for form in command(name).usage.splitlines())


def say(line: str) -> None:
    """Write ``line`` and its newline to stderr in one ``write`` and flush it: the ranks of a
    torchrun launch share one stderr pipe, and ``print`` writes the text and the newline apart,
    which an unbuffered stderr (``PYTHONUNBUFFERED``) sends as two writes that another rank's line
    can land between. One write of under ``PIPE_BUF`` bytes to a pipe is atomic."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def refuse(problem: object) -> int:
    """Report a misuse as one line ``error: <problem>`` on stderr; returns `MISUSE`."""
    say(f"error: {problem}")
    return MISUSE


__all__ = ["HELP", "MISUSE", "refuse", "run_command", "say", "usage"]

"""One command-line shell (`canzona.cli`): every command of the reference answers ``--help`` with
its generated help and a bad key with one ``error:`` line and exit 2, through `run_command`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from canzona.cli import MISUSE, refuse, run_command, usage
from canzona.errors import ConfigError
from canzona.reference import COMMANDS, command_help

ROOT = Path(__file__).resolve().parents[2]

# Each command of `canzona.reference.COMMANDS`: the module whose ``main`` runs it, and arguments
# holding one bad key (after the positional a command needs)
ENTRY = {
    "canzona.run": ("canzona.run", []),
    "canzona.plan": ("canzona.plan.__main__", []),
    "canzona.sim.simulate": ("canzona.sim.simulate", []),
    "sweeps/run.py": ("canzona.sweep.cli", ["sweep=smoke"]),
    "analysis.report": ("analysis.report", ["FOLDER"]),
    "canzona.sim.validate": ("canzona.sim.validate", ["FOLDER"]),
    "canzona.calibrate": ("canzona.calibrate.__main__", []),
}


def test_every_command_of_the_reference_has_an_entry() -> None:
    assert sorted(ENTRY) == sorted(c.name for c in COMMANDS)


@pytest.mark.parametrize("name", sorted(ENTRY))
def test_help_is_the_generated_reference(name: str, capsys) -> None:
    main = importlib.import_module(ENTRY[name][0]).main
    assert main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert out.rstrip("\n") == command_help(name).rstrip("\n") and err == ""


@pytest.mark.parametrize("name", sorted(ENTRY))
def test_a_bad_key_is_one_line_and_exit_2(name: str, capsys, tmp_path: Path) -> None:
    module, before = ENTRY[name]
    args = [str(tmp_path) if a == "FOLDER" else a for a in before]
    assert importlib.import_module(module).main([*args, "bogus.key=1"]) == MISUSE
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "bogus" in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written


def test_run_command_owns_help_and_misuse(capsys) -> None:
    ran: list[list[str]] = []

    def body(argv: list[str]) -> int:
        ran.append(argv)
        if argv == ["bad"]:
            raise ConfigError("x=bad: not a value")
        return 7

    assert run_command("canzona.plan", body, ["a", "-h"]) == 0 and ran == []
    assert run_command("canzona.plan", body, ["help"], help_words=("help",)) == 0 and ran == []
    assert run_command("canzona.plan", body, ["ok"]) == 7 and ran == [["ok"]]
    capsys.readouterr()
    assert run_command("canzona.plan", body, ["bad"]) == MISUSE
    assert capsys.readouterr().err == "error: x=bad: not a value\n"
    assert refuse("no such folder") == MISUSE
    assert capsys.readouterr().err == "error: no such folder\n"


def test_usage_is_the_reference_on_one_line() -> None:
    """A missing argument's error line quotes the reference's usage, every form on one line."""
    for c in COMMANDS:
        assert "\n" not in usage(c.name) and usage(c.name).startswith(c.usage.splitlines()[0])
    assert usage("canzona.sim.validate").endswith("| python -m canzona.sim.validate published [--json] "
                                                  "| python -m canzona.sim.validate across SWEEP_DIR SWEEP_DIR [...] [--json]")


def test_no_command_keeps_its_own_shell() -> None:
    """Help and the misuse line are printed in `canzona.cli` alone: no entry point calls
    ``command_help`` or prints an ``error:`` line with exit 2 itself."""
    own = []
    for path in [*ROOT.joinpath("canzona").rglob("*.py"), *ROOT.joinpath("analysis").rglob("*.py")]:
        if path.name in ("cli.py", "reference.py") and path.parent.name in ("canzona",):
            continue
        text = path.read_text()
        if "command_help(" in text or 'print(f"error: {e}"' in text:
            own.append(str(path.relative_to(ROOT)))
    assert own == []


def test_an_error_line_reaches_stderr_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks of a torchrun launch share one stderr pipe; ``print`` wrote the text and its
    newline apart, and CI once read one rank's line glued to the other's. `refuse` writes each
    line whole, so the pipe's atomic writes keep the lines apart."""
    import io

    class Recorder(io.RawIOBase):
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def writable(self) -> bool:
            return True

        def write(self, b) -> int:  # type: ignore[override]
            self.writes.append(bytes(b))
            return len(b)

    raw = Recorder()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, write_through=True, line_buffering=True))
    assert refuse("out=x: cannot write there") == 2
    assert raw.writes == [b"error: out=x: cannot write there\n"]

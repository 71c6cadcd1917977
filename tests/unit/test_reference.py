"""Every command explains itself from the schemas: ``--help`` lists every key with its default,
allowed values and meaning; docs/configuration.md is the same text, generated; a bad key or an
unknown flag is answered without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from canzona.config import trial_key_docs
from canzona.reference import COMMANDS, command_help, document
from canzona.sweep.settings import SETTINGS_DOCS

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_reference_is_the_committed_one() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == document(), "docs/configuration.md drifted: python -m canzona.reference > docs/configuration.md"


def test_every_key_is_described_with_its_default_and_allowed_values() -> None:
    for docs in (trial_key_docs(), SETTINGS_DOCS):
        for d in docs:
            assert d.help, f"{d.key} has no meaning"
    text = command_help("canzona.run")
    for d in trial_key_docs():
        assert f"  {d.key}=" in text, d.key
    # method.dp's allowed values (--help wraps to the terminal's width: compared unwrapped)
    assert "[ddp | zero1_atomic | balanced | layerwise | zero1 | layerwise_sharded | layerwise_sharded_ns]" in " ".join(text.split())
    assert "list=false" in command_help("sweeps/run.py")


def test_choices_declared_in_the_schema_are_the_ones_validated() -> None:
    from canzona.config import load_config
    from canzona.errors import ConfigError

    for d in trial_key_docs():
        if d.choices and d.key not in ("model.name", "method.name", "method.dp", "method.tp", "optimizer.name"):
            with pytest.raises(ConfigError, match=f"{d.key}='bogus' is not allowed; choose one of: "
                                                  f"{', '.join(d.choices)}"):
                load_config([f"{d.key}=bogus"])


@pytest.mark.parametrize("module", ["canzona.run", "canzona.plan.__main__", "canzona.sweep.cli",
                                    "canzona.sim.simulate", "canzona.calibrate.__main__"])
def test_help_and_a_bad_key_import_no_torch(module: str) -> None:
    code = (f"import sys, io, contextlib; import {module} as m; buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):\n"
            "    helped, bad = m.main(['--help']), m.main(['bad.key=1'])\n"
            "assert (helped, bad) == (0, 2), (helped, bad, buf.getvalue())\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "assert 'usage:' in buf.getvalue() and 'error: ' in buf.getvalue()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_an_unknown_flag_points_to_the_key_value_form(capsys) -> None:
    from canzona.run import main

    assert main(["--dp", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: unknown flag --dp; settings are key=value (parallel.dp=2 or method.dp=2?), see --help; "
                   "allowed flags: --overwrite")


def test_every_command_has_a_reference_section() -> None:
    text = document()
    for c in COMMANDS:
        assert f"# `{c.name}`" in text

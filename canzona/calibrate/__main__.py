"""``python -m canzona.calibrate key=value ...`` (see `canzona.calibrate`)."""

from __future__ import annotations

import sys

from canzona.calibrate.settings import parse_args
from canzona.cli import run_command


def main(argv: list[str] | None = None) -> int:
    return run_command("canzona.calibrate", _calibrate, argv)


def _calibrate(argv: list[str]) -> int:
    opts = parse_args(argv)
    from canzona.calibrate.build import calibrate, write_hardware

    hardware = calibrate(opts)
    path = write_hardware(hardware, opts.out)
    print(f"wrote {path} in {hardware['calibration']['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m canzona.calibrate key=value ...`` (see `canzona.calibrate`)."""

from __future__ import annotations

import sys

from canzona.calibrate.settings import parse_args
from canzona.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        from canzona.reference import command_help

        print(command_help("canzona.calibrate"))
        return 0
    try:
        opts = parse_args(argv)
        from canzona.calibrate.build import calibrate, write_hardware

        hardware = calibrate(opts)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = write_hardware(hardware, opts.out)
    print(f"wrote {path} in {hardware['calibration']['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

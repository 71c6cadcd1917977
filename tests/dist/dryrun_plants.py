"""Violations planted in a dry-run worker (``CANZONA_DRYRUN_SETUP=this_file.py:FUNCTION``), which
the dry run must report as errors of the rank: tests/dist/test_dryrun_fake.py."""

from __future__ import annotations


def cpu_tensor_to_all_reduce() -> None:
    """The gradient norm's all-reduce (its sum of squares) is handed a CPU copy."""

    from canzona.executor import comm

    original = comm.Communicator._all_reduce

    def planted(self, tag, axis, t):
        return original(self, tag, axis, t.cpu() if tag == "grad norm reduce" else t)

    comm.Communicator._all_reduce = planted


def short_all_gather_output() -> None:
    """Every all-gather is given an output one element short of group size x input."""
    from canzona.executor import comm

    original = comm.Communicator._all_gather

    def planted(self, tag, axis, out, inp):
        return original(self, tag, axis, out.view(-1)[:-1], inp)

    comm.Communicator._all_gather = planted

"""The dry-run report: the analytic memory count a rank must match, the verdicts, the files.

`expected_bytes` counts, from the plan and the rank's program alone, what the runtime must hold
for the whole run: the flat parameter buffer (the model's dtype) and the fp32 gradient buffer
over the planner's layout, fp32 main parameters over the program's ``main_ranges``, and the
optimizer state of every matrix the rank computes and every elementwise range it updates
(``canzona.optim.registry.get(name).state_numel``; state is fp32, as the gradients the rules get).
The dry run's measured breakdown of these categories is compared with it by the tests.

`build_report` puts the ranks' results together with the verdicts (fits ``dist.dry_run_memory_gb``,
and the reference devices `REFERENCE_GB`), `write_report` writes ``dryrun.json`` and
``dryrun.txt`` atomically, and `format_table` is the text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from canzona.optim import registry
from canzona.plan.experts import rank_space
from canzona.program.actions import DTYPE_BYTES, Compute, Elementwise, Program
from canzona.records import DRYRUN_JSON, DRYRUN_TEXT, atomic_write_text

GIB = 1 << 30
REFERENCE_GB = (80.0, 141.0)  # H100 / A100 80 GB and H200 141 GB, as GiB
STATE_BYTES = 4  # optimizer state follows the fp32 gradients
MEASURED = ("parameters", "gradients", "main_parameters", "optimizer_state", "activations", "transient")
LABELS = {"parameters": "params", "gradients": "grads", "main_parameters": "main", "optimizer_state": "opt state",
          "activations": "activations", "transient": "transient"}


def expected_bytes(plan, program: Program, optimizer) -> dict[str, int]:
    """Bytes of the long-lived buffers one rank holds (see the module docstring); an MoE rank's
    buffers and params are its dense and expert ones (`canzona.plan.experts.RankSpace`)."""
    space = rank_space(plan, program.rank)
    numel = space.layout.numel
    matrix = registry.get(optimizer.name)
    elementwise = registry.ELEMENTWISE
    shapes: dict[tuple[int, str], tuple[int, ...]] = {}
    ranges: set[tuple[int, int]] = set()
    for a in program.actions:
        if isinstance(a, Compute):
            for i in a.items:
                spec = space.params[i]
                whole = spec.shape if a.source is not None else spec.local_shape(space.split_over(i, plan.tp))
                for sub in spec.subs or ():
                    shapes[(i, sub.name)] = tuple(sub.shape)
                if not spec.subs:
                    shapes[(i, spec.name)] = tuple(whole)
        elif isinstance(a, Elementwise):
            ranges.update(a.ranges)
    state = sum(matrix.state_numel(s, optimizer) for s in shapes.values())
    state += sum(elementwise.state_numel((e - s,), optimizer) for s, e in ranges)
    return {
        "parameters": numel * DTYPE_BYTES[program.param_dtype],
        "gradients": numel * 4,
        "main_parameters": sum(e - s for s, e in program.main_ranges) * 4,
        "optimizer_state": state * STATE_BYTES,
    }


def build_report(cfg, ranks: list[dict[str, Any]], errors: list[str], matching: list[str],
                 seconds: float) -> dict[str, Any]:
    """The report of one dry run; an error per rank whose peak exceeds ``dist.dry_run_memory_gb``."""
    limit = cfg.dist.dry_run_memory_gb
    errors = list(errors) + [f"program matching: {p}" for p in matching]
    for r in ranks:
        peak = r["memory"]["peak_bytes"]
        r["fits_gb"] = {f"{g:g}": peak <= g * GIB for g in (*REFERENCE_GB, limit)}
        if peak > limit * GIB:
            phase, iteration = r["memory"]["peak_phase"], r["memory"]["peak_iteration"]
            errors.append(
                f"rank {r['rank']} (dp {r['dp_rank']}, tp {r['tp_rank']}) would run out of memory: peak "
                f"{peak / GIB:.2f} GiB in {phase} of iteration {iteration} exceeds dist.dry_run_memory_gb={limit:g}"
            )
    return {
        "trial": {
            "model": cfg.model.name, "method": cfg.method.label, "optimizer": cfg.optimizer.name, "dp": cfg.parallel.dp,
            "tp": cfg.parallel.tp, "world": cfg.world_size, "micro_batch": cfg.train.micro_batch,
            "seq_len": cfg.train.seq_len, "dp_collective": cfg.dist.dp_collective,
        },
        "memory_gb": {"limit": limit, "reference": list(REFERENCE_GB)},
        "ranks": sorted(ranks, key=lambda r: r["rank"]),
        "program_matching": "every group's calls line up" if not matching else matching,
        "errors": errors,
        "seconds": round(seconds, 1),
    }


def _unit(report: dict[str, Any]) -> tuple[str, int]:
    """GiB, or MiB for a report whose largest peak is under 1 GiB (small test models)."""
    most = max((r["memory"]["peak_bytes"] for r in report["ranks"]), default=0)
    return ("GiB", GIB) if most >= GIB else ("MiB", 1 << 20)


def format_table(report: dict[str, Any]) -> str:
    """The report as text: per rank, the memory at its peak by category, and its collectives."""
    t = report["trial"]
    lim = report["memory_gb"]["limit"]
    gbs = list(dict.fromkeys(f"{g:g}" for g in (*report["memory_gb"]["reference"], lim)))
    unit, scale = _unit(report)

    def size(n: float) -> str:
        return f"{n / scale:.2f}"

    lines = [
        f"dry run: {t['model']} {t['method']} {t['optimizer']} dp={t['dp']} tp={t['tp']} ({t['world']} ranks), "
        f"micro-batch {t['micro_batch']} x {t['seq_len']} tokens; device memory in {unit} at each rank's peak "
        f"(limit dist.dry_run_memory_gb={lim:g} GiB)",
        "",
    ]
    head = ["rank", "dp", "tp", *(LABELS[c] for c in MEASURED), "peak", "peak in", *(f"fits {g}" for g in gbs)]
    rows = []
    for r in report["ranks"]:
        m = r["memory"]
        rows.append([
            str(r["rank"]), str(r["dp_rank"]), str(r["tp_rank"]), *(size(m["at_peak"][c]) for c in MEASURED),
            size(m["peak_bytes"]), f"{m['peak_phase']}, iteration {m['peak_iteration']}",
            *("yes" if r["fits_gb"][g] else "NO" for g in gbs),
        ])
    lines += _columns(head, rows, left=(len(head) - len(gbs) - 1,))
    lines += ["", f"expected from the plan ({unit}):"]
    for r in report["ranks"]:
        lines.append(f"  rank {r['rank']}: " + ", ".join(f"{LABELS[k]} {size(v)}" for k, v in r["expected"].items()))
    for r in report["ranks"]:
        check = r["program_check"]
        verdict = "equal its program's" if not check else "DIFFER from its program: " + "; ".join(check)
        lines += ["", f"rank {r['rank']}: collectives of one iteration, the executor's and Megatron's "
                      f"(the executor's calls {verdict}):"]
        lines += _columns(["op", "group", "dtype", "calls", unit],
                          [[c["op"], c["axis"], c["dtype"], str(c["calls"]), size(c["bytes"])] for c in r["collectives"]],
                          left=(0, 1, 2))
    matching = report["program_matching"]
    lines += ["", f"programs of all {t['world']} ranks: "
              + (matching if isinstance(matching, str) else "; ".join(matching))]
    lines += [f"error: {e}" for e in report["errors"]]
    return "\n".join(lines) + "\n"


def _columns(head: list[str], rows: list[list[str]], left: tuple[int, ...] = ()) -> list[str]:
    """Aligned columns: numbers to the right, the ``left`` columns to the left."""
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if k in left else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]


def write_report(out: Path, report: dict[str, Any]) -> None:
    """``dryrun.json`` and ``dryrun.txt`` into ``out``, each written whole or not at all."""
    atomic_write_text(out / DRYRUN_JSON, json.dumps(report, indent=1) + "\n")
    atomic_write_text(out / DRYRUN_TEXT, format_table(report))

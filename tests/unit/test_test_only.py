"""No test-only code in the product: every function, class and method defined in `canzona/`
that a test names is named by the product too (`canzona/`, `analysis/`, `benchmarks/`,
`sweeps/`, `scripts/`), except the few listed in `KEPT`, each with its reason. Test support
lives in `tests/` (`tests/dist/full_tensors.py`: full tensors and a step from given gradients;
`tests/unit/import_walk.py`: the import walk).

A name counts as used where it appears as a word anywhere but its own definition, so the check
errs on the side of passing (a name shared with something else passes).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("canzona", "analysis", "benchmarks", "sweeps", "scripts")
WORD = re.compile(r"\w+")

# (module, name): defined in the product, named only by tests, and kept there on purpose.
KEPT: dict[tuple[str, str], str] = {
    ("canzona.optim.owner", "ReferenceOptimizer"):
        "the single-process optimizer every parity test (tests/dist, tests/peers) compares with; "
        "docs/usage.md names it as the reference, and it is the owner module's rules run whole",
    ("canzona.hardware", "unlabelled"):
        "the evidence rule of a hardware file (every input number labelled), stated beside "
        "check_evidence and input_numbers, whose private walk it shares",
}


def _words(paths: list[Path]) -> Counter[str]:
    return Counter(w for p in paths for w in WORD.findall(p.read_text(errors="ignore")))


def definitions(path: Path) -> list[tuple[str, int]]:
    """(name, line) of the file's top-level functions and classes and of their classes' methods
    (dunders aside)."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.append((node.name, node.lineno))
        if isinstance(node, ast.ClassDef):
            out += [(s.name, s.lineno) for s in node.body
                    if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and not s.name.startswith("__")]
    return out


def named_only_by_tests() -> list[tuple[str, str, int]]:
    """(module, name, line) of every product definition that only tests name."""
    product = [p for d in PRODUCT for p in sorted((ROOT / d).rglob("*"))
               if p.is_file() and p.suffix in (".py", ".sh", "")]
    used = _words(product)
    tests = _words(sorted((ROOT / "tests").rglob("*.py")))
    defined = Counter(name for p in sorted((ROOT / "canzona").rglob("*.py")) for name, _ in definitions(p))
    out = []
    for p in sorted((ROOT / "canzona").rglob("*.py")):
        module = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out += [(module, name, line) for name, line in definitions(p)
                if used[name] <= defined[name] and tests[name]]
    return out


def test_no_helper_in_the_product_serves_only_tests() -> None:
    found = named_only_by_tests()
    bad = [f"{m}:{line} {name}" for m, name, line in found if (m, name) not in KEPT]
    assert not bad, ("defined in canzona/, named only by tests: move it to tests/ (or list it in KEPT "
                     "with its reason):\n" + "\n".join(bad))
    assert {(m, n) for m, n, _ in found} == set(KEPT), "a kept helper is used by the product now: take it off KEPT"

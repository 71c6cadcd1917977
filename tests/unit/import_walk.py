"""Test support: the one walk over a file's imports that the structure tests read.

`imports` lists every import of a file -- at module level, inside functions, under ``if
TYPE_CHECKING:`` -- with where it is: ``lazy`` (not at the file's top level: a function's or a
class's body; ``if`` and ``try`` blocks at the top level count as top) and ``typing`` (under ``if
TYPE_CHECKING:``, so never run). ``from pkg import name`` is an import of ``pkg.name`` when that
is one of the given modules, else of ``pkg``; its ``package`` is ``pkg`` (Python loads it first).
`tests/unit/test_layers.py` checks the layering with it, the cycle and one-way checks in
test_program, test_methods and test_optim_registry take the edges they count from it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]


class Import(NamedTuple):
    module: str  # what is imported: ``pkg.name`` when that is a module, else ``pkg``
    line: int
    lazy: bool  # not at the file's top level
    typing: bool  # under ``if TYPE_CHECKING:`` (never run)
    package: str | None = None  # ``from pkg import ...``: pkg (None for ``import x``)


def module_files(*folders: str) -> dict[str, Path]:
    """Module name -> file of every ``.py`` under ``folders`` (relative to the checkout)."""
    return {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
            for folder in folders for f in sorted((ROOT / folder).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING"


def imports(path: Path, modules: set[str], packages: tuple[str, ...] | None = ("canzona",)) -> list[Import]:
    """Every import of the file (absolute ones; of modules under ``packages``, None: any), in
    the order `ast.walk` meets them, one per imported module and statement."""
    tree = ast.parse(path.read_text())
    top: set[int] = set()

    def mark(body: list[ast.stmt]) -> None:
        for node in body:
            top.add(id(node))
            if isinstance(node, ast.If | ast.Try):
                mark(node.body)
                mark(node.orelse)
                mark([s for h in getattr(node, "handlers", []) for s in h.body])

    mark(tree.body)
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        package = None
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package = node.module
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                     for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out += [Import(n, node.lineno, id(node) not in top, id(node) in typing_only, package)
                for n in dict.fromkeys(names)
                if packages is None or any(n == p or n.startswith(p + ".") for p in packages)]
    return out

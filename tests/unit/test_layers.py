"""The package's layering (docs/design.md § 4): no import in `canzona/` runs up the layers.

The layer table is read from docs/design.md, so the drawing and the check cannot drift apart.
Every import counts -- at module level, inside functions, under ``if TYPE_CHECKING:`` -- except
the lazy imports named in `ALLOWED`, each with its reason. The walk over a file's imports is
`import_walk.imports`, the one the other structure tests (import cycles, one-way imports) use.
"""

from __future__ import annotations

import re
from pathlib import Path

from import_walk import imports, module_files

ROOT = Path(__file__).resolve().parents[2]

# (importer, imported): the up-imports that stay, each lazy (inside the function that needs it)
# and each with its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("canzona.cli", "canzona.reference"):
        "the commands' one shell renders a command's --help (and its usage in an error) from the "
        "reference, only when asked: every command line, from every layer, starts through it",
}


def layer_table() -> list[tuple[int, list[str]]]:
    """(layer, module names) of each row of docs/design.md § 4's layer table."""
    section = (ROOT / "docs" / "design.md").read_text().split("\n## 4.", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert rows, "docs/design.md § 4 has no layer table"
    return [(int(r.split("|")[1]), re.findall(r"`([\w.*]+)`", r.split("|")[2])) for r in rows]


def layer_of(module: str, table: list[tuple[int, list[str]]]) -> int:
    """The layer of the longest table name that covers ``module`` (a name covers itself and
    what is under it; ``pkg.*`` only what is under ``pkg``)."""
    best: tuple[int, int] | None = None  # (match length, layer)
    for layer, names in table:
        for name in names:
            prefix = name[:-1] if name.endswith(".*") else name + "."
            if (module == name or module.startswith(prefix)) and (best is None or len(name) > best[0]):
                best = (len(name), layer)
    assert best is not None, f"{module} is in no layer of docs/design.md § 4's table"
    return best[1]


def up_imports() -> list[tuple[str, str, int, bool]]:
    """(importer, imported, line, lazy) of every import that runs up the layers."""
    table = layer_table()
    mods = module_files("canzona")
    return [(m, i.module, i.line, i.lazy) for m, f in mods.items() for i in imports(f, set(mods))
            if layer_of(i.module, table) > layer_of(m, table)]


def test_every_module_has_a_layer() -> None:
    table = layer_table()
    for m in module_files("canzona"):
        layer_of(m, table)


def test_no_import_runs_up_the_layers() -> None:
    """Only the lazy imports of `ALLOWED` run up; each of them still exists (a fixed one is
    taken off the list)."""
    found = up_imports()
    bad = [f"{m}:{line} imports {d}" + (" (lazily)" if lazy else "") for m, d, line, lazy in found
           if (m, d) not in ALLOWED or not lazy]
    assert not bad, "imports up the layers of docs/design.md § 4:\n" + "\n".join(bad)
    assert {(m, d) for m, d, _, _ in found} == set(ALLOWED), "an allowed up-import is gone: take it off ALLOWED"


def test_the_walk_sees_lazy_and_typing_imports(tmp_path: Path) -> None:
    """The walk is not blind to what the check exists for: an import inside a function and one
    under ``if TYPE_CHECKING:`` both count."""
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from canzona.config import TrialConfig\n"
                 "def g():\n    from canzona import run\n")
    assert [i[:4] for i in imports(f, {"canzona.run", "canzona.config"})] == [
        ("canzona.config", 3, False, True), ("canzona.run", 5, True, False)]


def test_the_walk_names_modules_packages_and_other_imports(tmp_path: Path) -> None:
    """What the cycle and one-way checks read from the same walk: ``from pkg import a, f`` is an
    import of the module ``pkg.a`` and of ``pkg`` (``f`` is not a module), each with ``pkg`` as
    its package; other packages' imports only when asked (``packages=None``)."""
    f = tmp_path / "m.py"
    f.write_text("import torch\nfrom canzona.plan import registry, label\ntry:\n    import canzona.sim\n"
                 "except ImportError:\n    pass\nclass C:\n    from canzona import cost\n")
    mods = {"canzona.plan", "canzona.plan.registry", "canzona.cost", "canzona.sim"}
    assert imports(f, mods) == [
        ("canzona.plan.registry", 2, False, False, "canzona.plan"), ("canzona.plan", 2, False, False, "canzona.plan"),
        ("canzona.sim", 4, False, False, None), ("canzona.cost", 8, True, False, "canzona")]
    assert [i.module for i in imports(f, mods, packages=None)][:1] == ["torch"]

"""The documentation stays a front page with docs behind it, and its links lead somewhere.

- README.md is at most 220 lines (the front page; the rest is in docs/).
- Every relative link and image in README.md and docs/*.md names a file that exists (its
  ``#anchor`` aside); links to the web and to anchors of the same page are not checked.
- Names say what they hold, as docs/usage.md § Words and docs/design.md § 4 say: every strategy
  is one module of `canzona.plan.strategies` named as the strategy (PEP 8's trailing underscore
  where the name is a Python keyword: ``async`` is ``async_.py``), and the registry lists each;
  an expanded sweep (`ExpandedSweep`, not a `Plan`) is a parameter named ``sweep`` wherever one
  is taken; ``dp`` / ``tp`` are sizes and a strategy's name is ``dp_strategy`` / ``tp_strategy``.
"""

from __future__ import annotations

import ast
import keyword
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 220
# [text](target) and ![alt](target); an optional "title" after the target is dropped
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that point into the repository (code excluded)."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue  # https:, mailto:, ... or an anchor on the same page
        out.append(target)
    return out


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/usage.md, "
        "measured figures to docs/results.md")


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_that_exist(page: Path) -> None:
    missing = []
    for target in relative_links(page.read_text()):
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {', '.join(missing)}"


def test_the_link_finder_finds_links() -> None:
    text = ("see [usage](docs/usage.md#reports), ![shot](img/a.png \"title\"), [web](https://x.org), "
            "[here](#top), `[not](code.md)`\n```\n[nor](block.md)\n```\n")
    assert relative_links(text) == ["docs/usage.md#reports", "img/a.png"]


def _module_name(strategy: str) -> str:
    """The module a strategy named ``strategy`` lives in (PEP 8: ``async`` -> ``async_``)."""
    return f"{strategy}_" if keyword.iskeyword(strategy) else strategy


def test_every_strategy_module_is_named_as_its_strategy_and_registered() -> None:
    import importlib

    from canzona.plan.registry import DP_STRATEGIES, TP_STRATEGIES

    folder = ROOT / "canzona" / "plan" / "strategies"
    stems = sorted(f.stem for f in folder.glob("*.py") if f.stem != "__init__")
    for stem in stems:
        module = importlib.import_module(f"canzona.plan.strategies.{stem}")
        assert stem == _module_name(module.NAME), f"{stem}.py holds the strategy {module.NAME!r}"
    registered = [*DP_STRATEGIES.values(), *TP_STRATEGIES.values()]
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in registered) == stems
    assert all(_module_name(name) == m.__name__.rsplit(".", 1)[1]
               for name, m in [*DP_STRATEGIES.items(), *TP_STRATEGIES.items()])
    assert not (ROOT / "baselines").exists(), "the strategies live in one package, canzona/plan/strategies"


def _annotated_parameters(tree: ast.AST, type_name: str) -> list[tuple[str, int]]:
    """(name, line) of every function parameter whose annotation mentions ``type_name``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.annotation is not None and type_name in ast.unparse(arg.annotation):
                    out.append((arg.arg, arg.lineno))
    return out


def test_an_expanded_sweep_is_called_sweep() -> None:
    """docs/usage.md § Words: an expanded sweep is not a `Plan`, so no parameter holding one is
    called ``plan``; each is ``sweep``."""
    found, wrong = 0, []
    for f in sorted([*(ROOT / "canzona").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]):
        for name, line in _annotated_parameters(ast.parse(f.read_text()), "ExpandedSweep"):
            found += 1
            if name != "sweep":
                wrong.append(f"{f.relative_to(ROOT)}:{line} {name}")
    assert found >= 10 and not wrong, wrong


def test_cfg_is_a_trial_config_and_mcfg_a_model_spec() -> None:
    """The glossary's `cfg` / `mcfg`: no parameter annotated `ModelConfig` is called ``cfg``, none
    annotated `TrialConfig` is called ``mcfg`` (docs/usage.md § Words)."""
    import ast

    wrong = []
    for path in sorted((ROOT / "canzona").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                    kind = ast.unparse(arg.annotation).strip("'\"") if arg.annotation is not None else None
                    if (arg.arg, kind) in (("cfg", "ModelConfig"), ("mcfg", "TrialConfig")):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg}: {kind})")
    assert not wrong, wrong


# A size is an int, a strategy name a str: which names may hold which (docs/usage.md § Words).
_SIZE_NAMES, _STRATEGY_NAMES = ("dp", "tp"), ("dp_strategy", "tp_strategy")
# Named as the config keys they hold (``method.dp``, ``method.tp``), the one place ``dp`` / ``tp``
# are strategy names in code: the keys are user-facing and recorded, so they keep their names.
_KEY_FIELDS = {("canzona/config.py", "MethodSection")}


def _holds(annotation: ast.expr | None, default: ast.expr | None) -> set[str]:
    """The kinds ("int", "str") a parameter's or field's annotation names or its default is."""
    kinds = set(re.findall(r"\b(int|str)\b", ast.unparse(annotation))) if annotation is not None else set()
    if isinstance(default, ast.Constant) and type(default.value) in (int, str):
        kinds.add(type(default.value).__name__)
    return kinds


def strategy_size_mixups(tree: ast.AST, path: str = "") -> list[str]:
    """Every parameter (and class field) named as a size (``dp``, ``tp``) that holds a str, or
    named as a strategy (``dp_strategy``, ``tp_strategy``) that holds an int."""
    wrong = []
    for node in ast.walk(tree):
        named: list[tuple[str, ast.expr | None, ast.expr | None, int]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
            named += [(x.arg, x.annotation, d, x.lineno) for x, d in zip(positional, defaults)]
            named += [(x.arg, x.annotation, d, x.lineno) for x, d in zip(a.kwonlyargs, a.kw_defaults)]
        elif isinstance(node, ast.ClassDef) and (path, node.name) not in _KEY_FIELDS:
            named += [(s.target.id, s.annotation, s.value, s.lineno) for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        for name, annotation, default, line in named:
            kinds = _holds(annotation, default)
            if (name in _SIZE_NAMES and "str" in kinds) or (name in _STRATEGY_NAMES and "int" in kinds):
                wrong.append(f"{path}:{line} {name}: {' | '.join(sorted(kinds))}")
    return wrong


def test_the_size_and_strategy_check_finds_mixups() -> None:
    bad = ("def compose(inputs, dp: str, tp='duplicated'): ...\n"
           "def grid(dp_strategy: int, *, tp_strategy=2): ...\n"
           "class Preset:\n    dp: str\n    tp_strategy: str\n")
    good = ("def compose(inputs, dp_strategy: str, tp_strategy: 'str | None' = None): ...\n"
            "def grid(dp: int, tp=2, *, tp_size: int = 1): ...\n")
    assert sorted(w.split(" ", 1)[1] for w in strategy_size_mixups(ast.parse(bad))) == sorted(
        ["dp: str", "tp: str", "dp: str", "dp_strategy: int", "tp_strategy: int"])
    assert strategy_size_mixups(ast.parse(good)) == []


def test_dp_and_tp_are_sizes_and_strategies_say_so() -> None:
    """docs/usage.md § Words: in code ``dp`` / ``tp`` are sizes (ints, as Megatron names them), a
    DP or TP strategy's name is ``dp_strategy`` / ``tp_strategy``; only the config fields named as
    their keys (``method.dp``, ``method.tp``) hold a strategy under the short name."""
    found, wrong = 0, []
    for path in sorted([*(ROOT / "canzona").rglob("*.py"), *(ROOT / "analysis").rglob("*.py"),
                        *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        text = path.read_text()
        found += len(re.findall(r"\b(?:dp|tp)_strategy: str\b", text))
        wrong += strategy_size_mixups(ast.parse(text), str(path.relative_to(ROOT)))
    assert found >= 15 and not wrong, wrong

"""The optimizer registry: one module per optimizer is the only place its name, config keys,
flops, refresh cost, state size and calibration shapes are written down."""

from __future__ import annotations

import dataclasses
import graphlib
import math
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from import_walk import imports, module_files
from omegaconf import OmegaConf

from canzona import config, hardware
from canzona.config import OptimizerSection, load_config
from canzona.cost import FlopsCost, load_measured
from canzona.errors import ConfigError
from canzona.inventory import ParamSpec
from canzona.optim import registry
from canzona.optim.rule import OptimizerDef, Option, UpdateRule
from canzona.plan.from_config import make_cost_model

PACKAGE = Path(__file__).resolve().parents[2] / "canzona"


def test_names_come_from_the_registry() -> None:
    assert config.OPTIMIZERS == registry.NAMES == ("muon", "shampoo", "soap", "adamw")
    assert registry.MATRIX_NAMES == ("muon", "shampoo", "soap")
    assert set(hardware.ELEMENTWISE_PASSES) == set(registry.MATRIX_NAMES)


def test_section_has_every_registered_key_flat() -> None:
    fields = {f.name: f for f in dataclasses.fields(OptimizerSection)}
    assert list(fields) == [o.name for o in registry.OPTIONS]
    for d in registry.REGISTERED:
        for o in d.options:
            assert fields[o.name].default == o.default, o.name
    # the user-visible keys of before stay as they were, plus blocking, clipping and batching
    assert {"name", "lr", "weight_decay", "momentum", "nesterov", "ns_steps", "ns_coefficients", "ns_eps",
            "ns_dtype", "lr_adjust", "batch_equal_shapes", "adamw_lr", "betas", "eps", "precondition_frequency", "shampoo_eps",
            "max_preconditioner_dim", "clip_grad", "clip_norm_dtype"} == set(fields)
    cfg = load_config(["optimizer=soap", "optimizer.max_preconditioner_dim=512", "optimizer.ns_steps=3",
                       "optimizer.betas=[0.8,0.99]", "optimizer.lr=0.5"])
    assert (cfg.optimizer.max_preconditioner_dim, cfg.optimizer.ns_steps, cfg.optimizer.betas) == (512, 3, (0.8, 0.99))
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # trials travel to rank processes


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer=lion", "optimizer.name='lion' is not allowed; choose one of: muon, shampoo, soap, adamw"),
        ("optimizer.ns_dtype=fp8", "optimizer.ns_dtype='fp8' is not allowed; choose one of: float32, bfloat16"),
        ("optimizer.lr_adjust=x", "optimizer.lr_adjust='x' is not allowed"),
        ("optimizer.precondition_frequency=0", "optimizer.precondition_frequency=0 must be >= 1"),
        ("optimizer.max_preconditioner_dim=0", "optimizer.max_preconditioner_dim=0 must be >= 1"),
        ("optimizer.bogus=1", "unknown config key 'optimizer.bogus'"),
    ],
)
def test_bad_optimizer_values_are_one_line_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert message in str(err.value) and "\n" not in str(err.value)


def _toy(options: tuple[Option, ...], name: str = "toy") -> OptimizerDef:
    return OptimizerDef(name=name, rule=lambda s: None, steady_flops=lambda shape, s: 1.0,
                        state_numel=lambda shape, s: 0, options=options)


def test_a_key_declared_twice_must_agree() -> None:
    same = _toy((Option("precondition_frequency", int, 10),))
    merged = registry.merge_options(registry.COMMON_OPTIONS, (*registry.REGISTERED, same))
    assert [o.name for o in merged] == [o.name for o in registry.OPTIONS]
    for clash in (Option("precondition_frequency", int, 5), Option("precondition_frequency", float, 10)):
        with pytest.raises(ValueError, match="precondition_frequency"):
            registry.merge_options(registry.COMMON_OPTIONS, (*registry.REGISTERED, _toy((clash,))))


def test_a_new_optimizer_is_one_definition() -> None:
    """What registering a module does: its keys join the flat section, validated like the others."""

    class Sign(UpdateRule):
        def init_state(self, shape, device, dtype):
            return {}

        def directions(self, grads, states, step):
            return [g.sign() for g in grads]

    toy = OptimizerDef(name="signsgd", rule=lambda s: Sign(), steady_flops=lambda shape, s: shape[0] * shape[1],
                       state_numel=lambda shape, s: 0, options=(Option("sign_scale", float, 1.0, minimum=0.0),))
    options = registry.merge_options(registry.COMMON_OPTIONS, (*registry.REGISTERED, toy))
    section = dataclasses.make_dataclass("Section", [o.dataclass_field() for o in options])
    merged = OmegaConf.merge(OmegaConf.structured(section), OmegaConf.from_dotlist(["sign_scale=0.5", "ns_steps=3"]))
    settings = OmegaConf.to_object(merged)
    assert (settings.sign_scale, settings.ns_steps) == (0.5, 3)
    assert toy.make_rule(settings).directions([torch.tensor([[-2.0, 3.0]])], [{}], 1)[0].tolist() == [[-1.0, 1.0]]
    assert toy.flops((4, 5), settings) == 20 and toy.calibration_shapes([(4, 5), (4, 5)], settings) == [(4, 5)]
    assert toy.options[0].problem(-1.0) == "optimizer.sign_scale=-1.0 must be >= 0"


def test_usage_extending_example_works() -> None:
    """docs/usage.md's example optimizer module ("Extending"), registered as it says, is a valid trial."""
    usage = (PACKAGE.parent / "docs" / "usage.md").read_text()
    section = usage.split("\n## Extending\n", 1)[1].split("\n## ", 1)[0]
    code = next(b.split("```", 1)[0] for b in section.split("```python\n")[1:] if "OptimizerDef(" in b)
    module: dict = {}
    exec(compile(code, "signum.py", "exec"), module)
    signum = module["OPTIMIZER"]
    defs = (*registry.REGISTERED, signum)
    options = registry.merge_options(registry.COMMON_OPTIONS, defs)
    section_cls = dataclasses.make_dataclass("Section", [o.dataclass_field() for o in options])
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(section_cls),
                                              OmegaConf.from_dotlist(["name=signum", "signum_momentum=0.8"])))
    rule = signum.make_rule(cfg)
    grads = [torch.randn(3, 4), torch.randn(3, 4)]
    states = [rule.init_state((3, 4), "cpu", torch.float32) for _ in grads]
    dirs = rule.directions(grads, states, 1)
    assert torch.equal(dirs[0], grads[0].sign()) and rule.momentum == 0.8
    assert signum.flops((3, 4), cfg) == 48 and signum.state_numel((3, 4), cfg) == 12
    assert "signum.OPTIMIZER` in `REGISTERED`" in section


def test_costs_follow_the_registry_and_blocking() -> None:
    fc1 = ParamSpec(name="fc1", shape=(51200, 5120), kind="matrix", tp_dim=0)
    small = OptimizerSection(name="shampoo", max_preconditioner_dim=1024)
    default = make_cost_model("flops", "shampoo")
    blocked = make_cost_model("flops", "shampoo", settings=small)
    assert blocked.cost(fc1) < default.cost(fc1)
    d = registry.get("shampoo")
    assert default.cost(fc1) == d.steady_flops(fc1.shape, OptimizerSection()) + d.refresh_flops(fc1.shape, OptimizerSection()) / 10
    # the hardware module's flops are the registry's, with the same defaults
    assert hardware.steady_flops("soap", 300, 700) == registry.get("soap").steady_flops((300, 700), OptimizerSection())
    assert hardware.steady_flops("muon", 300, 700, ns_steps=3) == registry.get("muon").steady_flops(
        (300, 700), OptimizerSection(ns_steps=3))
    assert hardware.refresh_flops("muon", 300, 700) == 0 and hardware.refresh_flops("shampoo", 300, 700) > 0
    assert FlopsCost("adamw").cost(fc1) == FlopsCost("adamw").elementwise_flops * fc1.numel


def test_measured_cost_sums_the_blocks_it_has(tmp_path: Path) -> None:
    """A shape missing from the table costs the sum of its blocks when all are measured."""
    settings = OptimizerSection(max_preconditioner_dim=4)
    assert registry.get("soap").kernels((10, 4), settings) == [(4, 4), (4, 4), (2, 4)]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"updates": {"soap": {"4x4": 1.0, "2x4": 0.25}}, "adamw_seconds_per_element": 1e-9}))
    cost = load_measured(path, "soap", FlopsCost("soap", settings))
    assert cost.cost(ParamSpec(name="v", shape=(10, 4), kind="matrix", tp_dim=None)) == 2.25 and not cost.missing
    # 10 x 6 has 4 x 2 and 2 x 2 blocks, which are not measured: extrapolated and reported
    assert cost.cost(ParamSpec(name="w", shape=(10, 6), kind="matrix", tp_dim=None)) > 0
    assert cost.missing == {"10x6"}


# ---- import structure ----


def _imports() -> dict[str, set[str]]:
    """Module -> the canzona modules it imports anywhere in its body (function-level included),
    from the one import walk (`import_walk`): ``from pkg import sub`` counts as importing the
    submodule ``pkg.sub``."""
    files = module_files("canzona")
    return {name: {i.module for i in imports(path, set(files))} & set(files) - {name} for name, path in files.items()}


def test_optimizer_modules_import_one_way() -> None:
    """No cycle through the optimizer package, the config, the cost models or the hardware module; the
    maths never imports the config (which is built from it)."""
    graph = _imports()
    ours = {m for m in graph if m.startswith("canzona.optim")} | {"canzona.config", "canzona.cost", "canzona.hardware"}
    graphlib.TopologicalSorter({m: graph[m] & ours for m in ours}).prepare()  # raises CycleError
    for m in ours:
        if m.startswith("canzona.optim") and m != "canzona.optim.owner":
            assert "canzona.config" not in graph[m], m
    assert "canzona.optim.definitions" in graph["canzona.optim.registry"]
    assert "canzona.optim.registry" not in graph["canzona.optim.rule"]


def test_the_config_schema_imports_no_torch() -> None:
    """A command line is checked without loading torch (~2 s): the config, the registry and the
    optimizer descriptions name the update rules by import path; a rule is imported when made."""
    code = ("import sys, canzona.config, canzona.plan.registry; from canzona.optim import registry; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "registry.make_rule(canzona.config.load_config().optimizer, 'matrix'); "
            "assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_state_bytes_for_a_dry_run() -> None:
    """state_numel × element size is the optimizer state of one tensor, AdamW's two moments included."""
    s = OptimizerSection()
    assert registry.get("adamw").state_numel((151936, 5120), s) == 2 * 151936 * 5120
    assert registry.get("muon").state_numel((1024, 3072), s) == 1024 * 3072
    bytes_fc1 = registry.get("shampoo").state_numel((51200, 5120), s) * 4
    assert 6 * 2**30 < bytes_fc1 < 7 * 2**30 and math.isfinite(bytes_fc1)

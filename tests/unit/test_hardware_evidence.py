"""Hardware files with their evidence: every number a spec-derived GPU file (``hardware/*.yaml``)
rests on is labelled datasheet, published (with its source) or assumption, and each file is what
`spec_hardware` regenerates (issue 28, item 4). The rules: the docstring of canzona.hardware."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import yaml

import canzona.hardware as hardware
from canzona.errors import ConfigError
from canzona.hardware import (
    EFFICIENCY,
    EVIDENCE_LABELS,
    HARDWARE_DIR,
    SPECS,
    Hardware,
    evidence,
    input_numbers,
    load_hardware,
    spec_file_text,
    spec_hardware,
    unlabelled,
)


def spec_files() -> dict[str, dict[str, Any]]:
    """The committed spec-derived files (a calibrated hardware/local.yaml is measured: no labels)."""
    out = {}
    for path in sorted(HARDWARE_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and data.get("source") == "spec-derived":
            out[path.stem] = data
    return out


def numbers(node: Any, path: str = "") -> dict[str, float]:
    """Every number of a (nested) mapping by dotted path."""
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in numbers(sub, f"{path}.{key}" if path else key).items()}
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return {path: node}
    return {}


def test_every_spec_in_the_generator_has_its_file_and_back() -> None:
    assert set(spec_files()) == set(SPECS)
    assert {"h100", "h200", "a100", "b200", "gb200", "gb300"} <= set(SPECS)


@pytest.mark.parametrize("key", sorted(SPECS))
def test_the_committed_file_is_the_generator_output(key: str) -> None:
    """Byte for byte: header, key order and line width included."""
    committed = (HARDWARE_DIR / f"{key}.yaml").read_text()
    assert committed == spec_file_text(key), (
        f"hardware/{key}.yaml drifted from spec_hardware('{key}'): "
        f"python -c \"from canzona.hardware import write_spec_file; write_spec_file('{key}')\"")
    assert yaml.safe_load(committed) == spec_hardware(key)


@pytest.mark.parametrize("key", sorted(SPECS))
def test_every_input_number_carries_a_label(key: str) -> None:
    data = spec_files()[key]
    inputs = data["inputs"]
    prov = inputs["provenance"]
    assert input_numbers(data), "no input numbers found"
    assert unlabelled(data) == []
    for name, entry in prov.items():
        label, source = evidence(entry)
        assert label in EVIDENCE_LABELS, f"{key}: {name} is labelled {label!r}"
        if label == "published":
            assert isinstance(entry, dict) and source, f"{key}: {name} is published but names no source"
        if label == "datasheet":
            assert inputs["sources"], f"{key}: {name} cites a datasheet, but the file quotes none"
    assert inputs["fitted_on"] == [], "a fitted file names its points and labels the fitted numbers published"
    # what the issue asks to be said plainly: efficiencies and latencies are assumptions
    for name in [k for k in prov if k.startswith("efficiency.") or k.endswith("latency_s") or k == "launch_s"]:
        assert evidence(prov[name])[0] == "assumption", f"{key}: {name}"


@pytest.mark.parametrize("key", sorted(SPECS))
def test_numbers_no_input_moves_are_labelled_too(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A number outside ``inputs`` is derived (it moves when the inputs move) or carries a label
    of its own (topology.ranks_per_node, the model passes' fixed times, ...)."""
    base = numbers({k: v for k, v in spec_hardware(key).items() if k != "inputs"})
    s = SPECS[key]
    moved = replace(s, bf16_tflops=s.bf16_tflops * 1.1, fp32_tflops=s.fp32_tflops * 1.1, hbm_TBps=s.hbm_TBps * 1.1,
                    nvlink_GBps=s.nvlink_GBps * 1.1, network_GBps=s.network_GBps * 1.1,
                    nvlink_latency_s=s.nvlink_latency_s * 1.1, network_latency_s=s.network_latency_s * 1.1,
                    launch_s=s.launch_s * 1.1)
    monkeypatch.setitem(SPECS, key, moved)
    monkeypatch.setattr(hardware, "EFFICIENCY", {k: v * 0.9 for k, v in EFFICIENCY.items()})
    after = numbers({k: v for k, v in spec_hardware(key).items() if k != "inputs"})
    constants = {k for k, v in base.items() if after[k] == v}
    prov = spec_files()[key]["inputs"]["provenance"]
    assert constants - set(prov) == set(), "constants without a provenance label"
    assert "topology.ranks_per_node" in constants and "model.forward.fixed_s" in constants


def test_the_blackwell_files_use_dense_datasheet_peaks_and_nvlink5() -> None:
    """Dense (one half of the sparse tensor figures the datasheets print), per GPU."""
    assert SPECS["b200"].bf16_tflops == 36_000 / 2 / 8 and SPECS["b200"].fp32_tflops == 600 / 8
    assert SPECS["gb200"].bf16_tflops == 360_000 / 2 / 72 and SPECS["gb200"].fp32_tflops == 5760 / 72
    assert SPECS["gb200"].hbm_TBps == 576 / 72 and SPECS["gb300"].hbm_TBps == 576 / 72
    assert SPECS["gb300"].bf16_tflops == 5000 / 2
    for key in ("b200", "gb200", "gb300"):
        assert SPECS[key].nvlink_GBps == 1800 / 2  # NVLink 5: 1.8 TB/s bidirectional per GPU
    assert SPECS["gb200"].ranks_per_node == SPECS["gb300"].ranks_per_node == 72 and SPECS["b200"].ranks_per_node == 8
    for key in ("gb200", "gb300"):  # no NVL72 datasheet gives a NIC per GPU
        assert evidence(spec_files()[key]["inputs"]["provenance"]["network_GBps_per_gpu"])[0] == "assumption"
    # an NVL72 group of 64 ranks stays on NVLink; a DGX-style one crosses the network
    assert load_hardware("gb200").level(list(range(64))) == "intra" and load_hardware("b200").level(list(range(64))) == "inter"


def test_calibrate_matches_a_blackwell_device_to_its_own_spec() -> None:
    from canzona.calibrate.build import match_spec
    from canzona.calibrate.settings import parse_args

    opts = parse_args(["out=x.yaml"])
    assert match_spec(opts, "NVIDIA GB200") == "gb200" and match_spec(opts, "NVIDIA GB300") == "gb300"
    assert match_spec(opts, "NVIDIA B200") == "b200"


def test_labels_leave_the_fingerprint_and_the_rates_alone() -> None:
    """Provenance says where a number comes from, not what it is: a file without its labels
    projects the same and has the same fingerprint (projections made before stay current)."""
    for key in ("h100", "gb200"):
        data = spec_hardware(key)
        bare = copy.deepcopy(data)
        del bare["inputs"]["provenance"], bare["inputs"]["fitted_on"]
        assert Hardware(data).fingerprint == Hardware(bare).fingerprint
        assert Hardware(data).inputs()["rates"] == Hardware(bare).inputs()["rates"]
        assert load_hardware(key).inputs()["inputs"]["provenance"] == data["inputs"]["provenance"]  # reports show it
        data["inputs"]["peak_bf16_tflops"] *= 2
        assert Hardware(data).fingerprint != Hardware(bare).fingerprint


@pytest.mark.parametrize("entry, fitted, match", [
    ("measured", [], "labelled 'measured'"),
    ("published", [], "published but names no source"),
    ({"label": "published"}, [], "published but names no source"),
    ("datasheet", ["pt-1"], "no number is labelled published"),
    ("datasheet", "pt-1", "must be a list"),
])
def test_load_refuses_malformed_evidence(entry: Any, fitted: Any, match: str) -> None:
    data = spec_hardware("h100")
    data["inputs"]["provenance"]["efficiency.model_mfu"] = entry
    data["inputs"]["fitted_on"] = fitted
    with pytest.raises(ConfigError, match=match):
        Hardware(data)


def test_a_published_number_with_its_source_loads_and_a_stray_label_is_found() -> None:
    data = spec_hardware("h100")
    data["inputs"]["provenance"]["efficiency.model_mfu"] = {"label": "published", "source": "a paper, table 3"}
    data["inputs"]["fitted_on"] = ["paper-t3-row1"]
    Hardware(data)
    data["inputs"]["provenance"]["efficiency.nonexistent"] = "assumption"
    del data["inputs"]["provenance"]["hbm_TBps"]
    assert unlabelled(data) == ["hbm_TBps: no provenance label", "efficiency.nonexistent: labelled, but no such number"]

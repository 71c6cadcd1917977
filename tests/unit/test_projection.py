"""cluster=simulate sweeps and the report's two simulator sections (analysis/projection.py).

- A projection of the paper profile (a slice of it here; the whole of it in
  tests/e2e/test_projection_e2e.py) runs through ``sweeps/run.py``'s code, records each trial
  as projected, resumes, re-projects when the hardware file's content changes, and its report has a
  labelled "Projected (not measured)" section with the paper's claims and the hardware's inputs.
- A measured sweep's report has a "Predicted vs measured" section whose numbers are
  `canzona.sim.validate.compare_sweep`'s, lists the trials left out and why, keeps projected
  trials out of the measured tables, and survives a simulator that raises.
"""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from analysis.report import build_report
from canzona.config import load_config
from canzona.hardware import spec_hardware
from canzona.sim.claims import PAPER_CLAIMS
from canzona.sim.simulate import project, write_trial
from canzona.sim.validate import compare_sweep
from canzona.sweep.cli import main

REPO = Path(__file__).resolve().parents[2]
# a slice of the paper profile: Qwen3-0.6B on 8 and on 256 GPUs, every method, Muon
PAPER_SLICE = ["sweep=qwen3_scaling", "profile=paper", "cluster=simulate", "size=0.6b",
               "layout=n1-dp8tp1,n32-dp32tp8", "optimizer.name=muon"]


class Page(HTMLParser):
    """Elements by id, every element's attributes, and the text inside each id'd element."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[dict] = []
        self.ids: dict[str, dict] = {}
        self._open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, **dict(attrs), "text": ""}
        self.elements.append(el)
        if el.get("id"):
            self.ids[el["id"]] = el
        if tag not in ("br", "img", "meta", "link", "input", "hr"):
            self._open.append(el)

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for el in self._open:
            el["text"] += data

    def having(self, attr: str, **match: str) -> list[dict]:
        return [e for e in self.elements if attr in e and all(e.get(k) == v for k, v in match.items())]


def _run(argv: list[str]) -> tuple[int, list[str]]:
    out = io.StringIO()
    rc = main(argv, stream=out)
    return rc, out.getvalue().splitlines()


# ----------------------------------------------------------------------------- cluster=simulate


def test_simulate_sweep_projects_records_and_reports(tmp_path: Path) -> None:
    rc, lines = _run([*PAPER_SLICE, f"results={tmp_path}", "sim.workers=2"])
    assert rc == 0, "\n".join(lines)
    rd = tmp_path / "qwen3_scaling-paper-sim-h100"  # never the measured results/qwen3_scaling/
    index = Path(lines[-1])
    assert index == rd / "report" / "index.html" and index.is_file()
    trials = sorted(d for d in rd.iterdir() if (d / "status.json").is_file())
    assert len(trials) == 8  # 4 methods x 2 layouts
    summaries = {}
    for d in trials:
        st = json.loads((d / "status.json").read_text())
        assert st["status"] == "done" and st["projected"] is True and st["cluster"] == "simulate"
        assert st["sim_hardware"] == "h100" and st["sim_hardware_source"] == "spec-derived"
        s = json.loads((d / "summary.json").read_text())
        assert s["projected"] is True and s["hardware"]["name"] == "h100" and s["assumptions"]
        assert s["config"]["train"]["seq_len"] == 4096  # the paper profile's setting
        summaries[(s["config"]["method"]["name"], s["world"]["world_size"])] = s
    manifest = json.loads((rd / "sweep.json").read_text())
    assert manifest["projected"] is True and manifest["sim_hardware"]["name"] == "h100"
    assert yaml.safe_load((rd / "hardware.yaml").read_text())["name"] == "h100"

    page = Page(index.read_text())
    assert "projected" in page.ids and "projected-banner" in page.ids
    assert "Projected (not measured)" in page.ids["projected"]["text"]
    assert "headline" not in page.ids and "latencies" not in page.ids  # no measured tables at all
    # the paper's claims beside the projection at the most GPUs (256) for the largest model
    rows = page.having("data-claim-metric")
    assert {r["data-claim-baseline"] for r in rows} == {"sync", "layerwise"}
    for r in rows:  # the paper's figure beside every baseline, the metric's own
        key = "iteration_speedup" if r["data-claim-metric"] == "iteration_ms" else "optimizer_step_speedup"
        assert f"{PAPER_CLAIMS[key]}×" in r["text"]
    assert {float(c["data-paper"]) for c in page.having("data-paper")} == {
        PAPER_CLAIMS["iteration_speedup"], PAPER_CLAIMS["optimizer_step_speedup"]}
    assert PAPER_CLAIMS["setting"] in page.ids["projected-claims"]["text"]
    can, sync = summaries[("canzona", 256)], summaries[("sync", 256)]
    rows = {(r["data-claim-baseline"], r["data-claim-metric"]): r for r in page.having("data-claim-baseline")}
    for m in ("iteration_ms", "optimizer_step_ms"):
        cell = [e for e in page.having("data-layout") if e["data-layout"] == "dp 32 × tp 8"
                and e in _inside(page, rows[("sync", m)])]
        assert len(cell) == 1 and float(cell[0]["data-value"]) == pytest.approx(sync[m] / can[m], rel=1e-12)
    # the error bar: the published GPU runs' band, this report's hardware file's part of it, and
    # each claim's projected ratio widened by the published pairs' ratio error
    from canzona.sim.published import band, project_points

    b = band(project_points())
    assert f"{b['points']} published runs" in page.ids["published-band"]["text"]
    h100 = page.having("data-band-hardware")[0]
    assert h100["data-band-hardware"] == "h100"
    assert float(h100["data-band-min"]) == pytest.approx(b["by_hardware"]["h100"]["min"])
    assert float(h100["data-band-max"]) == pytest.approx(b["by_hardware"]["h100"]["max"])
    for cell in page.having("data-band-low"):
        assert float(cell["data-band-low"]) <= float(cell["data-band-high"])
    cells = [e for e in page.having("data-layout") if e["data-layout"] == "dp 32 × tp 8"]
    bands = page.having("data-band-low")
    assert len(bands) == len(page.having("data-layout")) and b["ratios"]["points"] >= 3
    value, low = float(cells[0]["data-value"]), float(bands[page.having("data-layout").index(cells[0])]["data-band-low"])
    assert low == pytest.approx(value / b["ratios"]["max"])
    # every projected ratio in the per-point table is baseline / canzona from the records
    for b in ("sync", "layerwise"):
        for m in ("iteration_ms", "optimizer_step_ms"):
            ratios = page.having("data-proj", **{"data-baseline": b, "data-metric": m})
            assert sorted(float(e["data-value"]) for e in ratios) == pytest.approx(sorted(
                summaries[(b, w)][m] / summaries[("canzona", w)][m] for w in (8, 256)), rel=1e-12)
    # where canzona does not lead: exactly the ratios below 1 of the table (adamw's is an overhead)
    want = sorted((b, m, summaries[(b, w)][m] / summaries[("canzona", w)][m]) for b in ("sync", "layerwise")
                  for m in ("iteration_ms", "optimizer_step_ms") for w in (8, 256)
                  if summaries[(b, w)][m] < summaries[("canzona", w)][m])
    behind = [e for e in page.having("data-behind") if e["data-behind"] != "none"]
    got = sorted((e["data-baseline"], e["data-metric"], float(e["data-value"])) for e in behind)
    assert [g[:2] for g in got] == [x[:2] for x in want]
    assert [g[2] for g in got] == pytest.approx([x[2] for x in want], rel=1e-12)
    assert bool(page.having("data-behind", **{"data-behind": "none"})) == (not want)
    adamw = page.having("data-proj", **{"data-baseline": "adamw", "data-metric": "optimizer_step_ms"})
    assert sorted(float(e["data-value"]) for e in adamw) == pytest.approx(sorted(
        summaries[("canzona", w)]["optimizer_step_ms"] / summaries[("adamw", w)]["optimizer_step_ms"] for w in (8, 256)))
    # the inputs: hardware name, source, stated inputs and the assumptions
    assert page.having("data-field", **{"data-field": "hardware-name"})[0]["text"] == "h100"
    assert page.having("data-field", **{"data-field": "hardware-source"})[0]["text"] == "spec-derived"
    stated = page.having("class", **{"class": "hardware-inputs"})[0]["text"]
    assert "peak_bf16_tflops: 989.4" in stated and "model_mfu" in stated and "sources" in stated
    listed = page.ids["projected-assumptions"]["text"]
    for a in can["assumptions"]:
        assert a in listed
    assert "recomputes it" in page.ids["sync-note"]["text"]
    assert "train.seq_len4096" in page.ids["projected-settings"]["text"]  # the profile's fixed settings
    # trials.csv marks them; projected.csv holds the ratios
    csv = (index.parent / "trials.csv").read_text().splitlines()
    assert "projected" in csv[0].split(",") and len(csv) == 9
    assert (index.parent / "projected.csv").is_file() and not (index.parent / "speedups.csv").exists()

    # resume: nothing to project, nothing rewritten
    before = {d.name: (d / "summary.json").stat().st_mtime_ns for d in trials}
    rc, lines = _run([*PAPER_SLICE, f"results={tmp_path}"])
    assert rc == 0 and any("0 to project, 8 skipped" in line for line in lines)
    assert {d.name: (d / "summary.json").stat().st_mtime_ns for d in trials} == before
    assert Path(lines[-1]) == index


def _inside(page: Page, row: dict) -> list[dict]:
    """Elements that come after `row` and before the next element of the same tag."""
    i = page.elements.index(row)
    out = []
    for e in page.elements[i + 1:]:
        if e["tag"] == row["tag"]:
            break
        out.append(e)
    return out


def test_simulate_reprojects_when_the_hardware_content_changes(tmp_path: Path) -> None:
    hw = tmp_path / "mygpu.yaml"
    data = spec_hardware("a100")
    data["name"] = "mygpu"
    hw.write_text(yaml.safe_dump(data))
    argv = ["sweep=qwen3_scaling", "profile=paper", "cluster=simulate", "size=0.6b", "layout=n1-dp8tp1",
            "method=canzona,sync", f"sim.hardware={hw}", "sim.workers=1", f"results={tmp_path / 'r'}"]
    rc, lines = _run(argv)
    assert rc == 0
    rd = tmp_path / "r" / "qwen3_scaling-paper-sim-mygpu"
    first = {d.name: json.loads((d / "summary.json").read_text())["iteration_ms"]
             for d in rd.iterdir() if (d / "summary.json").is_file()}
    assert len(first) == 2
    data["model"]["forward"]["flops_per_s"] /= 2  # a slower model pass: every iteration grows
    hw.write_text(yaml.safe_dump(data))
    rc, lines = _run(argv)
    assert rc == 0 and any("2 to project" in line for line in lines)
    assert any("another content of hardware mygpu" in line for line in lines)
    second = {d: json.loads((rd / d / "summary.json").read_text())["iteration_ms"] for d in first}
    assert all(second[d] > first[d] for d in first)


def _as_written_before_the_rename(trial: Path) -> None:
    """Rewrite a projected trial's records as they were written before ``profile`` (the hardware
    description) became ``hardware``."""
    def old_config(c: dict) -> dict:
        c["canzona"] = c.pop("planner")  # the planner's settings were under canzona.*
        c["canzona"]["cost_profile"] = c["canzona"].pop("cost_hardware")
        c["canzona"]["measured_profile"] = c["canzona"].pop("measured_table")
        return c

    s = json.loads((trial / "summary.json").read_text())
    s["profile"], s["profile_inputs"] = s.pop("hardware"), s.pop("hardware_inputs")
    s["versions"]["profile"] = s["versions"].pop("hardware")
    s["config"] = old_config(s["config"])
    (trial / "summary.json").write_text(json.dumps(s))
    (trial / "config.yaml").write_text(yaml.safe_dump(old_config(yaml.safe_load((trial / "config.yaml").read_text()))))
    st = json.loads((trial / "status.json").read_text())
    for k in ("sim_hardware", "sim_hardware_source", "sim_hardware_path"):
        st[k.replace("hardware", "profile")] = st.pop(k)
    st["profile_fingerprint"] = st.pop("hardware_fingerprint")
    (trial / "status.json").write_text(json.dumps(st))


def test_a_projection_recorded_before_the_rename_resumes_and_reports(tmp_path: Path) -> None:
    """A results folder written before the rename (summary.json's ``profile`` block, config.yaml's
    ``canzona.cost_profile``, the folder's profile.yaml) is read as a new one: the same command
    finds the same trial ids done, reads the hardware's fingerprint from the old block (a changed
    one re-projects that trial, under the new names only) and reports the hardware."""
    from analysis.load import load_sweep

    argv = ["sweep=qwen3_scaling", "profile=paper", "cluster=simulate", "size=0.6b", "layout=n1-dp8tp1",
            "method=canzona,sync", "sim.workers=1", f"results={tmp_path}"]
    assert _run(argv)[0] == 0
    rd = tmp_path / "qwen3_scaling-paper-sim-h100"
    trials = sorted(d for d in rd.iterdir() if (d / "summary.json").is_file())
    for d in trials:
        _as_written_before_the_rename(d)
    (rd / "hardware.yaml").rename(rd / "profile.yaml")
    sweep = load_sweep(rd)  # read under today's names
    t = sweep.trials[0]
    assert t.summary["hardware"]["name"] == "h100" and "profile" not in t.summary
    assert t.summary["hardware_inputs"]["rates"] and t.summary["versions"]["hardware"] == "h100"
    assert t.config["planner"]["cost_hardware"] == "h100" and "canzona" not in t.config
    assert t.summary["config"]["planner"]["cost_hardware"] == "h100"

    rc, lines = _run(argv)
    assert rc == 0 and "2 trials, 0 to project, 2 skipped" in lines[0]  # same ids, same fingerprint
    assert not (rd / "profile.yaml").exists() and (rd / "hardware.yaml").is_file()
    page = Page(Path(lines[-1]).read_text())
    assert page.having("data-field", **{"data-field": "hardware-name"})[0]["text"] == "h100"
    assert "peak_bf16_tflops" in page.having("class", **{"class": "hardware-inputs"})[0]["text"]
    assert "profile" in json.loads((trials[0] / "summary.json").read_text())  # skipped: left as it was

    old = json.loads((trials[0] / "summary.json").read_text())
    old["profile"]["fingerprint"] = "another"
    (trials[0] / "summary.json").write_text(json.dumps(old))
    rc, lines = _run(argv)
    assert rc == 0 and "1 to project, 1 skipped" in lines[0]
    assert any("1 trial(s) were projected with another content of hardware h100" in line for line in lines)
    new = json.loads((trials[0] / "summary.json").read_text())
    assert new["hardware"]["name"] == "h100" and not {"profile", "profile_inputs"} & set(new)
    assert "cost_hardware" in yaml.safe_load((trials[0] / "config.yaml").read_text())["planner"]


def test_simulate_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["sweep=qwen3_scaling", "cluster=nope", f"results={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "local, debug, slurm, simulate" in err
    assert main(["sweep=qwen3_scaling", "cluster=simulate", "sim.hardware=nosuch", f"results={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "sim.hardware=nosuch" in err and "h100" in err
    assert main(["sweep=qwen3_scaling", "cluster=simulate", "sim.workers=-1", f"results={tmp_path}"]) == 2
    assert not any(tmp_path.iterdir())


def test_simulate_dry_run_writes_nothing_and_ignores_local_rank_caps(tmp_path: Path) -> None:
    rc, lines = _run(["sweep=qwen3_scaling", "profile=paper_projection", "list=true", f"results={tmp_path}"])
    assert rc == 0 and "180 trials, 180 to project" in lines[0] and "sim-h100" in lines[0]
    assert not any(tmp_path.iterdir())


def test_a_failing_projection_is_recorded_and_the_sweep_goes_on(tmp_path: Path, monkeypatch) -> None:
    import canzona.sim.simulate as sim

    real = sim.write_trial

    def flaky(cfg, hardware, out):
        if cfg.method.label == "sync":
            raise RuntimeError("simulated failure")
        return real(cfg, hardware, out)

    monkeypatch.setattr(sim, "write_trial", flaky)
    rc, lines = _run(["sweep=qwen3_scaling", "profile=paper", "cluster=simulate", "size=0.6b", "layout=n1-dp8tp1",
                      "method=canzona,sync", "sim.workers=1", f"results={tmp_path}"])
    assert rc == 1
    assert any("FAILED" in line and "RuntimeError: simulated failure" in line for line in lines)
    assert Path(lines[-1]).is_file()  # the report still renders
    states = {json.loads(p.read_text())["status"] for p in tmp_path.rglob("status.json")}
    assert states == {"done", "failed"}


def test_ctrl_c_marks_the_running_projection_interrupted_and_a_rerun_resumes(tmp_path: Path, monkeypatch) -> None:
    import canzona.sim.simulate as sim

    real = sim.write_trial
    calls: list[str] = []

    def interrupted(cfg, profile, out):
        calls.append(cfg.method.label)
        if len(calls) == 2:  # Ctrl-C while the second trial is projected
            raise KeyboardInterrupt
        return real(cfg, profile, out)

    monkeypatch.setattr(sim, "write_trial", interrupted)
    argv = ["sweep=qwen3_scaling", "profile=paper", "cluster=simulate", "size=0.6b", "layout=n1-dp8tp1",
            "method=canzona,sync,layerwise", "sim.workers=1", f"results={tmp_path}"]
    rc, lines = _run(argv)
    assert rc == 130 and len(calls) == 2
    assert lines[-1] == "[sweep] interrupted: stopped 1 running trial(s); rerun the same command to resume"
    statuses = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.rglob("status.json")}
    assert sorted(st["status"] for st in statuses.values()) == ["done", "failed"]  # the third never started
    (failed,) = [st for st in statuses.values() if st["status"] == "failed"]
    assert failed["error"] == "interrupted (sweep stopped by the user)" and failed["ended"]

    monkeypatch.setattr(sim, "write_trial", real)
    rc, lines = _run(argv)
    assert rc == 0 and "3 trials, 2 to project, 1 skipped" in lines[0]
    assert {json.loads(p.read_text())["status"] for p in tmp_path.rglob("status.json")} == {"done"}


# ----------------------------------------------------------------------------- predicted vs measured


def _measured_trial(root: Path, name: str, overrides: list[str], factor: float, hardware: dict) -> Path:
    """A trial folder that looks measured: the projection on `hardware` times `factor`."""
    cfg = load_config(["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1", "dist.device=cpu",
                       *overrides])
    res = project(cfg, hardware, events="none")
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({**cfg.to_dict(), "out": str(d)}))
    summary = {f"{k}_{q}": res[k] * factor for k in ("iteration_ms", "optimizer_step_ms", "param_sync_ms",
                                                      "grad_reduce_ms") for q in ("median", "p10", "p90")}
    summary.update(world=res["world"], config=cfg.to_dict())
    (d / "summary.json").write_text(json.dumps(summary))
    rows = [{**r, "step": s, "measured": s > 0, **{k: v * factor for k, v in r.items() if k.endswith("_ms")}}
            for s in range(3) for r in res["steps"]]
    (d / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "status.json").write_text(json.dumps({"status": "done"}))
    return d


def slow_hardware() -> dict:
    """A100's spec-derived hardware slowed 10^4 times: the tiny model's steps last milliseconds, above
    the 0.5 ms under which validate gives no error figure."""
    hw = spec_hardware("a100")
    hw["name"] = "slow"
    for k in hw["compute"]["matmul_flops_per_s"]:
        hw["compute"]["matmul_flops_per_s"][k] /= 1e4
    for k in ("eigh_flops_per_s", "memory_bytes_per_s"):
        hw["compute"][k] /= 1e4
    for k in ("adamw_seconds_per_element", "apply_seconds_per_element", "copy_seconds_per_byte"):
        hw[k] *= 1e4
    for ph in ("forward", "backward"):
        hw["model"][ph]["flops_per_s"] /= 1e4
    for level in hw["collectives"].values():
        for link in level.values():
            link["bandwidth_Bps"] /= 1e4
    return hw


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, dict]:
    """Measured trials (two per method, different errors), one that cannot be simulated, one
    failed, and one projected trial in the same folder."""
    hw = slow_hardware()
    root = tmp_path_factory.mktemp("mixed") / "sweep"
    for i, (method, f1, f2) in enumerate((("canzona", 1.25, 0.9), ("sync", 0.5, 1.1), ("layerwise", 1.0, 2.0))):
        _measured_trial(root, f"m{i}a-{method}", [f"method={method}", "parallel.dp=2"], f1, hw)
        _measured_trial(root, f"m{i}b-{method}", [f"method={method}", "parallel.dp=2", "parallel.tp=2"], f2, hw)
    bad = root / "m9-bad"
    bad.mkdir()
    (bad / "config.yaml").write_text("method: nope\n")
    (bad / "summary.json").write_text(json.dumps({"iteration_ms_median": 1.0}))
    (bad / "status.json").write_text(json.dumps({"status": "done"}))
    failed = root / "m8-failed"
    failed.mkdir()
    (failed / "config.yaml").write_text(yaml.safe_dump({"method": "sync"}))
    (failed / "status.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    cfg = load_config(["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=1", "method=canzona",
                       "parallel.dp=2"])
    write_trial(cfg, spec_hardware("h100"), root / "p0-projected")
    return root, hw


def test_predicted_vs_measured_numbers_are_compare_sweeps(mixed, tmp_path: Path) -> None:
    root, hw = mixed
    index = build_report(root, out=tmp_path / "rep", hardware=hw)
    want = compare_sweep(root, hw)
    # the hardware it predicted with is kept beside the report, and predicts the same again
    kept = tmp_path / "rep" / "hardware.yaml"
    assert yaml.safe_load(kept.read_text()) == hw
    assert compare_sweep(root, kept)["overall"] == want["overall"]
    assert {r["trial"] for r in want["trials"]} == {f"m{i}{x}-{m}" for i, m in enumerate(("canzona", "sync", "layerwise"))
                                                   for x in "ab"}  # the projection is not a measurement
    page = Page(index.read_text())
    assert "predicted" in page.ids and "predicted-errors" in page.ids
    cells = page.having("data-pv-field")
    expected = {m["method"]: m for m in want["by_method"]} | {"all": want["overall"]}
    seen = set()
    for c in cells:
        stats = expected[c["data-pv-method"]]
        assert float(c["data-value"]) == pytest.approx(stats[c["data-pv-field"]], rel=1e-12)
        assert c["text"] == f"{stats[c['data-pv-field']]:.1f}%"
        seen.add((c["data-pv-method"], c["data-pv-field"]))
    for method in ("canzona", "sync", "layerwise", "all"):
        for metric in ("optimizer_step_ms", "iteration_ms"):
            assert (method, f"{metric}_median_abs_error_pct") in seen and (method, f"{metric}_worst_abs_error_pct") in seen
    # hand-checkable: sync's trials measured 0.5x and 1.1x the prediction -> errors +100% and
    # -9.09%: median |error| 54.5%, worst 100%
    sync = expected["sync"]
    assert sync["optimizer_step_ms_median_abs_error_pct"] == pytest.approx((100.0 + 100.0 / 11) / 2)
    assert sync["optimizer_step_ms_worst_abs_error_pct"] == pytest.approx(100.0)
    # the trials left out, and why
    left = page.ids["predicted-left-out"]["text"]
    assert "m9-bad" in left and "could not simulate" in left
    assert "m8-failed" in left and "status failed" in left
    assert "p0-projected" not in left and "p0-projected" not in page.ids["predicted-trials"]["text"]
    # the projected trial has its section; the measured headline holds measured trials only
    assert "projected" in page.ids and "p0-projected" not in page.ids["headline"]["text"]
    assert page.having("data-pv-trial", **{"data-pv-trial": "m0a-canzona"})
    assert (index.parent / "predicted.csv").is_file()
    # each trial's phases, the mean over its ranks, as compare_sweep's per-trial rows have them
    phase_cells = page.having("data-pv-phase")
    per_trial = {t["trial"]: t["phases"] for t in want["per_trial"]["trials"]}
    assert {c["data-pv-phase"].split("/")[0] for c in phase_cells} == set(per_trial)
    for c in phase_cells:
        trial, phase = c["data-pv-phase"].split("/")
        assert float(c["data-predicted"]) == pytest.approx(per_trial[trial][phase]["predicted_mean"], rel=1e-12)
        assert float(c["data-measured"]) == pytest.approx(per_trial[trial][phase]["measured_mean"], rel=1e-12)
    assert any(c["data-pv-phase"].endswith("/compute") for c in phase_cells)
    # rebuilt with the copy it kept: predicted again, the copy kept (an input, not a stale output)
    again = Page(build_report(root, out=tmp_path / "rep", hardware=kept).read_text())
    assert "predicted-errors" in again.ids and "predicted-error" not in again.ids
    assert yaml.safe_load(kept.read_text()) == hw


def test_the_report_shows_the_sweep_speed_figures(tmp_path: Path) -> None:
    """Runs that recorded speed probes: the report gives the sweep's one factor and, per method,
    the errors at that speed -- compare_sweep's numbers -- with their own verdict."""
    hw = {**slow_hardware(), "calibration": {"speed_probe_flops_per_s": 90e9}}
    root = tmp_path / "sweep"
    for name, method, factor, probe in (("s1", "canzona", 1.5, 60e9), ("s2", "sync", 1.4, 60e9),
                                         ("s3", "sync", 1.6, 45e9)):
        d = _measured_trial(root, name, [f"method={method}", "parallel.dp=2"], factor, hw)
        summary = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**summary, "speed_probe_flops_per_s": probe}))
    want = compare_sweep(root, hw)["per_trial"]
    assert want["sweep_speed_factor"] == pytest.approx(1.5)  # factors 1.5, 1.5, 2
    page = Page(build_report(root, out=tmp_path / "rep", hardware=hw).read_text())
    assert float(page.ids["predicted-sweep-speed-factor"]["data-value"]) == pytest.approx(1.5)
    verdict = page.ids["predicted-goal-sweep-speed-verdict"]
    assert verdict["data-goal-met"] == str(want["goal_met_sweep_speed"]).lower() == "true"
    assert page.ids["predicted-goal-verdict"]["data-goal-met"] == "false"  # raw: canzona -33 %
    by = {m["method"]: m for m in want["by_method"]}
    sync = page.having("data-pv-sweep-speed", **{"data-pv-sweep-speed": "sync"})[0]
    assert "sync" in sync["text"]
    cells = [e for e in page.elements if e.get("data-value") is not None and e["tag"] == "td"]
    values = {float(c["data-value"]) for c in cells if c["data-value"] not in ("None", "")}
    # sync measured 1.4x and 1.6x its prediction: at 1.5x, +7.1 % and -6.25 %
    assert by["sync"]["optimizer_step_ms_sweep_speed_worst_abs_error_pct"] == pytest.approx(100 * (1.5 / 1.4 - 1))
    assert any(v == pytest.approx(by["sync"]["optimizer_step_ms_sweep_speed_worst_abs_error_pct"]) for v in values)


def test_predicted_section_survives_the_simulator(mixed, tmp_path: Path, monkeypatch) -> None:
    from analysis.load import load_sweep
    from analysis.projection import predicted_section

    root, _ = mixed
    sweep = load_sweep(root)
    sec = predicted_section(sweep, {t.trial_id for t in sweep.trials}, tmp_path / "missing.yaml")
    assert sec["result"] is None and "not found" in sec["error"]

    import canzona.sim.validate as validate

    def boom(*a, **k):
        raise ZeroDivisionError("inside the simulator")

    monkeypatch.setattr(validate, "compare_sweep", boom)
    page = Page(build_report(root, out=tmp_path / "b", hardware="h100").read_text())
    assert "ZeroDivisionError: inside the simulator" in page.ids["predicted-error"]["text"]
    assert "headline" in page.ids  # the measured part is intact


def test_without_hardware_the_section_says_how_to_make_one(mixed, tmp_path: Path, monkeypatch) -> None:
    root, _ = mixed
    monkeypatch.setattr("canzona.hardware.LOCAL_FILE", tmp_path / "no-local.yaml")
    monkeypatch.setattr("canzona.hardware.BEFORE_RENAME_DIR", tmp_path / "no-profiles")
    page = Page(build_report(root, out=tmp_path / "r").read_text())  # hardware="auto", nothing there
    assert "python -m canzona.calibrate out=hardware/local.yaml" in page.ids["predicted-missing"]["text"]
    from analysis.projection import resolve_hardware

    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump(spec_hardware("a100")))
    monkeypatch.setattr("canzona.hardware.LOCAL_FILE", local)
    assert resolve_hardware("auto") == str(local)  # auto picks it up once it exists
    assert resolve_hardware("none") is None and resolve_hardware(None) is None and resolve_hardware("h100") == "h100"


def test_the_sweep_runner_passes_the_hardware_to_the_report(tmp_path: Path, monkeypatch) -> None:
    from canzona.sweep import cli

    got = {}

    def fake(sweep_dir, out=None, hardware="auto"):
        got["hardware"] = hardware
        return Path(sweep_dir) / "report" / "index.html"

    monkeypatch.setattr("analysis.report.build_report", fake)
    assert cli.build_report(tmp_path, io.StringIO(), hardware="/x/local.yaml") == 0
    assert got["hardware"] == "/x/local.yaml"
    from canzona.sweep.expand import expand_sweep

    plan = expand_sweep(["sweep=qwen3_scaling", "sim.hardware=h200", "list=true"])
    assert plan.sim_hardware == "h200" and plan.results_dir.name == "qwen3_scaling"
    local = REPO / "hardware" / "local.yaml"
    plan = expand_sweep(["sweep=qwen3_scaling", "list=true"])
    assert plan.sim_hardware == (str(local) if local.is_file() else None)


# ----------------------------------------------------------------------------- the authors' ladder


def test_ladder_projection_reports_every_rung_its_dry_run_and_what_each_feature_removes(tmp_path: Path) -> None:
    """profile=ablation_projection at one point (Qwen3-8B cut to 4 layers, DP 32 x TP 8): the
    claims set canzona against every rung with the paper's figures beside each, a baseline whose
    dry run ran out of memory is labelled so (a dry-run folder written here as cluster=dryrun
    writes it), and the ladder table's "removes" is the rung before minus the rung."""
    from analysis.report import fmt

    argv = ["sweep=qwen3_scaling", "profile=ablation_projection", "size=8b", "layout=n32-dp32tp8",
            "model.num_layers=4", f"results={tmp_path}", "sim.workers=2"]
    rc, lines = _run(argv)
    assert rc == 0, "\n".join(lines)
    rd = tmp_path / "qwen3_scaling-ablation_projection-sim-h100"
    summaries = {d.name.split("-")[1]: (d.name, json.loads((d / "summary.json").read_text()))
                 for d in rd.iterdir() if (d / "summary.json").is_file()}
    assert set(summaries) == {"sync", "atomic", "zero1_atomic+async", "balanced+async",
                              "zero1_atomic+async_balanced", "canzona", "layerwise", "layerwise_sharded",
                              "layerwise_sharded_ns", "layerwise_sharded_gram", "adamw"}
    dry = tmp_path / "qwen3_scaling-ablation_projection-dryrun"
    for method, (tid, _) in summaries.items():
        if method in ("sync", "atomic"):
            (dry / tid).mkdir(parents=True)
            oom = method == "sync"
            (dry / tid / "status.json").write_text(json.dumps({
                "status": "failed" if oom else "done",
                "error": "rank 0 (dp 0, tp 0) would run out of memory: peak 174.00 GiB in backward of iteration 1 "
                         "exceeds dist.dry_run_memory_gb=80" if oom else None}))
            if not oom:
                (dry / tid / "summary.json").write_text(json.dumps({"dry_run": True, "peak_gib": [49.4, 41.1]}))
    index = build_report(rd)
    page = Page(index.read_text())
    canzona = summaries["canzona"][1]
    for method in ("sync", "atomic", "zero1_atomic+async"):
        for metric, key in (("iteration_ms", "iteration_speedup"), ("optimizer_step_ms", "optimizer_step_speedup")):
            row = page.having("data-claim-baseline", **{"data-claim-baseline": method, "data-claim-metric": metric})
            assert len(row) == 1
            assert f"{PAPER_CLAIMS[key]}×" in row[0]["text"]
            assert f"{fmt(summaries[method][1][metric] / canzona[metric])}×" in row[0]["text"]
    fits = {e["data-fits"] for e in page.having("data-fits")}
    assert fits == {"true", "false"}
    text = page.ids["projected-claims"]["text"]
    assert "fits no 80 GB GPU" in text and "fits 80 GB (peak 49.40 GiB)" in text
    rows = page.having("data-rung")
    got = {r["data-rung"]: r for r in rows}
    assert list(got) == ["0_0-0_0", "1_0-0_0", "1_0-1_0", "1_1-1_0", "1_0-1_1", "1_1-1_1"]
    step = {e["data-value"] for e in page.having("data-value", **{"data-metric": "optimizer_step_ms"})}
    sync_ms, atomic_ms = summaries["sync"][1]["optimizer_step_ms"], summaries["atomic"][1]["optimizer_step_ms"]
    assert repr(sync_ms) in step and fmt(sync_ms - atomic_ms) in got["1_0-0_0"]["text"]
    assert page.ids.get("fig-ladder") is not None


def test_where_canzona_does_not_lead_lists_every_ratio_below_one_slowest_first() -> None:
    from analysis.projection import behind_rows

    def cell(variant, it, step):
        return {"variant": variant, "values": {"iteration_ms": 1.0, "optimizer_step_ms": 1.0},
                "ratio": {"iteration_ms": it, "optimizer_step_ms": step}}

    rows = [{"id": "p0000", "point": {"model": "qwen3-32b"}, "variant": None, "gpus": 256,
             "canzona": {"iteration_ms": 1.0, "optimizer_step_ms": 1.0},
             "cells": {"layerwise_sharded_gram": [cell(None, 0.55, 0.94)], "sync": [cell(None, 1.2, 3.0)],
                       "adamw": [cell(None, 0.9, 0.5)]}}]  # adamw's ratio is an overhead, never "behind"
    got = behind_rows(rows)
    assert [(x["baseline"], x["metric"], x["ratio"]) for x in got] == [
        ("layerwise_sharded_gram", "iteration_ms", 0.55), ("layerwise_sharded_gram", "optimizer_step_ms", 0.94)]

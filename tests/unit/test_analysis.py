"""analysis/: loading, aggregations, CSV exports, the rendered report and its CLI.

Records come from tests/fixtures/records_gen.py, a stand-in written exactly per
canzona/records.py until a real sweep's records are available.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import stats
from analysis.load import load_sweep
from analysis.report import build_report, fmt, main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_local_hardware(monkeypatch, tmp_path_factory):
    """Hermetic: whether this machine has a calibrated hardware/local.yaml must not matter here
    (the predicted-vs-measured section has its own tests in test_projection.py)."""
    monkeypatch.setattr("canzona.hardware.LOCAL_FILE", tmp_path_factory.getbasetemp() / "no-local.yaml")
    monkeypatch.setattr("canzona.hardware.BEFORE_RENAME_DIR", tmp_path_factory.getbasetemp() / "no-profiles")


@pytest.fixture(scope="module")
def built(records_gen, tmp_path_factory):
    sweep = records_gen.make_sweep(tmp_path_factory.mktemp("res") / "demo")
    index = build_report(sweep, hardware=None)
    return sweep, index


class _Cells(HTMLParser):
    """Collects every element with data-value (its attributes and its text) and table ids."""

    def __init__(self):
        super().__init__()
        self.cells: list[dict] = []
        self.tables: set[str] = set()
        self.imgs: list[str] = []
        self.links: list[str] = []
        self._stack: list[dict] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self.tables.add(a["id"])
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if "data-value" in a and tag in ("span", "td"):
            cell = {"tag": tag, **a, "text": ""}
            self.cells.append(cell)
            self._stack.append(cell)
        elif self._stack and tag not in ("br",):
            self._stack.append({"tag": tag, "inner": True})

    def handle_endtag(self, tag):
        if self._stack and tag not in ("br",):
            self._stack.pop()

    def handle_data(self, data):
        self.text.append(data)
        for c in self._stack:
            if not c.get("inner"):
                c["text"] += data


def _parse(index: Path) -> _Cells:
    p = _Cells()
    p.feed(index.read_text())
    return p


def _csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    key = "id" if rows and "id" in rows[0] else "trial_id"
    return {r[key]: r for r in rows}


# ------------------------------------------------------------------------ report == CSV


def test_report_numbers_equal_csv(built):
    sweep, index = built
    out = index.parent
    for name in ("trials.csv", "steps.csv", "speedups.csv", "latencies.csv", "phases.csv", "rank_loads.csv"):
        assert (out / name).is_file(), name
    speed, lat, trials = _csv(out / "speedups.csv"), _csv(out / "latencies.csv"), _csv(out / "trials.csv")
    page = _parse(index)
    assert {"headline", "latencies", "trials", "problem-trials", "provenance-table"} <= page.tables
    seen_s, seen_g, seen_t = set(), set(), set()
    for c in page.cells:
        text = " ".join(c["text"].split())
        if c.get("data-id", "").startswith("s"):  # a speedup / overhead ratio
            row = speed[c["data-id"]]
            for attr, col in (("data-value", "value"), ("data-lo", "ci_low"), ("data-hi", "ci_high")):
                assert float(c[attr]) == pytest.approx(float(row[col]), rel=1e-12)
            assert text.startswith(f"{fmt(float(row['value']))}×"), text
            assert f"[{fmt(float(row['ci_low']))}–{fmt(float(row['ci_high']))}]" in text
            seen_s.add(c["data-id"])
        elif c.get("data-id", "").startswith("g"):  # a group latency
            row = lat[c["data-id"]]
            f = c["data-field"]
            assert float(c["data-value"]) == pytest.approx(float(row[f"{f}_median"]), rel=1e-12)
            assert text.startswith(fmt(float(row[f"{f}_median"])))
            assert f"[{fmt(float(row[f'{f}_p10']))}–{fmt(float(row[f'{f}_p90']))}]" in text
            seen_g.add(c["data-id"])
        elif "data-trial" in c:  # per-trial cells
            row = trials[c["data-trial"]]
            f = c["data-field"]
            col = f if f.endswith("imbalance") else f"{f}_median"
            assert float(c["data-value"]) == pytest.approx(float(row[col]), rel=1e-12)
            assert text.startswith(fmt(float(row[col]), 3 if f.endswith("imbalance") else 2))
            seen_t.add(c["data-trial"])
    assert seen_s == set(speed), "every speedups.csv row appears in the headline table"
    assert seen_g == set(lat), "every latencies.csv row appears in the latency table"
    assert seen_t == {k for k, r in trials.items() if r["source"]}, "every trial with timings has its cells"


def test_aggregations_from_raw_records(built):
    sweep, index = built
    out = index.parent
    trials = pd.read_csv(out / "trials.csv").set_index("trial_id")
    # medians and spread: max over ranks per measured step, then percentiles over steps
    per_trial = {}
    for d in sorted(p for p in sweep.iterdir() if (p / "steps.jsonl").is_file()):
        rows = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines()]
        steps = sorted({r["step"] for r in rows if r["measured"]})
        it = [max(r["iteration_ms"] for r in rows if r["step"] == s) for s in steps]
        op = [max(r["optimizer_step_ms"] for r in rows if r["step"] == s) for s in steps]
        per_trial[d.name] = (it, op)
        t = trials.loc[d.name]
        assert t["iteration_ms_median"] == pytest.approx(np.median(it))
        assert t["iteration_ms_p10"] == pytest.approx(np.percentile(it, 10))
        assert t["optimizer_step_ms_p90"] == pytest.approx(np.percentile(op, 90))
        # the fixture's summary.json was computed the same way
        summary = json.loads((d / "summary.json").read_text())
        assert t["optimizer_step_ms_median"] == pytest.approx(summary["optimizer_step_ms_median"])
        # planned imbalance = max / mean of plan.ranks[*].compute; measured from compute_ms
        planned = [r["compute"] for r in summary["plan"]["ranks"]]
        assert t["planned_imbalance"] == pytest.approx(max(planned) / np.mean(planned))
        meas = [np.median([r["compute_ms"] for r in rows if r["rank"] == k and r["measured"]])
                for k in sorted({r["rank"] for r in rows})]
        assert t["measured_imbalance"] == pytest.approx(max(meas) / np.mean(meas))
    assert len(per_trial) == 8
    # speedup = ratio of medians; the interval brackets it
    sp = pd.read_csv(out / "speedups.csv")
    row = sp[(sp["model"] == "qwen3-0.6b/w8l4") & (sp["baseline"] == "sync") & (sp["metric"] == "optimizer_step_ms")].iloc[0]
    can = per_trial["t000-canzona-qwen3-0.6b-s1234"][1]
    syn = per_trial["t001-sync-qwen3-0.6b-s1234"][1]
    assert row["value"] == pytest.approx(np.median(syn) / np.median(can))
    assert row["ci_low"] <= row["value"] <= row["ci_high"]
    assert row["value"] > 1  # the toy model makes canzona faster
    ov = sp[(sp["baseline"] == "adamw") & (sp["metric"] == "iteration_ms")].iloc[0]
    assert ov["kind"] == "overhead" and ov["value"] == pytest.approx(ov["canzona_median"] / ov["baseline_median"])
    assert set(sp["comparison"]) == {"canzona vs sync", "canzona vs layerwise", "canzona overhead vs adamw"}
    # steps.csv: trial x rank x step, warm-up included
    steps = pd.read_csv(out / "steps.csv")
    n_lines = sum(len((d / "steps.jsonl").read_text().splitlines()) for d in sweep.iterdir() if (d / "steps.jsonl").is_file())
    assert len(steps) == n_lines
    assert {"trial_id", "rank", "step", "measured", "iteration_ms", "method", "parallel.dp"} <= set(steps.columns)
    # every config value is a column of trials.csv
    for col in ("parallel.dp", "parallel.tp", "planner.alpha", "optimizer.name", "train.seed", "dist.dp_collective"):
        assert col in trials.columns
    # phases: rank-mean per step, median over steps
    ph = pd.read_csv(out / "phases.csv").set_index("trial_id")
    rows = [json.loads(x) for x in (sweep / "t004-canzona-qwen3-1.7b-s1234" / "steps.jsonl").read_text().splitlines()]
    steps_m = sorted({r["step"] for r in rows if r["measured"]})
    comp = [np.mean([r["compute_ms"] for r in rows if r["step"] == s]) for s in steps_m]
    assert ph.loc["t004-canzona-qwen3-1.7b-s1234", "compute"] == pytest.approx(np.median(comp))


def test_failed_and_missing_trials_are_listed(built):
    sweep, index = built
    trials = pd.read_csv(index.parent / "trials.csv").set_index("trial_id")
    failed = trials.loc["t008-sync-qwen3-1.7b-fail"]
    assert failed["status"] == "failed" and "rank 3 raised" in failed["error"]
    assert "steps.jsonl" in failed["missing"] and "summary.json" in failed["missing"]
    assert trials.loc["t009-canzona-qwen3-0.6b-running", "status"] == "running"
    nosteps = trials.loc["t010-layerwise-qwen3-0.6b-nosteps"]
    assert nosteps["status"] == "done" and nosteps["source"] == "summary" and nosteps["missing"] == "steps.jsonl"
    # summary-only trials are shown but not pooled into the groups
    lat = pd.read_csv(index.parent / "latencies.csv")
    assert "t010-layerwise-qwen3-0.6b-nosteps" not in " ".join(lat["trial_ids"])
    html = index.read_text()
    problems = html[html.index('id="problem-trials"'):html.index('id="provenance"')]
    for tid in ("t008-sync-qwen3-1.7b-fail", "t009-canzona-qwen3-0.6b-running", "t010-layerwise-qwen3-0.6b-nosteps"):
        assert tid in problems
    assert "RuntimeError: rank 3 raised at step 1" in problems
    assert "t000-canzona" not in problems


def test_report_is_self_contained_with_traces(built):
    sweep, index = built
    page = _parse(index)
    assert len(page.imgs) == 5 and all(s.startswith("data:image/svg+xml;base64,") for s in page.imgs)
    traces = [h for h in page.links if h.startswith("traces/")]
    assert len(traces) == 8  # one per trial with events
    doc = json.loads((index.parent / traces[0]).read_text())
    ev = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(names) == 4 and {e["pid"] for e in ev} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in ev)
    # within one thread, events never partially overlap (Perfetto needs proper nesting)
    by_tid: dict[tuple, list] = {}
    for e in ev:
        if e["cat"] != "step":
            by_tid.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    text = index.read_text()
    assert "0123456789ab" in text and "fixture-host" in text and "cpu / gloo" in text  # provenance
    assert 'id="sweep-config"' in text


# ------------------------------------------------------------------------ degenerate sweeps


def test_sweep_without_sync_trials_says_so(records_gen, tmp_path):
    sweep = records_gen.make_sweep(tmp_path / "nosync", models=("qwen3-0.6b",), methods=("canzona", "layerwise"),
                              failed=False, missing=False, sweep_yaml=False)
    index = build_report(sweep)
    sp = pd.read_csv(index.parent / "speedups.csv")
    assert set(sp["baseline"]) == {"layerwise"}
    html = index.read_text()
    headline = html[html.index('id="headline"'):html.index('id="latency"')]
    assert "no data" in headline  # vs sync and vs adamw cells
    assert "No sweep.json" in html


def test_sweep_with_only_failed_trials_renders(records_gen, tmp_path):
    gen = records_gen
    root = tmp_path / "allfailed"
    gen.write_trial(root / "a", gen.trial_config("canzona"), status="failed", error="boom: OOM on rank 0")
    gen.write_trial(root / "b", gen.trial_config("sync"), omit=("status.json", "steps.jsonl", "summary.json"))
    gen.write_trial(root / "c", gen.trial_config("layerwise"), status="failed", error="no config", omit=("config.yaml",))
    index = build_report(root)
    html = index.read_text()
    assert "No speedups to show" in html and "boom: OOM on rank 0" in html
    assert "<img" not in html
    trials = pd.read_csv(index.parent / "trials.csv").set_index("trial_id")
    assert trials.loc["a", "status"] == "failed" and trials.loc["b", "status"] == "unknown"
    assert trials.loc["c", "status"] == "failed" and "config.yaml" in trials.loc["c", "missing"]
    assert "no config" in html
    assert pd.read_csv(index.parent / "steps.csv").empty


def test_method_variants_split_speedups(records_gen, tmp_path):
    gen = records_gen
    root = tmp_path / "alpha"
    gen.write_trial(root / "c05", gen.trial_config("canzona", extra=["planner.alpha=0.5"]))
    gen.write_trial(root / "c10", gen.trial_config("canzona", extra=["planner.alpha=1.0"], seed=2))
    gen.write_trial(root / "s1", gen.trial_config("sync"))
    gen.write_trial(root / "s2", gen.trial_config("sync", seed=2))
    sweep = load_sweep(root)
    per_step = stats.step_values(sweep.steps_df)
    trials = stats.trial_table(sweep, per_step)
    assert trials.attrs["point_columns"] == list(stats.POINT_BASE)  # seed does not split points
    assert sorted(trials["variant"]) == ["", "", "alpha=0.5", "alpha=1.0"]
    sp = stats.speedup_table(trials, per_step)
    assert sorted(set(sp["canzona_variant"])) == ["alpha=0.5", "alpha=1.0"]
    assert set(sp["n_trials_baseline"]) == {2} and set(sp["n_trials_canzona"]) == {1}
    groups = stats.group_table(trials, per_step)
    assert groups.loc[groups["method"] == "sync", "n_steps"].item() == 8


def test_bootstrap_interval_is_deterministic_and_sane():
    rng = np.random.default_rng(1)
    num = [rng.normal(200, 5, 6) for _ in range(3)]
    den = [rng.normal(100, 5, 4) for _ in range(2)]
    a = stats.ratio_with_ci(num, den)
    assert a == stats.ratio_with_ci(num, den)
    assert a[1] < a[0] < a[2] and 1.8 < a[0] < 2.2
    assert all(math.isnan(x) for x in stats.ratio_with_ci([], den))


# ------------------------------------------------------------------------ CLI


def test_cli_errors(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "does not exist" in err and "\n" not in err
    (tmp_path / "empty" / "junk").mkdir(parents=True)
    assert main([str(tmp_path / "empty")]) == 2
    assert "no trials" in capsys.readouterr().err
    # unknown keys and flags, a second folder, no folder: one line, exit 2, nothing written
    for argv, fragment in (
        ([str(tmp_path / "empty"), "ot=x"], "unknown report key 'ot'; allowed under top level: hardware, out"),
        ([str(tmp_path / "empty"), "--out", "x"], "unknown flag --out; settings are key=value (out=x?)"),
        ([str(tmp_path / "empty"), str(tmp_path)], "bad argument"),
        ([], "missing SWEEP_DIR"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and fragment in err and err.count("\n") == 1, (argv, err)
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["junk"]
    assert main(["--help"]) == 0 and "usage: python -m analysis.report" in capsys.readouterr().out


def test_cli_prints_report_path_last(records_gen, tmp_path):
    sweep = records_gen.make_sweep(tmp_path / "cli", models=("qwen3-0.6b",), methods=("canzona", "sync"),
                              failed=False, missing=False)
    out = tmp_path / "elsewhere"
    r = subprocess.run([sys.executable, "-m", "analysis.report", str(sweep), f"out={out}", "hardware=none"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == str(out / "index.html")
    assert (out / "index.html").is_file() and (out / "trials.csv").is_file()
    r = subprocess.run([sys.executable, "-m", "analysis.report", str(tmp_path / "missing")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_a_vocabulary_override_labels_the_model_once_for_every_layout() -> None:
    """model.vocab pads per TP (Megatron), but one model keeps one label and one size across
    layouts, so the report's points and its claims' "largest model" row group them together."""
    from analysis.load import model_label, model_params

    cfgs = [{"model": {"name": "qwen3-32b", "vocab": 50257, "tied_embeddings": True}, "parallel": {"dp": 64 // tp, "tp": tp}}
            for tp in (1, 4, 8)]
    assert {model_label(c) for c in cfgs} == {"qwen3-32b/v50257/tied"}
    sizes = {model_params(c) for c in cfgs}
    assert len(sizes) == 1
    plain = model_params({"model": {"name": "qwen3-32b"}, "parallel": {"tp": 8}})
    assert sizes.pop() == plain - 2 * 151936 * 5120 + 50304 * 5120  # untied 151936 -> tied 50304 rows


def test_headline_says_in_words_what_each_interval_decides(built):
    """Every ratio carries the verdict its interval gives (faster / slower / not decisive; an
    overhead costs more / less), styled apart; the headline's sentences count them per
    comparison, and speedups.csv has the same verdicts."""
    import re

    from analysis.stats import verdict

    _, index = built
    html = Path(index).read_text()
    spans = re.findall(r'<span class="ratio (\w+)" data-id="[^"]*" data-value="([^"]*)" data-lo="([^"]*)" '
                       r'data-hi="([^"]*)" data-verdict="([^"]*)"', html)
    assert spans
    for style, _value, lo, hi, said in spans:
        lo_f, hi_f = float(lo or "nan"), float(hi or "nan")
        assert said in (verdict("speedup", lo_f, hi_f), verdict("overhead", lo_f, hi_f))
        assert style == ("good" if said in ("faster", "costs less") else "bad" if said in ("slower", "costs more")
                         else "undecided")
    sp = pd.read_csv(Path(index).parent / "speedups.csv")
    assert set(sp["verdict"]) <= {"faster", "slower", "not decisive", "costs more", "costs less"}
    lines = re.findall(r'<li data-baseline="([^"]+)" data-metric="([^"]+)">(.*?)</li>', html, re.S)
    assert {(b, m) for b, m, _ in lines} == set(zip(sp["baseline"], sp["metric"]))
    for b, m, text in lines:
        d = sp[(sp["baseline"] == b) & (sp["metric"] == m)]
        assert f"of {len(d)} point" in text
    assert verdict("speedup", 1.02, 1.3) == "faster" and verdict("speedup", 0.9, 1.1) == "not decisive"
    assert verdict("overhead", 1.1, 1.4) == "costs more" and verdict("speedup", 0.5, 0.9) == "slower"


def test_plot_colours_tell_methods_and_phases_apart() -> None:
    from analysis import plots
    from canzona.records import PHASES

    assert len(set(plots.PHASE_COLORS.values())) == len(PHASES) + 1  # "other" too
    methods = ["canzona", "atomic", "sync", "layerwise", "adamw", "zero1_atomic+async", "balanced+async",
               "zero1_atomic+async_balanced"]
    assert len({plots._color(m) for m in methods}) == len(methods)
    assert len({plots._marker(o) for o in ("muon", "shampoo", "soap", "adamw")}) == 4


# ------------------------------------------------------------------------ resumed sweeps


def test_report_says_its_runs_come_from_several_invocations(records_gen, tmp_path, built):
    """A resumed sweep: runs of two invocations (told apart by their submitit/<stamp>/ logs);
    the header says so, the provenance lists each with its runs, trials.csv names each run's."""
    sweep = records_gen.make_sweep(tmp_path / "resumed", invocations=2)
    index = build_report(sweep, hardware=None)
    html = index.read_text()
    head = html[:html.index("<nav>")]
    assert "runs from 2 invocations of this sweep (resumed)" in head
    box = html[html.index('id="invocations"'):]
    box = box[:box.index("</tr>")]
    assert "<code>20250101-000000-100</code>: 7 runs" in box and "<code>20250102-000000-101</code>: 4 runs" in box
    trials = pd.read_csv(index.parent / "trials.csv").set_index("trial_id")
    assert trials.loc["t000-canzona-qwen3-0.6b-s1234", "invocation"] == "20250101-000000-100"
    assert trials.loc["t007-adamw-qwen3-1.7b-s1234", "invocation"] == "20250102-000000-101"
    # the failed / running / no-steps trials carry no log folder: placed by their start time,
    # before the last invocation's, in the one earlier invocation known
    assert trials.loc["t008-sync-qwen3-1.7b-fail", "invocation"] == "20250101-000000-100"
    # one invocation: no such line
    _, one = built
    assert "invocations of this sweep" not in one.read_text()[:one.read_text().index("<nav>")]


def test_invocations_from_recorded_ids_or_start_times(records_gen, tmp_path):
    from analysis.load import load_sweep

    gen = records_gen
    root = tmp_path / "times"
    manifest = {"sweep": "times", "started": "2025-03-02T10:00:00+00:00", "trials": [], "order": []}
    gen.write_trial(root / "a", gen.trial_config("canzona"), status_extra={"started": "2025-03-01T09:00:00+00:00"})
    gen.write_trial(root / "b", gen.trial_config("sync"), status_extra={"started": "2025-03-02T10:00:03+00:00"})
    (root / "sweep.json").write_text(json.dumps(manifest))
    sw = load_sweep(root)
    assert [(g["runs"], g["exact"], g["how"]) for g in sw.invocations] == [(1, False, "start time"), (1, True, "start time")]
    html = build_report(root, hardware=None).read_text()
    assert "runs from at least 2 invocations of this sweep (resumed)" in html[:html.index("<nav>")]
    # an invocation id in status.json wins over everything else
    for name, inv in (("a", "inv-1"), ("b", "inv-1")):
        st = json.loads((root / name / "status.json").read_text())
        (root / name / "status.json").write_text(json.dumps({**st, "invocation": inv}))
    sw = load_sweep(root)
    assert [(g["id"], g["runs"], g["how"]) for g in sw.invocations] == [("inv-1", 2, "recorded")]
    assert "invocations of this sweep" not in build_report(root, hardware=None).read_text()


def test_headline_is_a_block_of_rows_per_point(records_gen, tmp_path):
    """The headline is as wide for seven comparisons as for two: a tbody per point, a row per
    comparison (every baseline, then adamw), the point's cells spanning its rows; config values
    that split points share one "setting" column."""
    import re

    gen = records_gen
    root = tmp_path / "points"
    for seq in (16, 32):
        for m in ("canzona", "sync", "zero1_atomic+async"):
            gen.write_trial(root / f"{m}-{seq}", gen.trial_config(m, extra=[f"train.seq_len={seq}"]))
    html = build_report(root, hardware=None).read_text()
    table = html[html.index('<table id="headline">'):]
    table = table[:table.index("</table>")]
    bodies = re.findall(r'<tbody class="point">(.*?)</tbody>', table, re.S)
    assert len(bodies) == 2
    for body in bodies:
        rows = re.findall(r'<tr data-baseline="([^"]+)">', body)
        assert rows[-1] == "adamw" and sorted(rows[:-1]) == ["layerwise", "sync", "zero1_atomic+async"], rows
        assert body.count('rowspan="4"') >= 5  # model, optimizer, layout, setting, variant, latencies
        assert "train.<wbr>seq_<wbr>len&nbsp;= " in body
    assert "<th rowspan=\"2\">setting</th>" in table and table.count("<th") < 16


def test_one_comparison_function_gives_intervals_only_from_samples(records_gen, tmp_path):
    """`stats.comparisons`: with the steps, each ratio has its bootstrap interval; without (a
    projection's one value per trial), the same pairing gives point ratios of the trials' medians."""
    gen = records_gen
    root = tmp_path / "cmp"
    for m in ("canzona", "sync", "adamw"):
        gen.write_trial(root / m, gen.trial_config(m))
    sweep = load_sweep(root)
    per_step = stats.step_values(sweep.steps_df)
    trials = stats.trial_table(sweep, per_step)
    med = {m: trials.loc[trials["method"] == m].iloc[0] for m in ("canzona", "sync", "adamw")}
    for samples in (per_step, None):
        (c,) = stats.comparisons(trials, samples)
        assert list(c.cells) == ["sync", "layerwise", "adamw"] and c.cells["layerwise"] == []
        (sync,), (adamw,) = c.cells["sync"], c.cells["adamw"]
        assert (sync.kind, adamw.kind) == ("speedup", "overhead")
        for metric in stats.METRICS:
            s, a = sync.ratios[metric], adamw.ratios[metric]
            if samples is None:
                can, base, ref = (float(med[k][f"{metric}_median"]) for k in ("canzona", "sync", "adamw"))
                assert s.value == pytest.approx(base / can, rel=1e-12) and a.value == pytest.approx(can / ref, rel=1e-12)
                assert math.isnan(s.ci_low) and math.isnan(s.ci_high) and s.n_steps_canzona == 1
            else:
                assert s.ci_low <= s.value <= s.ci_high and s.n_steps_canzona == 4
                assert s.value == pytest.approx(s.baseline_median / s.canzona_median, rel=1e-12)


def test_a_setting_cell_says_default_for_unset_and_drops_a_float_point() -> None:
    """A config column with unset cells comes back from pandas as floats with NaN: the report
    shows "default" and whole numbers as integers (parallel.etp: "default", "1")."""
    from analysis.report import setting_text

    assert [setting_text(v) for v in (None, float("nan"), 1.0, 2, 0.5, "zero1")] == ["default", "default", "1", "2",
                                                                                       "0.5", "zero1"]

"""The report's Peers section (analysis/peers.py, reports/templates/peers.html.j2) on synthetic
records: peer trials as canzona/peers/trial.py writes them (tests/fixtures/records_gen.py
`make_peer_sweep`), beside their mirrors and canzona; the numbers checked against the raw steps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import peers, stats
from analysis.load import load_sweep, peer_labels
from analysis.report import build_report

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(records_gen, tmp_path_factory):
    sweep = records_gen.make_peer_sweep(tmp_path_factory.mktemp("res") / "peers")
    index = build_report(sweep, tmp_path_factory.mktemp("report"), hardware=None)
    return sweep, index


def _tables(html: str) -> dict[tuple[int, int], dict[str, str]]:
    """(dp, tp) -> {method: its row's HTML} of each Peers table, rows in their order."""
    out = {}
    for dp, tp, body in re.findall(r'<table class="peers" data-dp="(\d+)" data-tp="(\d+)">(.*?)</table>', html, re.S):
        out[(int(dp), int(tp))] = dict(re.findall(r'<tr data-method="([^"]+)"[^>]*>(.*?)</tr>', body, re.S))
    return out


def _ratio(row_html: str, kind: str, metric: str) -> tuple[float, float, float] | None:
    m = re.search(rf'data-kind="{kind}" data-metric="{metric}" data-value="([^"]*)" data-lo="([^"]*)" data-hi="([^"]*)"',
                  row_html)
    return tuple(float(x) for x in m.groups()) if m else None  # type: ignore[return-value]


def _median(sweep: Path, folders: list[str], metric: str) -> float:
    """The pooled median over the folders' measured steps of the max over ranks: from steps.jsonl."""
    vals = []
    for f in folders:
        rows = [json.loads(line) for line in (sweep / f / "steps.jsonl").read_text().splitlines()]
        by_step: dict[int, list[float]] = {}
        for r in rows:
            if r["measured"] and r[metric] is not None:
                by_step.setdefault(r["step"], []).append(r[metric])
        vals += [max(v) for v in by_step.values()]
    return float(np.median(vals))


def _folders(sweep: Path, name: str, dp: int, tp: int) -> list[str]:
    return sorted(p.name for p in sweep.iterdir() if re.fullmatch(rf"t\d+-{name}-dp{dp}tp{tp}(-r\d+)?", p.name))


def test_peer_trials_load_with_their_labels(built) -> None:
    sweep, _ = built
    s = load_sweep(sweep)
    peer_rows = s.trials_df[s.trials_df["method.name"].isin(list(peers.PEERS))]
    assert set(peer_rows["method"]) == {"megatron_layerwise[duplicated]", "megatron_layerwise[distributed]",
                                        "megatron_layerwise[blockwise]", "megatron_zero1", "torchtitan_distmuon"}
    assert peer_rows["rung"].isna().all() and peer_rows["method.dp"].isna().all()
    trials = stats.trial_table(s)
    assert not any(c.startswith("peer.") for c in trials.attrs["point_columns"])  # one point per layout
    assert (trials["source"] == "steps").all()
    order = stats.method_order(trials["method"].unique())
    assert order[0] == "canzona" and order[-1] == "adamw"
    assert order.index("layerwise_sharded") < order.index("megatron_layerwise[duplicated]") < order.index("megatron_zero1")


def test_tp_mode_in_the_label_only_when_the_sweep_varies_it() -> None:
    df = pd.DataFrame({"method": ["megatron_layerwise", "megatron_layerwise", "canzona"],
                       "method.name": ["megatron_layerwise", "megatron_layerwise", "canzona"],
                       "peer.tp_mode": ["duplicated", "duplicated", "blockwise"]})
    assert list(peer_labels(df)) == ["megatron_layerwise", "megatron_layerwise", "canzona"]
    df.loc[1, "peer.tp_mode"] = "blockwise"
    assert list(peer_labels(df)) == ["megatron_layerwise[duplicated]", "megatron_layerwise[blockwise]", "canzona"]


def test_peers_section_rows_ratios_and_notes(built) -> None:
    sweep, index = built
    html = index.read_text()
    assert 'id="peers"' in html and 'href="#peers"' in html
    tables = _tables(html)
    assert set(tables) == {(2, 1), (2, 2)}
    modes = ["megatron_layerwise[blockwise]", "megatron_layerwise[distributed]", "megatron_layerwise[duplicated]"]
    assert list(tables[(2, 1)]) == [*modes, "megatron_zero1", "torchtitan_distmuon"]
    assert list(tables[(2, 2)]) == [*modes, "megatron_zero1"]  # DistMuon: DP only
    noted = {False: 0, True: 0}
    for (dp, tp), rows in tables.items():
        for method, row in rows.items():
            name, _, mode = method.partition("[")
            key = (name, mode.rstrip("]") or None)
            assert peers.PARITY[key] in row.replace("&#39;", "'")
            orig = _folders(sweep, f"{name}-{mode.rstrip(']')}" if mode else name, dp, tp)
            assert len(orig) == 2
            mirror = peers.MIRRORS.get(key)
            for metric in stats.METRICS:
                den = _median(sweep, orig, metric)
                c = _ratio(row, "canzona", metric)
                assert c is not None and c[0] == pytest.approx(_median(sweep, _folders(sweep, "canzona", dp, tp), metric) / den)
                assert c[1] <= c[0] <= c[2]
                m = _ratio(row, "mirror", metric)
                if mirror is None:
                    assert m is None and "no harness strategy mirrors it" in row
                    continue
                want = _median(sweep, _folders(sweep, mirror, dp, tp), metric) / den
                assert m is not None and m[0] == pytest.approx(want) and m[1] <= m[0] <= m[2]
                far = not (1 / 1.2 <= want <= 1.2)
                what = "optimizer step" if metric == "optimizer_step_ms" else "iteration"
                assert (f"{mirror}&#39;s {what} is" in row) == far, (method, dp, tp, metric, want)
                noted[far] += 1
    assert noted[True] and noted[False]  # the fixture has mirrors both within and outside 1.2x
    csv = pd.read_csv(index.parent / "peers.csv")
    assert len(csv) == 9 and set(csv["mirror"].dropna()) == {"layerwise_sharded", "layerwise_sharded_gram", "adamw"}


def test_peers_section_says_what_the_shim_changed_and_the_versions(records_gen, built) -> None:
    _, index = built
    html = index.read_text()
    prov = re.search(r'<ul class="note" id="peer-provenance">(.*?)</ul>', html, re.S)
    assert prov
    items = dict(re.findall(r'<li data-peer="([^"]+)">(.*?)</li>', prov.group(1), re.S))
    assert list(items) == ["megatron_layerwise", "megatron_zero1", "torchtitan_distmuon"]
    shim = records_gen.PEER_SHIM.replace("'", "&#39;")
    for name, text in items.items():
        assert shim in text and peers.PEERS[name].follows in text
    assert "megatron_core 0.19.2" in items["megatron_layerwise"] and "torchtitan 0.3.0" in items["torchtitan_distmuon"]


def test_no_peers_section_without_peer_trials(records_gen, tmp_path) -> None:
    sweep = records_gen.make_sweep(tmp_path / "demo", models=("qwen3-0.6b",), failed=False, missing=False)
    index = build_report(sweep, tmp_path / "report", hardware=None)
    html = index.read_text()
    assert 'id="peers"' not in html and 'href="#peers"' not in html
    assert not (index.parent / "peers.csv").exists()


def _per_step(tid: str, step_ms: list[float], **phases: list[float | None]) -> pd.DataFrame:
    df = pd.DataFrame({"trial_id": tid, "step": range(len(step_ms)), "optimizer_step_ms": step_ms,
                       "iteration_ms": [s + 50 for s in step_ms]})
    for ph in (*peers.GAP_PHASES["optimizer_step_ms"], *peers.GAP_PHASES["iteration_ms"]):
        vals = phases.get(ph)
        df[f"{ph}_ms_mean"] = [np.nan if v is None else v for v in (vals or [None] * len(step_ms))]
    return df


def test_gap_breakdown_splits_the_difference_of_medians_over_the_phases_both_record() -> None:
    orig = _per_step("o", [30.0, 31.0, 29.0], compute=[18.0, 19.0, 17.0], gather=[2.5, 2.5, 2.5],
                     clip_grad=[5.0, 5.0, 5.0], apply=[1.0, 1.0, 1.0])
    mirror = _per_step("m", [16.0, 17.0, 15.0], compute=[11.0, 12.0, 10.0], clip_grad=[3.0, 3.0, 3.0],
                       apply=[1.7, 1.7, 1.7])
    per_step = pd.concat([orig, mirror], ignore_index=True)
    text = peers.gap_breakdown(per_step, pd.DataFrame({"trial_id": ["o"]}), pd.DataFrame({"trial_id": ["m"]}),
                               "optimizer_step_ms")
    # 30 - 16 = 14: compute 7, clip 2, apply -0.7, rest 5.7 (gather: the original's only)
    assert text.startswith("original − mirror +14.0 ms: compute +7.0, rest +5.7, clip grad +2.0, apply -0.7")
    assert text.endswith("recorded by one side only: gather")
    same = peers.gap_breakdown(per_step, pd.DataFrame({"trial_id": ["o"]}), pd.DataFrame({"trial_id": ["o"]}),
                               "optimizer_step_ms")
    assert same == ""

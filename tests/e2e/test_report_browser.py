"""End-to-end: a sweep report opened in headless Chromium (Debian's `chromium`).

Drives the browser over the DevTools protocol (`browser_util`). Skips when chromium is missing,
unless CI=true, where it fails.
Set REPORT_SCREENSHOT=/path.png to keep the screenshot.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from browser_util import need_chromium, open_report

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_report_in_headless_chromium(records_gen, tmp_path):
    need_chromium()
    from analysis.report import build_report

    gen = records_gen
    # the widest headline a sweep makes: canzona against every rung of the authors' ladder, the
    # other baselines and adamw (7 comparisons x 2 metrics), from a resumed sweep (2 invocations)
    sweep = gen.make_sweep(tmp_path / "sweep", methods=gen.LADDER_METHODS, invocations=2)
    index = build_report(sweep)
    png = tmp_path / "report.png"
    info = open_report(index, png)
    if os.environ.get("REPORT_SCREENSHOT"):
        shutil.copy(png, os.environ["REPORT_SCREENSHOT"])

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 50_000, f"screenshot suspiciously small ({len(data)} bytes)"
    assert info["errors"] == [], info["errors"]
    assert info["headline"] and info["headlineRows"] >= 1
    assert len(info["imgs"]) >= 5, info["imgs"]
    bad = [i for i in info["imgs"] if not (i["complete"] and i["w"] > 0)]
    assert not bad, f"images that did not load: {bad}"
    assert "Canzona sweep report" in info["title"]
    # tables fit a 1400 px window: none scrolls sideways (its right columns hidden), least of
    # all the headline, however many methods the sweep compares
    assert info["viewport"] == 1400
    tables = {t["id"]: t for t in info["tables"]}
    head = tables["headline"]
    assert head["width"] <= head["box"] and head["boxScroll"] <= head["box"], head
    too_wide = [t for t in info["tables"] if t["width"] > t["box"] or t["boxScroll"] > t["box"]]
    assert not too_wide, too_wide
    assert info["headlineRows"] == len(gen.LADDER_METHODS) - 1  # a row per comparison of the first point
    assert info["note"] == "runs from 2 invocations of this sweep (resumed)"

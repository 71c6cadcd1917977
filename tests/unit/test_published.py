"""Projections against published GPU measurements (`canzona.sim.published`,
``python -m canzona.sim.validate published``): every point is projected or says why, the band
counts only checking points, and a pair's ratio check is the ratio of ratios."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from canzona.errors import ConfigError
from canzona.sim.published import POINTS_FILE, band, load_points, pairs, project_points


@pytest.fixture(scope="module")
def results():
    return project_points()


def test_every_point_is_projected_with_its_source_and_what_is_not_modelled(results) -> None:
    points = load_points()
    assert [r.id for r in results] == [p["id"] for p in points] and len(points) >= 18
    for r, p in zip(results, points):
        assert r.error is None and r.projected is not None and r.projected > 0, r.id
        assert r.source.startswith("https://github.com/"), r.id
        assert r.measured == float(p["measured"]["value"]) and r.ratio == pytest.approx(r.projected / r.measured)
    # the architectures the published runs are of: the functional-test GPT-MoE spec, Qwen3-32B
    assert {c for p in points for c in p["config"] if c.startswith("model=")} == {"model=mlm-moe-gpt",
                                                                                  "model=qwen3-32b"}
    assert any("FSDP2" in n for r in results for n in r.not_modelled)


def test_band_leaves_out_points_dominated_by_what_is_not_modelled(results) -> None:
    b = band(results)
    counted = [r.ratio for r in results if not r.dominated]
    assert b["points"] == len(counted) and b["min"] == min(counted) and b["max"] == max(counted)
    assert set(b["left_out"]) == {r.id for r in results if r.dominated} and b["left_out"]
    assert all("hash" in " ".join(r.not_modelled) for r in results if r.dominated)
    assert set(b["by_hardware"]) == {"h100", "gb200", "gb300"}


def test_pairs_check_projected_ratios(results) -> None:
    by_id = {r.id: r for r in results}
    ps = pairs(results)
    assert len(ps) >= 3
    for p in ps:
        run, base = by_id[p["id"]], by_id[p["baseline"]]
        assert p["measured_ratio"] == pytest.approx(run.measured / base.measured)
        assert p["check"] == pytest.approx((run.projected / base.projected) / (run.measured / base.measured))
    assert band(results)["ratios"]["points"] == sum(not p["dominated"] for p in ps)


def test_bad_points_files_are_one_line_errors(tmp_path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump([{"id": "x", "source": "s", "kind": "guess", "hardware": "h100", "config": [],
                                     "measured": {"metric": "iteration_ms", "value": 1}}]))
    with pytest.raises(ConfigError, match="kind='guess'; allowed: iteration, newton_schulz"):
        load_points(path)
    path.write_text(yaml.safe_dump([{"id": "x"}]))
    with pytest.raises(ConfigError, match="lacks 'source'"):
        load_points(path)


def test_cli_prints_every_point_and_the_band() -> None:
    r = subprocess.run([sys.executable, "-m", "canzona.sim.validate", "published", "--json"], capture_output=True,
                       text=True, check=True)
    data = json.loads(r.stdout)
    assert len(data["points"]) == len(yaml.safe_load(POINTS_FILE.read_text())) and data["band"]["points"] > 0
    bad = subprocess.run([sys.executable, "-m", "canzona.sim.validate", "published", "hardware=h100"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1

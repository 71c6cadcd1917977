"""How the simulator prices a CPU shared by more ranks than cores, and gradient clipping, and
where this machine's calibration is kept (docs/results.md § Predicted against measured)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from canzona.hardware import load_hardware
from canzona.sim.timeline import Timeline


def test_oversubscription_stretches_host_work_and_transfers_not_latencies() -> None:
    tl = Timeline(2, overlap=1.0, scale=2.0)
    tl.host_all([0, 1], 1.0)
    assert tl.cpu == [2.0, 2.0]
    h = tl.collective([0, 1], "tp", 1.0, "x", transfer_s=0.25)  # 0.75 s of latency, 0.25 s of copies
    assert h.end - h.start == 0.75 + 0.5
    tl.host_all([0, 1], 1.0, comm=0.5)  # half of it blocking collectives: those are not stretched
    assert tl.cpu == [3.5, 3.5]


def test_without_oversubscription_durations_are_exact() -> None:
    tl = Timeline(1, scale=1.0)
    tl.host_all([0], 0.1, comm=0.07)
    h = tl.collective([0], "tp", 0.3, "x", transfer_s=0.1)
    assert tl.cpu == [0.1] and h.end == 0.1 + 0.3  # no (s - t) + t rounding on GPU projections


def test_clipping_passes_use_their_calibrated_rates_else_a_copy(tmp_path) -> None:
    h100 = load_hardware("h100")  # spec-derived: no rates of its own, a copy pass each
    assert h100.grad_pass("norm", 4e6, 3) == h100.copy(4e6, 3) == h100.grad_pass("scale", 4e6, 3)
    data = yaml.safe_load(h100.path and open(h100.path).read())
    data.update(norm_seconds_per_byte=1e-11, norm_call_overhead_s=2e-6, scale_seconds_per_byte=3e-11)
    hw = load_hardware(data)
    assert hw.grad_pass("norm", 1e6, 2) == 2 * 2e-6 + 1e6 * 1e-11
    assert hw.grad_pass("scale", 1e6, 1) == 1e6 * 3e-11


def test_this_machines_calibration_is_reused_only_in_its_format(tmp_path, monkeypatch) -> None:
    from canzona.calibrate import machine
    from canzona.calibrate.build import CALIBRATION_FORMAT
    from canzona.calibrate.cache import ENV

    monkeypatch.setenv(ENV, str(tmp_path))
    path = machine.machine_hardware_path(1)
    assert path.parent == tmp_path / "hardware" and path.name.endswith(".yaml")
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"calibration": {"format": CALIBRATION_FORMAT - 1}}))
    assert not machine._usable(path)  # measured less, or differently: taken anew
    path.write_text(yaml.safe_dump({"calibration": {"format": CALIBRATION_FORMAT}}))
    lines: list[str] = []
    assert machine.machine_hardware(1, log=lines.append) == path
    assert lines == [f"[calibrate] reused this machine's calibration: {path}"]


def _cpu_hardware(sched_wait_s: float, **compute: Any):
    """The h100 file as a 2-core CPU with the given contended wait and ``compute`` entries (the
    rest as it is)."""
    h100 = load_hardware("h100")
    data = yaml.safe_load(open(h100.path).read())
    data["name"] = "two-core"
    data["device"] = {**data["device"], "kind": "cpu", "cores": 2, "threads": 1}
    data["compute"].update(sched_wait_s=sched_wait_s, **compute)
    return load_hardware(data)


def test_an_oversubscribed_collective_waits_for_its_peers_to_be_scheduled() -> None:
    """``compute.sched_wait_s`` (canzona.calibrate.contended) is added to every collective's
    latency, and only in a trial whose ranks oversubscribe the CPU; there the latency is waiting,
    not busy time (the contended measurement holds both, under that contention)."""
    from canzona.config import load_config
    from canzona.sim.simulate import assumptions, oversubscription, project

    hw = _cpu_hardware(2e-3)
    lat, tr = hw.links["intra"]["all_gather"].parts("all_gather", 2, 1e6)
    assert hw.oversubscribed().collective_parts("all_gather", 1e6, [0, 1]) == (lat + 2e-3, tr)
    assert hw.collective_parts("all_gather", 1e6, [0, 1]) == (0.0, lat + tr)  # the file's own view unchanged

    base = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=sync", "optimizer=muon",
            "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32"]
    for dp, tp, oversubscribed in ((2, 1, False), (2, 2, True)):
        cfg = load_config([*base, f"parallel.dp={dp}", f"parallel.tp={tp}"])
        assert (oversubscription(cfg, hw)[0] > 1) == oversubscribed
        without, with_wait = project(cfg, _cpu_hardware(0.0)), project(cfg, hw)
        if oversubscribed:  # every TP collective of forward, backward and the step waits longer
            assert with_wait["optimizer_step_ms"] > without["optimizer_step_ms"]
            assert with_wait["forward_ms"] > without["forward_ms"]
            assert any("waits 2 ms more" in a for a in assumptions(cfg, hw, 2.0))
        else:
            assert with_wait["iteration_ms"] == without["iteration_ms"]


def test_an_oversubscribed_collective_waits_by_the_contended_curve_of_the_work_apart() -> None:
    """``compute.sched_wait_curve`` (canzona.calibrate.contended, several chunks): under
    oversubscription the peers' drift is the curve's excess over ``sched_wait_s`` (which every
    collective already waits), in place of the drift measured without oversubscription; a trial
    that does not oversubscribe, or a file without the curve, keeps ``peer_wait``. The optimizer
    step's blocking TP collectives, a matrix's update apart, then wait longer."""
    from canzona.config import load_config
    from canzona.sim.simulate import assumptions, project

    two_proc = [[1e-3, 1e-4], [5e-3, 2e-4]]
    curve = [[5e-4, 1e-4], [2e-3, 1e-3], [5e-3, 2.5e-3], [1.5e-2, 3e-3]]
    plain = _cpu_hardware(1e-3, peer_wait=two_proc)
    hw = _cpu_hardware(1e-3, peer_wait=two_proc, sched_wait_curve=curve)
    assert hw.peer_wait == plain.peer_wait == [(1e-3, 1e-4), (5e-3, 2e-4)]  # the file's own view
    assert plain.oversubscribed().peer_wait == plain.peer_wait
    over = hw.oversubscribed()
    assert over.peer_wait == [(5e-4, 0.0), (2e-3, 0.0), (5e-3, 1.5e-3), (1.5e-2, 2e-3)]
    assert over.contention_s == 1e-3 and abs(over.peer_wait_after(3.5e-3) - 7.5e-4) < 1e-15
    # the step's end waits for no collective: the slowest rank lags by the whole contended curve
    assert over.lag_after(5e-3) == 2.5e-3 and hw.lag_after(5e-3) == hw.peer_wait_after(5e-3) == 2e-4
    assert plain.oversubscribed().lag_after(5e-3) == 2e-4
    assert hw.describe()["cpu_sharing"]["sched_wait_curve_ms"] == [[0.5, 0.1], [2.0, 1.0], [5.0, 2.5], [15.0, 3.0]]
    assert "oversubscribed_wait_ms_after_work_ms" in hw.inputs()["rates"]

    base = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=layerwise", "optimizer=muon",
            "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32", "parallel.dp=2"]
    tp1, tp2 = load_config([*base, "parallel.tp=1"]), load_config([*base, "parallel.tp=2"])
    # (the h100 file's rates: a matrix's update takes microseconds, so the curve's first point counts)
    waits = _cpu_hardware(1e-3, peer_wait=two_proc, sched_wait_curve=[[1e-5, 2e-3], [2e-3, 3e-3]])
    assert project(tp1, waits)["iteration_ms"] == project(tp1, plain)["iteration_ms"]  # 2 ranks on 2 cores
    assert project(tp2, waits)["optimizer_step_ms"] > project(tp2, plain)["optimizer_step_ms"]
    assert any("canzona.calibrate.contended's curve" in a for a in assumptions(tp2, hw, 2.0))
    assert not any("contended's curve" in a for a in assumptions(tp1, hw, 1.0))


def _with_call_cpu(hw_data: dict, per_call_s: float, per_byte_s: float, one_element: float):
    """``hw_data`` with every intra link's CPU per call set, and the one-element all-reduce's
    latency and CPU."""
    intra = {k: {**v, "call_cpu_s": per_call_s, "call_cpu_s_per_byte": per_byte_s}
             for k, v in hw_data["collectives"]["intra"].items()}
    intra["all_reduce"].update(one_element_s=1e-4, one_element_call_cpu_s=one_element)
    return load_hardware({**hw_data, "collectives": {"intra": intra}})


def test_a_collectives_own_cpu_is_charged_to_an_oversubscribed_ranks_host() -> None:
    """A collective's own CPU, the caller's and gloo's threads (``call_cpu_s`` + per byte,
    calibration format 13), costs wall time only where every core is taken: an oversubscribed trial's
    step, on the host of each member that issued it (the one-element all-reduce by its own
    measurement). Without oversubscription, or with the CPU unmeasured, the projection is
    unchanged to the bit."""
    from canzona.config import load_config
    from canzona.sim.simulate import project

    base = _with_call_cpu(_cpu_hardware(1e-3).raw, 0.0, 0.0, one_element=0.0)
    hw = _with_call_cpu(base.raw, 3e-4, 1e-9, one_element=5e-5)
    assert hw.call_cpu("all_gather", 1e6, [0, 1]) == 0.0  # the file's own view: nothing charged
    over = hw.oversubscribed()
    assert over.call_cpu("all_gather", 1e6, [0, 1]) == pytest.approx(3e-4 + 0.5e6 * 1e-9, rel=1e-12)
    # four ranks: three ring steps of the per-call part (an all-reduce's six against two), the ring's volume
    assert over.call_cpu("all_gather", 1e6, [0, 1, 2, 3]) == pytest.approx(9e-4 + 0.75e6 * 1e-9, rel=1e-12)
    assert over.call_cpu("all_reduce", 4.0, [0, 1, 2, 3]) == 5e-5  # once a call, as measured at four ranks
    assert base.oversubscribed().call_cpu("all_gather", 1e6, [0, 1]) == 0.0  # not measured: none
    # the report's inputs state the rates the charge rests on
    assert hw.inputs()["rates"]["intra_all_reduce"]["cpu_us_per_call"] == 300.0
    assert "cpu_us_per_call" not in base.inputs()["rates"]["intra_all_reduce"]

    cli = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=sync", "optimizer=muon",
           "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32", "parallel.dp=2"]
    tp1, tp2 = load_config([*cli, "parallel.tp=1"]), load_config([*cli, "parallel.tp=2"])
    def timings(res: dict) -> tuple:
        return res["iteration_ms"], res["optimizer_step_ms"], res["forward_ms"], res["backward_ms"]

    assert timings(project(tp1, hw)) == timings(project(tp1, base))  # 2 ranks on 2 cores: gloo's threads find a core
    charged, plain = project(tp2, hw), project(tp2, base)
    assert charged["optimizer_step_ms"] > plain["optimizer_step_ms"]
    assert charged["forward_ms"] == plain["forward_ms"]  # the model's passes are calibrated whole
    said = [a for a in charged["assumptions"] if "own CPU, caller's and gloo's threads" in a]
    assert said and "0.3 ms + 1 ms/MB" in said[0]
    assert not any("own CPU, caller's and gloo's threads" in a for a in plain["assumptions"])


def test_idle_threads_take_their_share_of_an_oversubscribed_cpus_cores() -> None:
    """``compute.idle_threads_cpu_per_s`` (ρ, gloo's transport loops waking with nothing to do):
    4 ranks on 2 cores share 2 − 4ρ cores where the calibration's processes had 1 − ρ each, so
    the stretch is 2 · (1 − ρ) · 2 / (2 − 4ρ); 2 ranks on 2 cores are not stretched at all."""
    from canzona.config import load_config
    from canzona.sim.simulate import assumptions, oversubscription

    cli = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "dist.device=cpu",
           "dist.threads_per_rank=1", "parallel.dp=2"]
    tp1, tp2 = load_config([*cli, "parallel.tp=1"]), load_config([*cli, "parallel.tp=2"])
    hw = _cpu_hardware(0.0, idle_threads_cpu_per_s=0.027)
    assert oversubscription(tp2, hw) == (pytest.approx(2 * 0.973 * 2 / (2 - 4 * 0.027), rel=1e-12), 1, 2)
    assert oversubscription(tp1, hw) == (1.0, 1, 2)
    assert oversubscription(tp2, _cpu_hardware(0.0)) == (2.0, 1, 2)
    assert hw.inputs()["rates"]["idle_threads_cpu_ms_per_s"] == 27.0
    said = assumptions(tp2, hw, oversubscription(tp2, hw)[0])
    assert any("×2.06" in a and "27 ms of CPU a second" in a for a in said)
    # a file claiming more than half the cores for idle threads is held to half
    greedy = _cpu_hardware(0.0, idle_threads_cpu_per_s=0.9)
    assert oversubscription(tp2, greedy)[0] == pytest.approx(2 * 0.75 * 2 / 1.0)


def test_a_cpu_collectives_latency_keeps_a_core_busy_and_a_gpus_does_not() -> None:
    """gloo's calls (dispatch, its thread's hand-offs, loopback syscalls) run on the rank's cores:
    on a CPU file the whole collective is busy time, unless the ranks oversubscribe the cores
    (then the latency and the scheduling wait are idle: `Hardware.collective_parts`); on a GPU
    file only the transfer is."""
    cpu, gpu = _cpu_hardware(2e-3), load_hardware("h100")
    link = cpu.links["intra"]["all_gather"]
    lat, tr = link.parts("all_gather", 2, 1e6)
    assert cpu.collective_parts("all_gather", 1e6, [0, 1]) == (0.0, lat + tr)
    assert cpu.oversubscribed().collective_parts("all_gather", 1e6, [0, 1]) == (lat + 2e-3, tr)
    glat, gtr = gpu.links["intra"]["all_gather"].parts("all_gather", 2, 1e6)
    assert gpu.collective_parts("all_gather", 1e6, [0, 1]) == (glat, gtr)


def test_peer_wait_is_read_off_the_measured_curve() -> None:
    """``compute.peer_wait`` (canzona.calibrate.peer_wait): linear between the points (sorted by
    work whatever their order in the file), flat outside them, none without points."""
    hw = _cpu_hardware(0.0)
    assert hw.peer_wait == [] and hw.peer_wait_after(5e-3) == 0.0
    data = dict(hw.raw)
    data["compute"] = {**data["compute"], "peer_wait": [[5e-3, 2e-3], [1e-3, 1e-3], [2e-4, 5e-4]]}
    curve = load_hardware(data)
    assert curve.peer_wait_after(0.0) == 5e-4 == curve.peer_wait_after(2e-4)
    assert abs(curve.peer_wait_after(3e-3) - 1.5e-3) < 1e-15
    assert curve.peer_wait_after(1.0) == 2e-3  # not extrapolated
    assert "peer_wait_ms_after_work_ms" in curve.inputs()["rates"] and "peer_wait_ms_after_work_ms" not in hw.inputs()["rates"]
    assert curve.describe()["cpu_sharing"]["peer_wait_ms"] == [[0.2, 0.5], [1.0, 1.0], [5.0, 2.0]]
    assert "cpu_sharing" not in hw.describe() and "cpu_sharing" not in load_hardware("h100").describe()


def test_the_slowest_rank_lags_by_its_own_curve_where_one_is_given() -> None:
    """`Timeline.slowest_lag` reads ``lag`` (the oversubscribed file's whole contended curve) where
    given, the collectives' ``peer_wait`` otherwise, at the most work after the ranks' last meeting."""
    for lag, want in ((None, 0.1 * 2.0), (lambda w: 0.5 * w, 0.5 * 2.0)):
        tl = Timeline(2, peer_wait=lambda w: 0.1 * w, lag=lag)
        tl.host(0, 1.0)
        tl.host(1, 2.0)
        tl.mark([0, 1], "end")
        assert tl.slowest_lag("end") == want


def test_a_collective_waits_for_the_drift_of_the_work_since_its_members_last_met() -> None:
    """The wait is a function of the most work a member did since its own previous collective
    (issued async: the work up to its issue), idle for the first to arrive; a group of one waits
    for nobody."""
    waits: list[float] = []

    def drift(work: float) -> float:
        waits.append(work)
        return 0.1 * work

    tl = Timeline(2, peer_wait=drift)
    tl.host(0, 1.0)
    tl.host(1, 3.0)
    h = tl.collective([0, 1], "dp", 0.5, "a")
    assert waits == [3.0] and h.start == 3.0 + 0.3 and h.end == 3.8
    tl.host(0, 0.5)  # rank 0 issues the next one after 0.5 s more work, rank 1 right away
    h2 = tl.collective([0, 1], "dp", 0.5, "b", issued=[tl.cpu[0], tl.cpu[1]])
    assert waits[-1] == 0.5 and h2.start == max(h.end, tl.cpu[0] + 0.05)
    assert tl.busy == [1.5, 3.0]  # the wait is idle: no core held
    solo = Timeline(1, peer_wait=drift)
    solo.host(0, 2.0)
    assert solo.collective([0], "dp", 0.5, "c").start == 2.0 and waits[-1] == 0.5


def test_a_calibrated_drift_lengthens_the_gradient_reduction() -> None:
    """With the curve, a trial's gradient reduction (issued after the backward) waits longer and
    its iteration grows."""
    from canzona.config import load_config
    from canzona.sim.simulate import project

    base = _cpu_hardware(0.0)
    data = dict(base.raw)
    data["compute"] = {**data["compute"], "peer_wait": [[1e-4, 1e-3], [1e-2, 3e-3]]}
    cfg = load_config(["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=sync", "optimizer=muon",
                       "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32", "parallel.dp=2"])
    without, with_drift = project(cfg, base), project(cfg, load_hardware(data))
    assert with_drift["iteration_ms"] > without["iteration_ms"] + 1.0
    assert with_drift["phases_ms"]["grad_reduce"] > without["phases_ms"]["grad_reduce"]
    from canzona.sim.simulate import assumptions

    said = [a for a in assumptions(cfg, load_hardware(data), 1.0) if "drift" in a]
    assert said and "3 ms after 10 ms" in said[0] and not any("drift" in a for a in assumptions(cfg, base, 1.0))


def test_a_ranks_blocked_seconds_in_a_unit_pay_its_comm_debt_before_its_work_does() -> None:
    """A transfer in flight leaves each member a debt (its comm thread's share of the cores);
    the next host work pays it, except what the unit's blocking collectives leave idle
    (``host_all``'s ``idle``): there the comm thread takes the core the blocked rank leaves."""
    tl = Timeline(1, overlap=0.0, scale=1.0)
    tl.collective([0], "dp", 1.0, "gather")  # 1 s of busy transfer in flight: 1 s of debt
    tl.host_all([0], 0.5, idle=0.25)  # 0.25 s of it taken while blocked later in the unit
    assert tl.cpu == [0.5 + 0.75] and tl.debt == [0.0]
    tl.collective([0], "dp", 1.0, "gather")
    tl.host_all([0], 0.5, idle=2.0)  # blocked longer than the debt: the work runs undisturbed
    assert tl.cpu == [1.25 + 0.5]


def test_on_an_oversubscribed_cpu_the_forwards_tp_waits_absorb_the_parameter_gathers() -> None:
    """At 4 ranks on 2 cores the forward's blocking TP collectives leave the rank idle (the
    calibrated scheduling wait, longer here than any bucket's gather): the overlapped parameter
    gathers in flight cost that forward nothing, as measured (docs/results.md); without
    oversubscription (2 ranks, tp=1) their debt still lengthens the forward."""
    from canzona.config import load_config
    from canzona.sim.simulate import project

    hw = _cpu_hardware(5e-3, overlap=0.0)  # every transfer keeps a core busy
    base = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=adamw", "optimizer=adamw",
            "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32", "parallel.dp=2", "bucket.size=20000"]
    for tp, absorbed in ((2, True), (1, False)):
        overlapped, after = (project(load_config([*base, f"parallel.tp={tp}", f"dist.overlap_param_gather={o}"]), hw)
                             for o in ("true", "false"))
        same = abs(overlapped["forward_ms"] - after["forward_ms"]) < 1e-9
        assert same == absorbed, (tp, overlapped["forward_ms"], after["forward_ms"])


def test_the_slowest_rank_lags_by_the_drift_of_its_work_since_the_last_collective() -> None:
    """A mark's ``apart`` is the host work since the rank's last collective; the slowest real
    rank reaches the mark the drift of the most such work later (`Timeline.slowest_lag`)."""
    tl = Timeline(2, peer_wait=lambda work: 0.1 * work)
    tl.host(0, 1.0)
    tl.collective([0, 1], "dp", 0.5, "a")
    tl.host(0, 2.0)
    tl.host(1, 3.0)
    tl.mark([0, 1], "step_end")
    assert [m["step_end:apart"] for m in tl.marks] == [2.0, 3.0]
    assert abs(tl.slowest_lag("step_end") - 0.3) < 1e-12
    assert Timeline(1, peer_wait=lambda work: 0.1 * work).slowest_lag("x") == 0.0  # nobody to lag behind
    assert Timeline(2).slowest_lag("x") == 0.0  # no curve


def test_the_projected_step_is_the_slowest_ranks() -> None:
    """With a drift curve the projected optimizer step (max over ranks, as summary.json takes
    it) is the lockstep step plus the drift after the step's last collective: canzona at DP 2
    computes its owned matrices after the gradient-norm all-reduce, apart."""
    from canzona.config import load_config
    from canzona.sim.simulate import project

    base, hw = _cpu_hardware(0.0), _cpu_hardware(0.0, peer_wait=[[1e-4, 1e-3], [1e-2, 3e-3]])
    cfg = load_config(["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=canzona",
                       "optimizer=muon", "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32",
                       "parallel.dp=2"])
    res, without = project(cfg, hw), project(cfg, base)
    lockstep = max(r["optimizer_step_ms"] for r in res["steps"])
    assert res["optimizer_step_ms"] > lockstep + 1.0  # at least the curve's first point
    assert without["optimizer_step_ms"] == max(r["optimizer_step_ms"] for r in without["steps"])
    assert any("slowest rank" in a for a in res["assumptions"])


def test_a_comm_thread_that_preempts_compute_costs_the_scheduling_wait_per_collective() -> None:
    """``preempt_s`` (an oversubscribed CPU's contended wait): host work that pays the debt of
    collectives in flight also waits that long per collective for its core back; debt that idle
    time pays costs nothing more, and without oversubscription (0) the debt alone is paid."""
    for preempt, idle_first in ((0.5, False), (0.5, True), (0.0, False)):
        tl = Timeline(1, overlap=0.0)
        tl.preempt_s = preempt
        h = tl.collective([0], "tp", 1.0, "a")
        tl.collective([0], "tp", 1.0, "b")  # 2 s of debt, from two collectives
        if idle_first:
            tl.cpu[0] -= 5.0  # the host is behind: its wait for "a" idles long enough to pay it all
            tl.wait(0, h)
            before = tl.cpu[0]
            tl.host(0, 1.0)
            assert tl.cpu[0] - before == 1.0
        else:
            tl.host(0, 1.0)
            assert tl.cpu[0] == 1.0 + 2.0 + 2 * preempt
        assert tl.debt == [0.0] and tl.owed_calls == [0]


def test_gloo_runs_two_collectives_of_a_group_at_once_and_nccl_one() -> None:
    """A CPU file's streams have gloo's two worker threads per process group (``comm_lanes``):
    two collectives issued together end together, the third after them; a GPU file's (NCCL) run
    one after another. The no-overlap gradient reduction of 7 buckets measured 18.4-19.4 ms on
    the 2-core VM where one lane priced it at 27 (docs/results.md)."""
    assert load_hardware("h100").comm_lanes == 1 and _cpu_hardware(0.0).comm_lanes == 2
    for lanes, ends in ((1, [1.0, 2.0, 3.0]), (2, [1.0, 1.0, 2.0])):
        tl = Timeline(2, lanes=lanes)
        hs = [tl.collective([0, 1], "dp", 1.0, f"b{k}") for k in range(3)]
        assert [h.end for h in hs] == ends


def test_the_gradient_buckets_reductions_take_their_own_overlap() -> None:
    """``compute.grad_reduce_overlap`` (measured as the runtime issues the bucket reductions,
    `canzona.calibrate.grad_overlap`) prices the gradient buckets' reductions alone: at 0 their
    whole busy time lengthens the backward and the reduction wait, while the parameter gathers
    (another asynchronous collective) keep the file's ``overlap``; absent, it is ``overlap``."""
    from canzona.config import load_config
    from canzona.sim.simulate import project

    base = ["model=qwen3-0.6b", "model.width_div=16", "model.num_layers=2", "method=adamw", "optimizer=adamw",
            "dist.device=cpu", "dist.threads_per_rank=1", "train.seq_len=32", "parallel.dp=2", "bucket.size=20000"]
    cfg = load_config(base)
    plain = _cpu_hardware(0.0, overlap=1.0)
    assert plain.grad_reduce_overlap == 1.0
    same = _cpu_hardware(0.0, overlap=1.0, grad_reduce_overlap=1.0)
    apart = _cpu_hardware(0.0, overlap=1.0, grad_reduce_overlap=0.0)
    p_plain, p_same, p_apart = (project(cfg, hw, events="none") for hw in (plain, same, apart))
    assert p_same["iteration_ms"] == p_plain["iteration_ms"]
    grads = [(p["backward_ms"] + p["grad_reduce_ms"]) for p in (p_plain, p_apart)]
    assert grads[1] > grads[0], grads  # the reductions' busy time no longer hidden
    assert p_apart["param_gather_ms"] == p_plain["param_gather_ms"]  # the gathers keep ``overlap``
    assert any("beside the backward: 0" in a for a in p_apart["assumptions"])
    assert not any("beside the backward" in a for a in p_plain["assumptions"])

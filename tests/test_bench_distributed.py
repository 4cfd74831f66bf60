"""``python -m tsm_core.bench distributed``: the harness on the CPU (gloo processes,
tiny sizes) end to end, and its arithmetic (per-iteration times, speedups,
efficiencies, acceptance) on hand-made rank records."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from tsm_core.bench import _distributed as D  # noqa: E402


def test_cpu_quick_run_writes_the_document(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tsm_core.bench", "distributed", "--cpu", "--quick",
           "--gpus", "1,2", "--out", str(out), "--timeout", "240", "--collective-timeout", "60"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads((out / "distributed.json").read_text())
    for key in ("sweep", "date_utc", "command", "seed", "quick", "cpu", "gpu_counts",
                "experiments", "skipped", "sizes", "environment", "results", "acceptance", "runs"):
        assert key in doc, key
    assert doc["sweep"] == "distributed" and doc["cpu"] and doc["gpu_counts"] == [1, 2]
    assert "tsm_core.bench distributed --cpu" in doc["command"]
    env = doc["environment"]
    for key in ("git_commit", "torch", "nccl", "host", "python"):
        assert key in env, key
    assert [r["status"] for r in doc["runs"]] == ["ok", "ok"]
    assert [len(r["ranks"]) for r in doc["runs"]] == [1, 2]
    ar = doc["results"]["allreduce"]
    assert [r["gpus"] for r in ar] == [1, 2]
    assert all(r["latency_s"] > 0 and r["bytes"] == 4 * (1024 * 128 + 1024 + 1) for r in ar)
    pr = doc["results"]["products"]
    assert [r["gpus"] for r in pr] == [1, 2]
    assert all(r["max_rel_err"] < 1e-5 and r["aggregate_gbps"] > 0 for r in pr)
    assert pr[0]["efficiency"] == pytest.approx(1.0)
    assert {"h2d", "streamed"} <= set(doc["skipped"])  # GPU only
    if doc["kmeans_distributed"]:
        I, I2 = doc["sizes"]["iters"]
        repeats = doc["sizes"]["repeats"]
        for name in ("strong", "weak"):
            rows = doc["results"][name]
            assert [r["gpus"] for r in rows] == [1, 2], rows
            for r in rows + [rows[0]["single"]]:
                # The direct clock: every timed fit's iterations past the first two.
                assert "clock_error" not in r, r
                assert r["per_iter_samples"] == repeats * (I - 2 + I2 - 2)
                assert 0 < r["per_iter_min_s"] <= r["per_iter_s"] <= r["per_iter_max_s"]
                # the difference of fits: a number (mostly noise here, maybe negative)
                assert isinstance(r.get("per_iter_fits_s"), float), r
            assert "efficiency" in rows[1]
            # the difference of fits gets its figure only where it came out positive
            # (on a loaded CPU host it may not: that noise is why the direct clock exists)
            single = rows[0].get("single") or {}
            t1 = single.get("per_iter_fits_s") if single.get("per_iter_s") else rows[0].get("per_iter_fits_s")
            t2 = rows[1].get("per_iter_fits_s")
            assert ("efficiency_fits" in rows[1]) == bool(t1 and t1 > 0 and t2 and t2 > 0)
        for run in doc["runs"]:  # each rank timed each iteration of each fit
            for rk in run["ranks"]:
                rec = rk["strong"]
                assert rec["clock"] == "ok" and "clock_missing" not in rec, rec
                assert [len(e) for e in rec["ends_I"]] == [rec["n_iter_I"]] * repeats
                assert all(0 < a < b for e in rec["ends_I"] for a, b in zip(e, e[1:]))
        assert "median iteration" in p.stdout and "iterations" in p.stdout
    else:  # this version's TSMKMeans takes no `distributed`: recorded, not run
        assert "distributed" in doc["skipped"]["strong"]
    assert set(doc["acceptance"]) == set(D.ACCEPT)
    assert (out / "distributed.png").stat().st_size > 10_000
    assert "allreduce" in p.stdout and "distributed: products_efficiency" in p.stdout


def _ends(n, per_iter, first=0.3, slow=None):
    """Iteration end times of a fit of `n` iterations from its start: `first`
    seconds before the first iteration's end (setup), iteration 1 twice as long as
    the rest, and `slow` = (i, seconds) added to iteration i."""
    ends, t = [], first
    for i in range(n):
        t += per_iter * (2 if i == 1 else 1) + (slow[1] if slow and slow[0] == i else 0.0)
        ends.append(t)
    return ends


def _fits(per_iter, fixed=0.5, fixed_short=None, slow=None):
    """Fits of I = 10 and I2 = 4 iterations: `fixed` + their iterations' time (the
    short fits' fixed part `fixed_short`), their iteration end times."""
    fs = fixed if fixed_short is None else fixed_short
    eI, eI2 = _ends(10, per_iter, slow=slow), _ends(4, per_iter, slow=slow)
    return dict(iters=[10, 4], t_I=[fixed + eI[-1]], t_I2=[fs + eI2[-1]], n_iter_I=10, n_iter_I2=4,
                ends_I=[eI], ends_I2=[eI2], clock="ok")


def _rank(world, rank, per_iter, *, n_local, single=None):
    """A rank's records as the workers write them; k-means fits from `_fits`."""
    km = dict(n_local=n_local, d=128, k=1024, x_bytes=n_local * 512, budget_bytes=1 << 28,
              precision=None, **_fits(per_iter))
    if single is not None:
        km["single"] = _fits(single)
    return dict(
        rank=rank, world=world,
        allreduce=dict(bytes=528388, median_s=40e-6 + 5e-6 * world, min_s=30e-6, samples=100,
                       batched_s=30e-6),
        h2d=dict(bytes=1 << 30, reps=4, concurrent_s=(1 << 30) / (55e9 if world == 1 else 34e9),
                 alone_s=(1 << 30) / 55e9 if rank == 0 else None),
        strong=dict(km, n_local=40_000_000 // world),
        weak=dict(km),
        streamed=dict(km, x_bytes=5_120_000_000, **_fits(5.12e9 / (33e9 if world > 1 else 52e9))),
        products=dict(m=32768, k=16384, n=8, bytes=2_147_876_864, rel_err=1e-7,
                      time_s=2_147_876_864 / (3e12 if world == 1 else 2.9e12),
                      time_validated_s=7e-4, matmul_s=7e-4),
    )


def _runs():
    runs = []
    for G, t in ((1, 0.200), (2, 0.104), (4, 0.0535)):
        ranks = [_rank(G, r, t, n_local=10_000_000, single=0.199 if G == 1 else None)
                 for r in range(G)]
        for rk in ranks:  # weak scaling: 1e7 points per rank, a little slower with G
            rk["weak"].update(_fits(0.05 * (1 + 0.01 * G)))
            if G == 1:
                rk["weak"]["single"] = _fits(0.0498)
        runs.append(dict(world=G, status="ok", exit_codes=[0] * G, elapsed_s=1.0, ranks=ranks))
    return runs


def test_combine_speedups_and_acceptance(tmp_path):
    res = D.combine(_runs())
    strong = {r["gpus"]: r for r in res["strong"]}
    assert strong[1]["per_iter_s"] == pytest.approx(0.200)
    assert strong[1]["baseline"] == "single-process fit"
    assert strong[2]["speedup"] == pytest.approx(0.199 / 0.104)
    assert strong[4]["efficiency"] == pytest.approx(0.199 / 0.0535 / 4)
    weak = {r["gpus"]: r for r in res["weak"]}
    assert weak[4]["ratio_to_1"] == pytest.approx(0.05 * 1.04 / 0.0498)
    h2d = {r["gpus"]: r for r in res["h2d"]}
    assert h2d[4]["per_gpu_gbps_min"] == pytest.approx(34.0)
    assert h2d[4]["aggregate_gbps"] == pytest.approx(136.0)
    assert h2d[4]["alone_gbps"] == pytest.approx(55.0)
    st = {r["gpus"]: r for r in res["streamed"]}
    assert st[4]["aggregate_gbps"] == pytest.approx(4 * 33.0)
    assert st[4]["frac_h2d"] == pytest.approx(33.0 / 34.0)
    pr = {r["gpus"]: r for r in res["products"]}
    assert pr[4]["efficiency"] == pytest.approx(2.9 / 3.0)
    acc = D.acceptance(res)
    assert acc["strong_speedup_2"]["pass"] is True and acc["strong_speedup_4"]["pass"] is True
    assert acc["weak_ratio_4"]["pass"] is True  # 0.052 / 0.0498 = 1.044 <= 1.08
    assert acc["weak_ratio_4"]["value"] == pytest.approx(weak[4]["ratio_to_1"])
    assert acc["streamed_frac_h2d"]["pass"] is True
    assert acc["products_efficiency"]["pass"] is True
    doc = dict(results=res, acceptance=acc, environment=dict(gpu="H100", git_commit="abc"),
               date_utc="2026-01-01T00:00:00Z", skipped={})
    assert (D.plot(doc, tmp_path / "d.png")).stat().st_size > 10_000
    table = D.format_table(doc)
    assert "strong" in table and "PASS distributed: strong_speedup_2" in table


def test_missing_runs_leave_acceptance_open():
    runs = _runs()[:1]
    runs[0]["ranks"][0]["products"] = {"error": "RuntimeError: out of memory"}
    res = D.combine(runs)
    assert res["products"] == [dict(gpus=1, error="rank 0: RuntimeError: out of memory")]
    acc = D.acceptance(res)
    assert acc["strong_speedup_2"]["pass"] is None and acc["products_efficiency"]["pass"] is None


def test_direct_clock_slowest_rank_and_fixed_parts():
    """The direct figure drops the first two iterations, takes the slowest rank of
    each iteration and ignores the fits' fixed parts; the difference of fits does not."""
    t = 0.1
    ranks = [dict(rank=r, world=2, weak=dict(n_local=1000, d=8, k=4, precision=None,
                                               **_fits(t, fixed=0.5, fixed_short=1.3,
                                                       slow=(5, 0.05) if r == 1 else None)))
             for r in range(2)]
    row = D.combine([dict(world=2, status="ok", exit_codes=[0, 0], elapsed_s=1.0, ranks=ranks)])["weak"][0]
    assert row["per_iter_samples"] == (10 - 2) + (4 - 2)
    assert row["per_iter_s"] == pytest.approx(t)
    assert row["per_iter_min_s"] == pytest.approx(t)
    assert row["per_iter_max_s"] == pytest.approx(t + 0.05)  # rank 1's slow iteration
    # (t(10) - t(4)) / 6 carries the fixed parts' difference, -0.8 s over 6 iterations
    assert row["per_iter_fits_s"] == pytest.approx(t + (0.05 - 0.8) / 6)
    assert "clock_error" not in row


def _streamed_runs(per_rank_gbps):
    """1- and 2-GPU runs whose streamed shards go at `per_rank_gbps` (G -> GB/s a rank,
    by the direct clock) against 52 / 34 GB/s a GPU of concurrent copies; the fits'
    fixed parts differ by 0.5 s."""
    runs = _runs()[:2]
    for run in runs:
        G = run["world"]
        for rk in run["ranks"]:
            rk["streamed"].update(_fits(5.12e9 / (per_rank_gbps[G] * 1e9), fixed=0.5, fixed_short=1.0))
            rk["h2d"]["concurrent_s"] = (1 << 30) / ((52e9 if G == 1 else 34e9))
    return runs


def test_streamed_above_the_copy_rate_is_suspect():
    res = D.combine(_streamed_runs({1: 50.0, 2: 38.0}))  # 2 GPUs: 38 / 34 = 1.12
    st = {r["gpus"]: r for r in res["streamed"]}
    assert st[1]["frac_h2d"] == pytest.approx(50 / 52) and "suspect" not in st[1]
    assert st[2]["frac_h2d"] == pytest.approx(38 / 34)
    assert st[2]["suspect"] == "above the copy rate: measurement suspect"
    # the difference of fits: the 0.5 s of fixed parts over 6 iterations, kept beside it
    assert st[1]["per_iter_fits_s"] == pytest.approx(5.12 / 50 - 0.5 / 6)
    assert st[1]["frac_h2d_fits"] > st[1]["frac_h2d"]
    acc = D.acceptance(res)["streamed_frac_h2d"]
    assert acc["pass"] is None and acc["suspect"] == {2: pytest.approx(38 / 34)}
    assert "measurement suspect" in acc["note"]
    doc = dict(results=res, acceptance=D.acceptance(res), skipped={})
    table = D.format_table(doc)
    assert "ABOVE THE COPY RATE: MEASUREMENT SUSPECT" in table
    assert "n/a  distributed: streamed_frac_h2d" in table and "measurement suspect" in table
    # A failure stays a failure, suspect figure or not.
    res = D.combine(_streamed_runs({1: 40.0, 2: 38.0}))
    assert D.acceptance(res)["streamed_frac_h2d"]["pass"] is False
    # Within 1.05 of the copy rate: a plain pass.
    res = D.combine(_streamed_runs({1: 50.0, 2: 34.5}))
    acc = D.acceptance(res)["streamed_frac_h2d"]
    assert acc["pass"] is True and "suspect" not in acc


def test_clock_mismatch_leaves_the_figure_open():
    runs = _runs()[:2]
    rec = runs[1]["ranks"][1]["strong"]
    rec["ends_I"], rec["clock"] = [None], "9 iteration ends for n_iter_ = 10"
    res = D.combine(runs)
    row = {r["gpus"]: r for r in res["strong"]}[2]
    assert row["per_iter_s"] is None and row["clock_error"] == rec["clock"]
    assert row["speedup_fits"] == pytest.approx(0.199 / 0.104)  # the fits' figure stays
    assert "speedup" not in row
    assert D.acceptance(res)["strong_speedup_2"]["pass"] is False
    assert "no direct clock" in D.format_table(dict(results=res, acceptance={}, skipped={}))


def test_iteration_times():
    assert D.iteration_times([1.0, 1.5, 1.75, 2.0]) == [0.25, 0.25]
    assert D.iteration_times([1.0, 2.0]) == []
    assert D.iteration_times([1.0, 1.5, 1.75], drop=1) == [0.5, 0.25]


@pytest.fixture
def clock():
    """The bench's iteration clock, installed in this process for one test."""
    D.CLOCK.install()
    yield D.CLOCK
    D.CLOCK.uninstall()


def _blobs_and_far_centre():
    """Two blobs and three initial centres, one far from every point: its cluster is
    empty after the first assignment (a relocation)."""
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((300, 3)), rng.standard_normal((200, 3)) + 8.0])
    return X, np.ones(len(X)), np.array([[0.0, 0, 0], [8.0, 8, 8], [1e3, 1e3, 1e3]])


def _timed(fn):
    D.CLOCK.start()
    try:
        n = fn()
    finally:
        ends = D.CLOCK.stop()
    return n, ends


def test_iteration_clock_counts_each_iteration_once(clock, monkeypatch):
    from tsm_apps.kmeans import _cpu

    assert clock.missing == [] and len(clock.installed) == len(D._CLOCK_TARGETS)
    X, w, C0 = _blobs_and_far_centre()
    relocations = []
    orig = _cpu.relocate_empty
    monkeypatch.setattr(_cpu, "relocate_empty", lambda *a: relocations.append(1) or orig(*a))
    for engine in ("numpy", "sklearn"):
        (labels, _, centers, n_iter), ends = _timed(lambda: _cpu.lloyd(X, w, C0, max_iter=20, engine_=engine))
        assert len(ends) == n_iter >= 2 and ends == sorted(ends), engine
        assert len(np.unique(labels)) == 3, engine  # the far centre took points
    assert relocations  # the numpy engine relocated in its first iteration
    # A read that returns None (finalize's wait=False) ends no iteration; nested reads count once.
    calls = []
    read = clock._read(lambda self, wait=True: calls.append(wait) or ((1, 0, 1) if wait else None))
    outer = clock._read(lambda self: read(self) and read(self))
    _, ends = _timed(lambda: [read(None, False), read(None), outer(None)])
    assert len(ends) == 2 and calls == [False, True, True, True]
    # After a relocation the iteration's second read replaces the first.
    reloc = clock._relocate(lambda self: None)
    _, ends = _timed(lambda: [read(None), reloc(None), read(None), read(None)])
    assert len(ends) == 2


def test_iteration_clock_in_a_group_of_one(clock, tmp_path, monkeypatch):
    """The group's steps (an allreduce in each update, nesting the rank's own) over
    gloo in this process, with a relocation: one end an iteration."""
    import torch.distributed as dist

    from tsm_apps.kmeans._cpu import CpuSteps
    from tsm_core.distributed import Comm
    from tsm_core.kmeans.distributed import DistributedSteps, lloyd_distributed

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    relocations = []
    timed = DistributedSteps.relocate_empty  # the clock's wrapper
    monkeypatch.setattr(DistributedSteps, "relocate_empty",
                        lambda *a, **kw: relocations.append(1) or timed(*a, **kw))
    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "store"), rank=0, world_size=1)
    try:
        X, w, C0 = _blobs_and_far_centre()
        comm = Comm(timeout=30)
        agr = comm.agree(n=len(X), d=3, dtype=X.dtype)
        steps = CpuSteps(X, w, C0)
        n_iter, ends = _timed(lambda: lloyd_distributed(steps, comm, agr, gpu=False, max_iter=20))
        assert len(ends) == n_iter >= 2 and relocations
        assert len(np.unique(steps.labels)) == 3
    finally:
        dist.destroy_process_group()


def test_iteration_clock_uninstalls():
    from tsm_apps.kmeans._cpu import CpuSteps
    from tsm_core.kmeans.lloyd import _GpuSteps

    before = (CpuSteps.update, _GpuSteps.status_wait)
    D.CLOCK.install()
    assert CpuSteps.update.__wrapped__ is before[0] and _GpuSteps.status_wait.__wrapped__ is before[1]
    D.CLOCK.uninstall()
    assert (CpuSteps.update, _GpuSteps.status_wait) == before and D.CLOCK.installed == []

"""``python -m tsm_core.bench distributed``: the harness on the CPU (gloo processes,
tiny sizes) end to end, and its arithmetic (per-iteration times, speedups,
efficiencies, acceptance) on hand-made rank records."""

from __future__ import annotations

import json
import subprocess
import sys

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
        for name in ("strong", "weak"):
            rows = doc["results"][name]
            assert [r["gpus"] for r in rows] == [1, 2], rows
            # a number (at these tiny sizes it is mostly noise, and may even be negative)
            assert all(isinstance(r.get("per_iter_s"), float) for r in rows), rows
            assert "single" in rows[0] and "efficiency" in rows[1]
    else:  # this version's TSMKMeans takes no `distributed`: recorded, not run
        assert "distributed" in doc["skipped"]["strong"]
    assert set(doc["acceptance"]) == set(D.ACCEPT)
    assert (out / "distributed.png").stat().st_size > 10_000
    assert "allreduce" in p.stdout and "distributed: products_efficiency" in p.stdout


def _rank(world, rank, per_iter, *, n_local, fixed=0.5, single=None):
    """A rank's records as the workers write them: fits of I = 10 and I2 = 4
    iterations that take `fixed` + iterations x `per_iter` seconds."""
    def fits(t):
        return dict(iters=[10, 4], t_I=[fixed + 10 * t], t_I2=[fixed + 4 * t],
                    n_iter_I=10, n_iter_I2=4)

    km = dict(n_local=n_local, d=128, k=1024, x_bytes=n_local * 512, budget_bytes=1 << 28,
              precision=None, **fits(per_iter))
    if single is not None:
        km["single"] = fits(single)
    return dict(
        rank=rank, world=world,
        allreduce=dict(bytes=528388, median_s=40e-6 + 5e-6 * world, min_s=30e-6, samples=100,
                       batched_s=30e-6),
        h2d=dict(bytes=1 << 30, reps=4, concurrent_s=(1 << 30) / (55e9 if world == 1 else 34e9),
                 alone_s=(1 << 30) / 55e9 if rank == 0 else None),
        strong=dict(km, n_local=40_000_000 // world),
        weak=dict(km),
        streamed=dict(km, x_bytes=5_120_000_000, **fits(5.12e9 / (33e9 if world > 1 else 52e9))),
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
            rk["weak"].update(t_I=[0.5 + 10 * 0.05 * (1 + 0.01 * G)],
                              t_I2=[0.5 + 4 * 0.05 * (1 + 0.01 * G)])
            if G == 1:
                rk["weak"]["single"] = dict(rk["weak"]["single"], t_I=[0.5 + 10 * 0.0498],
                                            t_I2=[0.5 + 4 * 0.0498])
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

"""tsm_core.bench without a GPU: command line, shape lists, timing statistics,
summaries and acceptance fields, the JSON document, and figures from synthetic data."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tsm_core import bench
from tsm_core.runtime import timing as _timing

READ_BW = 3.0e12
ENV = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_slug": "h100", "l2_bytes": 50 << 20}
BANDWIDTH = {"read_bw": READ_BW, "copy_bw": 2.9e12}


# --- synthetic records, built with the same helpers the GPU sweeps use ----------


def method(nbytes, t, err=1e-7):
    """What _measure records for one method that ran and was right."""
    return dict(rel_err=err, correct=True, median_s=t, min_s=0.98 * t, max_s=1.05 * t,
                q1_s=0.99 * t, q3_s=1.01 * t, iqr_s=0.02 * t, reps=20, batch=1, host_s=2e-5,
                gbps=nbytes / t / 1e9, frac_read_bw=nbytes / t / READ_BW)


def record(dtype, order, m, k, n, fracs):
    """A record whose methods ran at the given fractions of the read bandwidth."""
    nbytes = (m * k + k * n + m * n) * np.dtype(dtype).itemsize
    methods = {name: method(nbytes, nbytes / (f * READ_BW)) for name, f in fracs.items()}
    return dict(dtype=dtype, order=order, m=m, k=k, n=n, bytes=nbytes, sets=1,
                orders=[order, order], methods=methods)


def cases(shapes):
    return [(d, o, s) for d in bench.DTYPES for o in bench.ORDERS for s in shapes]


def tsm2r_records(frac=0.93, cublas=0.3):
    recs = []
    for d, o, (m, k, n) in cases(bench.tsm2r_shapes()):
        r = record(d, o, m, k, n, {"tsm2r": frac, "cublas": cublas})
        t = r["methods"]["tsm2r"]["median_s"]
        bench._headline(r, ["tsm2r"], {"algorithm": "tsm2r", "version": 3,
                                       "predicted_time_s": 1.1 * t})
        recs.append(r)
    return recs


def tsm2l_records():
    recs = []
    for d, o, (m, k, n) in cases(bench.tsm2l_shapes()):
        r = record(d, o, m, k, n, {"tsm2l_opt1": 0.85, "tsm2l_opt2": 0.9, "cublas": 0.4,
                                   "matmul": 0.4})
        t = r["methods"]["tsm2l_opt2"]["median_s"]
        bench._headline(r, ["tsm2l_opt1", "tsm2l_opt2"],
                        {"algorithm": "tsm2l", "version": 2, "predicted_time_s": 0.9 * t})
        bench._floor_fields(r, t / 1.1, 1e30)  # a floor 1/1.1 of the best time
        recs.append(r)
    return recs


def ablation_records(v3=0.93):
    recs = []
    for d, o, (m, k, n) in cases(bench.ablation_shapes()):
        r = record(d, o, m, k, n, {"tsm2r_v0": 0.02, "tsm2r_v1": 0.3, "tsm2r_v2": 0.6,
                                   "tsm2r_v3": v3, "cublas": 0.5})
        bench._headline(r, ["tsm2r_v3"], {"algorithm": "tsm2r"})
        bench._ablation_fields(r)
        recs.append(r)
    return recs


def dispatch_records(worst=1.02):
    recs = []
    for i, c in enumerate(bench.dispatch_cases(quick=True)):
        ratio = worst if i == 3 else 1.0
        r = record(c["dtype"], c["order"], c["m"], c["k"], c["n"],
                   {"matmul": 0.5 / ratio, "cupy": 0.5})
        bench._dispatch_fields(r, {"algorithm": "cublas" if c["n"] > 64 else "tsm2r"})
        recs.append(r)
    return recs


RECORDS = {"tsm2r": tsm2r_records, "tsm2l": tsm2l_records, "ablation": ablation_records,
           "dispatch": dispatch_records}


def document(sweep, records=None):
    records = RECORDS[sweep]() if records is None else records
    return bench.make_document(sweep, records, env=ENV, bandwidth=BANDWIDTH,
                               command=f"python -m tsm_core.bench {sweep}", seed=0,
                               elapsed_s=1.0)


# --- command line -------------------------------------------------------------


def test_help_and_import_need_no_gpu():
    r = subprocess.run([sys.executable, "-m", "tsm_core.bench", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "tsm2r" in r.stdout and "dispatch" in r.stdout
    r = subprocess.run([sys.executable, "-c",
                        "import sys, tsm_core.bench; print('cupy' in sys.modules)"],
                       capture_output=True, text=True)
    assert r.stdout.strip() == "False", "importing tsm_core.bench must not import CuPy"


def test_parser_defaults():
    p = bench.build_parser()
    a = p.parse_args(["tsm2r"])
    assert (a.command, a.dtype, a.order, a.reps, a.out, a.seed, a.quick, a.no_plot) == \
        ("tsm2r", "both", "both", 20, None, 0, False, False)
    assert not hasattr(a, "full")
    a = p.parse_args(["ablation"])
    assert a.full is False
    a = p.parse_args(["all", "--full", "--quick", "--dtype", "float32", "--order", "F",
                      "--reps", "5", "--out", "x", "--seed", "3"])
    assert (a.full, a.quick, a.dtype, a.order, a.reps, a.out, a.seed) == \
        (True, True, "float32", "F", 5, "x", 3)
    a = p.parse_args(["plot", "a.json", "b.json"])
    assert [str(j) for j in a.json] == ["a.json", "b.json"]


@pytest.mark.parametrize("argv", [[], ["tsm2r", "--dtype", "float16"], ["tsm2r", "--order", "K"],
                                  ["tsm2r", "--full"], ["nosuch"], ["plot"]])
def test_parser_refuses(argv):
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(argv)


@pytest.mark.parametrize("cmd", list(bench.SWEEPS) + ["all"])
def test_no_gpu_exits_2(cmd, monkeypatch, capsys):
    monkeypatch.setattr(bench, "has_gpu", lambda: False)
    assert bench.main([cmd]) == 2
    assert "tsm_core.bench needs a CUDA GPU; found none" in capsys.readouterr().err


# --- shape lists ----------------------------------------------------------------


def test_tsm2r_and_ablation_shapes():
    full = bench.tsm2r_shapes()
    assert len(full) == 12 and all(m == k for m, k, _ in full)
    assert {m for m, _, _ in full} == {10240, 20480, 30720}
    assert {n for _, _, n in full} == {2, 4, 8, 16}
    assert set(bench.tsm2r_shapes(quick=True)) < set(full)
    assert set(bench.ablation_shapes()) == {(m, m, n) for m in (10240, 20480) for n in (2, 8, 16)}
    assert bench.ablation_shapes(full=True) == full


def test_tsm2l_floor_fields():
    r = tsm2l_records()[0]
    assert r["floor_ratio"] == pytest.approx(1.1) and r["ours_floor_ratio"] == r["floor_ratio"]
    assert r["matmul_vs_cublas"] == pytest.approx(1.0)
    fl = bench.summarize("tsm2l", tsm2l_records())["floor"]
    assert fl["max_ratio"] == pytest.approx(1.1) and fl["n_within"] == fl["n"] == 48


def test_tsm2l_shapes():
    s = bench.tsm2l_shapes()
    assert len(s) == 12 and all(k == n for _, k, n in s)
    assert {m for m, _, _ in s} == {10**4, 10**5, 10**6, 10**7}
    assert set(bench.tsm2l_shapes(quick=True)) < set(s)


def test_dispatch_cases():
    c = bench.dispatch_cases(seed=0)
    assert 60 <= len(c) <= 100
    assert c == bench.dispatch_cases(seed=0), "seeded: the same list every time"
    assert c != bench.dispatch_cases(seed=1)
    shapes = {(x["m"], x["k"], x["n"]) for x in c}
    assert {(s, s, s) for s in (64, 128, 256, 512, 1024, 2048, 4096, 8192)} <= shapes
    assert {x["n"] for x in c} >= set(bench.DISPATCH_N)
    pairs = {(d, o): 0 for d in bench.DTYPES for o in bench.ORDERS}
    for x in c:
        assert min(x["m"], x["k"], x["n"]) >= 1 and x["m"] * x["k"] <= 1 << 28
        pairs[(x["dtype"], x["order"])] += 1
    assert min(pairs.values()) == len(c) // 4
    ks = [x["k"] for x in c]
    ms = [x["m"] for x in c]
    assert min(ks) <= 8 and max(ks) >= 65536 and min(ms) <= 64 and max(ms) >= 1 << 20
    q = bench.dispatch_cases(seed=0, quick=True)
    assert 0 < len(q) < len(c) and all(x in c for x in q)


# --- pure helpers ---------------------------------------------------------------


def test_geomean():
    assert bench.geomean([1, 4]) == pytest.approx(2.0)
    assert bench.geomean([2, None, 8]) == pytest.approx(4.0)
    assert bench.geomean([]) is None and bench.geomean([0, -1, None]) is None


@pytest.mark.parametrize("name, slug", [("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA H100 PCIe", "h100"),
                                        ("NVIDIA A100-SXM4-40GB", "nvidia-a100-sxm4-40gb"),
                                        ("Tesla V100 (16 GB)", "tesla-v100-16-gb")])
def test_gpu_slug(name, slug):
    assert bench.gpu_slug(name) == slug


def test_timing_summary():
    t = _timing.summarize([4.0, 1.0, 3.0, 2.0, 5.0], batch=2, host_s=1e-5)
    assert (t.median_s, t.min_s, t.max_s, t.q1_s, t.q3_s) == (1.5, 0.5, 2.5, 1.0, 2.0)
    assert t.iqr_s == 1.0 and t.reps == 5 and t.batch == 2
    d = t.to_dict()
    assert d["iqr_s"] == 1.0 and d["host_s"] == 1e-5
    one = _timing.summarize([3e-3])
    assert one.median_s == one.q1_s == one.q3_s == 3e-3 and one.iqr_s == 0
    with pytest.raises(ValueError):
        _timing.summarize([])


@pytest.mark.parametrize("nbytes", [1, 1000, 17_000, 10 << 20, 100 << 20, 7 << 30])
def test_sets_needed_exceeds_twice_l2(nbytes):
    l2 = 50 << 20
    n = _timing.sets_needed(nbytes, l2, max_sets=10**9)
    assert n * nbytes > 2 * l2 and (n == 1 or (n - 1) * nbytes <= 2 * l2)


def test_sets_needed_limits():
    assert _timing.sets_needed(8, 50 << 20) == 16384
    with pytest.raises(ValueError):
        _timing.sets_needed(0, 1)


def test_rotating_inputs_and_cycling():
    sets = _timing.rotating_inputs(lambda i: (i, -i), bytes_per_set=40, l2_bytes=100)
    assert sets == [(i, -i) for i in range(6)]
    seen = []
    f = _timing.cycling(lambda a, b: seen.append(a), sets[:3])
    for _ in range(7):
        f()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


# --- summaries and acceptance ---------------------------------------------------

ACCEPT_FIELDS = {
    "tsm2r": {"tsm2r_frac_bw_m_ge_20480", "tsm2r_frac_bw_m_10240",
              "tsm2r_fp32_geomean_speedup_C", "tsm2r_fp32_geomean_speedup_F",
              "tsm2r_fp64_min_speedup", "tsm2r_max_pred_err", "correctness_failures"},
    "tsm2l": {"tsm2l_frac_bw_m_1e7", "tsm2l_geomean_speedup", "tsm2l_max_pred_err",
              "tsm2l_within_1_15", "tsm2l_within_1_15_default", "tsm2l_matmul_vs_cublas",
              "correctness_failures"},
    "ablation": {"ablation_v3_not_fastest", "correctness_failures"},
    "dispatch": {"dispatch_max_ratio", "correctness_failures"},
}


@pytest.mark.parametrize("sweep", bench.SWEEPS)
def test_document_schema(sweep):
    doc = document(sweep)
    assert {"sweep", "date_utc", "command", "seed", "complete", "environment", "bandwidth",
            "records", "summary"} <= set(doc)
    assert doc["sweep"] == sweep and doc["date_utc"].endswith("Z")
    json.dumps(doc, allow_nan=False)  # strict JSON
    acc = doc["summary"]["acceptance"]
    assert set(acc) == ACCEPT_FIELDS[sweep]
    for e in acc.values():
        assert {"value", "op", "threshold", "pass"} <= set(e) and e["pass"] is True
    assert doc["summary"]["all_pass"] is True


def test_tsm2r_summary_figures():
    s = document("tsm2r")["summary"]
    assert s["geomean_speedup"]["float32"] == pytest.approx(0.93 / 0.3)
    assert set(s["geomean_speedup_by_order"]) == {"float32/C", "float32/F", "float64/C",
                                                  "float64/F"}
    assert s["min_frac_read_bw"]["float64/F"]["30720"] == pytest.approx(0.93)
    assert s["max_pred_err"] == pytest.approx(0.1)
    acc = s["acceptance"]
    assert acc["tsm2r_frac_bw_m_ge_20480"]["value"] == pytest.approx(0.93)
    assert acc["tsm2r_fp64_min_speedup"]["value"] == pytest.approx(0.93 / 0.3)
    assert len(acc["tsm2r_max_pred_err"]["by"]) == 48


def test_tsm2r_acceptance_failures():
    recs = tsm2r_records()
    slow = next(r for r in recs if r["m"] == 20480 and r["dtype"] == "float32")
    for f in ("frac_read_bw", "gbps"):
        slow[f] *= 0.85 / 0.93
    s = document("tsm2r", recs)["summary"]["acceptance"]
    assert s["tsm2r_frac_bw_m_ge_20480"]["pass"] is False
    assert s["tsm2r_frac_bw_m_10240"]["pass"] is True

    recs = tsm2r_records(frac=0.93, cublas=0.99)  # slower than cuBLAS in fp64
    s = document("tsm2r", recs)["summary"]["acceptance"]
    assert s["tsm2r_fp64_min_speedup"]["pass"] is False
    assert s["tsm2r_fp32_geomean_speedup_C"]["pass"] is False


def test_failed_and_wrong_methods_fail_loudly():
    recs = tsm2r_records()
    recs[0]["methods"]["tsm2r"] = {"error": "CUDARuntimeError: illegal address"}
    bench._headline(recs[0], ["tsm2r"], {})
    recs[1]["methods"]["tsm2r"].update(rel_err=float("nan"), correct=False)
    recs[2]["error"] = "OutOfMemoryError: out of memory"
    doc = document("tsm2r", recs)
    json.dumps(doc, allow_nan=False)
    acc = doc["summary"]["acceptance"]
    fails = acc["correctness_failures"]
    assert fails["value"] == 3 and fails["pass"] is False and len(fails["by"]) == 3
    assert acc["tsm2r_frac_bw_m_10240"]["pass"] is False
    assert acc["tsm2r_frac_bw_m_10240"]["missing"] == 1
    assert doc["records"][1]["methods"]["tsm2r"]["rel_err"] is None  # NaN, cleaned
    assert doc["summary"]["all_pass"] is False


def test_not_measured_is_not_a_pass_or_a_fail():
    recs = [r for r in tsm2r_records() if r["dtype"] == "float32"]
    acc = document("tsm2r", recs)["summary"]["acceptance"]
    assert acc["tsm2r_fp64_min_speedup"]["pass"] is None
    assert acc["tsm2r_fp64_min_speedup"]["value"] is None


def test_tsm2l_headline_takes_the_faster_opt():
    doc = document("tsm2l")
    assert all(r["best"] == "tsm2l_opt2" for r in doc["records"])
    assert doc["summary"]["best_counts"] == {"tsm2l_opt2": 48}
    speedup = doc["summary"]["acceptance"]["tsm2l_geomean_speedup"]["value"]
    assert speedup == pytest.approx(0.9 / 0.4)
    assert doc["records"][0]["pred_vs"] == "tsm2l_opt2"


def test_ablation_v3_must_be_fastest():
    acc = document("ablation", ablation_records(v3=0.5))["summary"]["acceptance"]
    assert acc["ablation_v3_not_fastest"]["pass"] is False
    assert acc["ablation_v3_not_fastest"]["value"] == 24


def test_dispatch_max_ratio():
    s = document("dispatch")["summary"]
    assert s["max_ratio"] == pytest.approx(1.02) and s["acceptance"]["dispatch_max_ratio"]["pass"]
    s = document("dispatch", dispatch_records(worst=1.2))["summary"]
    e = s["acceptance"]["dispatch_max_ratio"]
    assert e["pass"] is False and e["value"] == pytest.approx(1.2) and len(e["by"]) == 1


@pytest.mark.parametrize("sweep", bench.SWEEPS)
def test_table(sweep):
    doc = document(sweep)
    text = bench.format_table(doc)
    lines = text.splitlines()
    assert len(lines) >= len(doc["records"]) + 1 + len(doc["summary"]["acceptance"])
    assert "PASS" in text and "FAIL" not in text and "3000 GB/s" in text


# --- figures ----------------------------------------------------------------------

FIGURES = {"tsm2r": ["tsm2r_speedup.png", "tsm2r_bandwidth.png"],
           "tsm2l": ["tsm2l_speedup.png", "tsm2l_bandwidth.png"],
           "ablation": ["ablation_bandwidth.png"], "dispatch": ["dispatch_ratio.png"]}


@pytest.mark.parametrize("sweep", bench.SWEEPS)
def test_plot_from_json(sweep, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"{sweep}.json"
    path.write_text(json.dumps(document(sweep), allow_nan=False))
    assert bench.main(["plot", str(path)]) == 0
    for name in FIGURES[sweep]:
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(png) in capsys.readouterr().out or png.stat().st_size > 10_000


def test_plot_survives_missing_values(tmp_path):
    pytest.importorskip("matplotlib")
    from tsm_core.bench import _plots

    recs = tsm2r_records()
    for r in recs[:5]:
        r["methods"]["tsm2r"] = {"error": "x"}
        bench._headline(r, ["tsm2r"], {})
    paths = _plots.plot_document(document("tsm2r", recs), tmp_path)
    assert all(p.exists() for p in paths) and len(paths) == 2


def test_operand_sets_layout(monkeypatch):
    # numpy stands in for CuPy (same random and array API): one pool, every operand
    # 256-byte aligned within it, A and B in the asked order, C C-ordered, as many
    # sets as sets_needed says, each set the next per_set elements of the pool.
    monkeypatch.setattr(_timing, "_cupy", lambda: np)
    m, k, n, l2 = 5, 3, 2, 1000
    sets = _timing.operand_sets(m, k, n, np.float32, "F", seed=7, l2_bytes=l2)
    per_set = 3 * 64  # three operands, each padded to 64 float32 (256 bytes)
    assert len(sets) == _timing.sets_needed(per_set * 4, l2) == 3
    pool = np.random.default_rng(7).standard_normal(len(sets) * per_set, dtype=np.float32)
    for i, (A, B, C) in enumerate(sets):
        assert A.shape == (m, k) and B.shape == (k, n) and C.shape == (m, n)
        assert A.flags.f_contiguous and B.flags.f_contiguous and C.flags.c_contiguous
        base = i * per_set
        np.testing.assert_array_equal(A, pool[base:base + m * k].reshape(k, m).T)
        np.testing.assert_array_equal(B, pool[base + 64:base + 64 + k * n].reshape(n, k).T)
        np.testing.assert_array_equal(C, pool[base + 128:base + 128 + m * n].reshape(m, n))
    A, B, _ = _timing.operand_sets(m, k, n, np.float64, "C", seed=7, l2_bytes=l2)[0]
    assert A.flags.c_contiguous and B.flags.c_contiguous


def test_batched_bounds(tmp_path):
    """dev/batched_bounds.py: each geomean is baseline / max(host time, time at
    the float32 peak), cell by cell, and the committed run's file parses."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "dev" / "batched_bounds.py"
    spec = importlib.util.spec_from_file_location("batched_bounds", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    peak = 1e12  # 1 TFLOP/s: 1 GFLOP takes 1 ms
    rows = [dict(gflop=1.0, loop_ms=8.0, graph_ms=4.0, grouped_ms=3.0, ours_ms=2.0,
                 ours_prepared_ms=1.5, ours_host_ms=0.5, ours_prepared_host_ms=0.1),
            dict(gflop=0.1, loop_ms=2.0, graph_ms=1.0, grouped_ms=2.0, ours_ms=0.5,
                 ours_prepared_ms=0.2, ours_host_ms=0.4, ours_prepared_host_ms=0.05)]
    g = mod.bounds(rows, peak)
    # cell 1: max(0.5, 1.0) = 1.0 ms; cell 2: max(0.4, 0.1) = 0.4 ms
    assert g["per_call_vs_loop"]["bound"] == pytest.approx((8.0 / 1.0 * 2.0 / 0.4) ** 0.5)
    assert g["per_call_vs_best"]["bound"] == pytest.approx((3.0 / 1.0 * 1.0 / 0.4) ** 0.5)
    assert g["prepared_vs_best"]["measured"] == pytest.approx((3.0 / 1.5 * 1.0 / 0.2) ** 0.5)
    assert g["per_call_vs_loop"]["device_free"] == pytest.approx((8.0 / 0.5 * 2.0 / 0.4) ** 0.5)
    out = tmp_path / "b.json"
    committed = path.parents[1] / "benchmarks" / "results" / "h100" / "batched.json"
    assert mod.main([str(committed), "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["cells"] == len(json.loads(committed.read_text())["rows"])
    assert set(res["geomeans"]) == set(res["targets"])

"""Distributed k-means (``TSMKMeans(distributed=True)``) on gloo, ranks spawned here.

Each launch starts 2 or 3 ranks (forks of a forkserver that has imported torch, scikit-learn
and tsm once) on 127.0.0.1 with a free port; each runs a list of cases in one process
group and writes its results to a pickle, which the test compares with a
single-process fit of the concatenated shards. Every launch is joined with a
timeout and its leftovers killed: a test never hangs. The GPU cases (NCCL, 2 GPUs)
skip without 2 GPUs.

Tolerances: float64, 1e-10 relative (the results differ from the single-process
fit only by the order of the sums: the allreduce adds the ranks' partial sums);
float32, 1e-5 (the union's mean, by which the CPU fit centres X, is a float64 sum
rounded to float32, not numpy's float32 pairwise mean: X differs by an ulp).
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

LAUNCH_TIMEOUT = 45  # seconds a launch may take before its processes are killed
TIMEOUT = 5  # the collectives' timeout in the failure cases


# ------------------------------------------------------------------ data

def data(dtype=np.float64):
    """Three blobs in 3-D plus noise, 97 rows; the shards: 41, 56 and 0 rows (ranks 0..2)."""
    rng = np.random.default_rng(7)
    C = np.array([[0.0, 0.0, 0.0], [6.0, 1.0, -2.0], [-3.0, 7.0, 4.0]])
    X = np.concatenate([c + rng.standard_normal((n, 3)) for c, n in zip(C, (30, 40, 27))])
    X = X[rng.permutation(len(X))].astype(dtype)
    w = rng.uniform(0.5, 2.0, len(X))
    return X, w


SPLITS = {2: (0, 41, 97), 3: (0, 41, 97, 97)}


def shard(a, rank, world):
    s = SPLITS[world]
    return a[s[rank]:s[rank + 1]]


def far_init(X):
    """Initial centres with one far away: its cluster is empty after the first pass."""
    return np.concatenate([X[[0, 1]], [[100.0, 100.0, 100.0]]]).astype(X.dtype)


# The equality cases: name -> (TSMKMeans keywords, dtype, weights?)
CASES = {
    "pp64": (dict(n_clusters=3, random_state=0), np.float64, False),
    "pp32": (dict(n_clusters=3, random_state=0), np.float32, False),
    "par64": (dict(n_clusters=3, init="k-means||", random_state=1), np.float64, False),
    "pp64w": (dict(n_clusters=4, random_state=2), np.float64, True),
    "random": (dict(n_clusters=3, init="random", n_init=3, random_state=3, tol=0), np.float64, False),
    "relocate": (dict(n_clusters=3, init="far", max_iter=20), np.float64, True),
    "k8": (dict(n_clusters=8, random_state=4, max_iter=5), np.float64, False),
}


def fit_case(name, X, w, distributed, **extra):
    from tsm_apps.kmeans import TSMKMeans

    kw, _, weighted = CASES[name]
    kw = dict(kw)
    if kw.get("init") == "far":
        kw["init"] = far_init(data(X.dtype)[0])
    km = TSMKMeans(device="cpu", distributed=distributed, **kw, **extra)
    km.fit(X, sample_weight=w if weighted else None)
    return km


# ------------------------------------------------------------------ the workers

def _worker(scenario, rank, world, port, out):
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    res = {}
    try:
        if scenario == "cases":
            for name, (_, dtype, _) in CASES.items():
                X, w = data(dtype)
                km = fit_case(name, shard(X, rank, world), shard(w, rank, world), True)
                res[name] = dict(centers=km.cluster_centers_, labels=km.labels_, inertia=km.inertia_,
                                 n_iter=km.n_iter_)
            X, _ = data()
            from tsm_apps.kmeans import TSMKMeans

            km = TSMKMeans(3, random_state=0, device="cpu", distributed=True).fit(shard(X, rank, world))
            res["predict"] = (km.predict(X[:10]), km.transform(X[:10]))
            from tsm_apps.kmeans.__main__ import run

            km = run(["--distributed", "--dataset", "blobs", "--n-samples", "3001", "--n-features", "4",
                      "--n-clusters", "3", "--device", "cpu", "--quiet"])
            res["cli"] = (km.inertia_, km.n_iter_, len(km.labels_))
            km = TSMKMeans(3, device="cpu", distributed=True).fit(shard(X, rank, world))
            res["seedless"] = km.cluster_centers_
            # Errors: after each, the group is still usable (they come from the agreement).
            for what in ("d", "dtype", "nan", "few", "params"):
                Xe = shard(X, rank, world)
                if what == "d" and rank == 1:
                    Xe = np.concatenate([Xe, Xe[:, :1]], axis=1)
                if what == "dtype" and rank == 1:
                    Xe = Xe.astype(np.float32)
                if what == "nan" and rank == 1:
                    Xe = Xe.copy()
                    Xe[3, 1] = np.nan
                try:
                    TSMKMeans(200 if what == "few" else 3, random_state=0, device="cpu", distributed=True,
                              max_iter=10 if what == "params" and rank == 2 else 300).fit(Xe)
                    res["error_" + what] = None
                except ValueError as e:
                    res["error_" + what] = str(e)
        elif scenario in ("die", "hang"):
            from tsm_apps.kmeans import TSMKMeans
            from tsm_core.distributed import Comm, DistributedError

            calls = [0]
            allreduce = Comm.allreduce

            def failing(self, a, *args, **kw):
                if kw.get("what", "") == "k-means: centroid sums":
                    calls[0] += 1
                    if rank == world - 1 and calls[0] == 2:
                        if scenario == "die":
                            os._exit(3)
                        time.sleep(60)
                return allreduce(self, a, *args, **kw)

            Comm.allreduce = failing
            X, _ = data()
            t = time.perf_counter()
            try:
                TSMKMeans(8, random_state=0, device="cpu", distributed=True, timeout=TIMEOUT,
                          tol=0).fit(shard(X, rank, world))
                res["error"] = None
            except DistributedError as e:
                res["error"] = str(e)
            res["seconds"] = time.perf_counter() - t
    except BaseException:
        import traceback

        res["traceback"] = traceback.format_exc()
    finally:
        with open(out, "wb") as f:
            pickle.dump(res, f)
        sys.stdout.flush()
        os._exit(0)  # no teardown: a broken group may block destroy_process_group


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    """A forkserver that imports torch, scikit-learn and tsm once: each rank is a fork
    of it (a spawned interpreter would import them again, seconds per rank)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch.distributed", __name__, "tsm_apps.kmeans._distributed", "sklearn.cluster"])
    return ctx


def launch(scenario, world, tmp_path, needed=None):
    """Run `world` ranks of `scenario`; return each rank's results (None if it wrote none).
    Once the ranks `needed` (default all) have exited, the others are killed."""
    import multiprocessing as mp

    port = _free_port()
    outs = [tmp_path / f"{scenario.replace(':', '_').replace('|', 'I')}{r}.pkl" for r in range(world)]
    # GPU ranks are spawned: a fork of a process that has touched CUDA cannot use it.
    ctx = mp.get_context("spawn") if scenario.startswith("gpu:") else _context()
    target = _gpu_worker if scenario.startswith("gpu:") else _worker
    name = scenario[4:] if scenario.startswith("gpu:") else scenario
    procs = [ctx.Process(target=target, args=(name, r, world, port, str(outs[r]))) for r in range(world)]
    for p in procs:
        p.start()
    needed = range(world) if needed is None else needed
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        while time.monotonic() < deadline and any(procs[r].exitcode is None for r in needed):
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
            p.join(5)
    res = [pickle.loads(o.read_bytes()) if o.exists() else None for o in outs]
    for r in res:
        assert r is None or "traceback" not in r, r["traceback"]
    return res


# ------------------------------------------------------------------ the tests

@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    res = launch("cases", 3, tmp_path_factory.mktemp("cases"))
    assert all(r is not None for r in res), "a rank wrote no results (crashed or timed out)"
    return res


@pytest.mark.parametrize("name", list(CASES))
def test_equal_to_single_process(cases, name):
    """Every rank: the centres, inertia and iterations of a single-process fit of the
    concatenated shards; the labels of its own rows."""
    _, dtype, _ = CASES[name]
    X, w = data(dtype)
    ref = fit_case(name, X, w, False)
    rtol = 1e-10 if dtype == np.float64 else 1e-5
    for rank, r in enumerate(cases):
        got = r[name]
        np.testing.assert_allclose(got["centers"], ref.cluster_centers_, rtol=rtol, atol=rtol)
        assert got["inertia"] == pytest.approx(ref.inertia_, rel=rtol)
        assert got["n_iter"] == ref.n_iter_
        np.testing.assert_array_equal(got["labels"], shard(ref.labels_, rank, 3))
    # The same bits on every rank.
    for r in cases[1:]:
        np.testing.assert_array_equal(r[name]["centers"], cases[0][name]["centers"])
        assert r[name]["inertia"] == cases[0][name]["inertia"]


def test_random_state_none_is_rank_0s_seed(cases):
    for r in cases[1:]:
        np.testing.assert_array_equal(r["seedless"], cases[0]["seedless"])


def test_zero_row_rank(cases):
    assert cases[2]["pp64"]["labels"].shape == (0,)


def test_predict_is_local(cases):
    from tsm_apps.kmeans import TSMKMeans

    X, _ = data()
    ref = TSMKMeans(3, random_state=0, device="cpu").fit(X)
    for r in cases:
        labels, dist = r["predict"]
        np.testing.assert_array_equal(labels, ref.predict(X[:10]))
        np.testing.assert_allclose(dist, ref.transform(X[:10]), rtol=1e-10)


def test_cli_on_the_group(cases):
    """The CLI's --distributed on an initialised group: each rank its share of the rows."""
    inertia, n_iter, _ = cases[0]["cli"]
    assert [r["cli"][:2] for r in cases] == [(inertia, n_iter)] * 3
    assert [r["cli"][2] for r in cases] == [1001, 1000, 1000]


@pytest.mark.parametrize("what, text", [("d", "different numbers of features"), ("dtype", "different dtypes"),
                                        ("nan", "NaN or infinity (on rank 1)"), ("few", "should be >= n_clusters"),
                                        ("params", "different parameters (those of rank 2 differ")])
def test_the_same_error_on_every_rank(cases, what, text):
    msgs = [r["error_" + what] for r in cases]
    assert msgs[0] is not None and text in msgs[0], msgs[0]
    assert msgs.count(msgs[0]) == len(msgs)


@pytest.mark.parametrize("scenario", ["die", "hang"])
def test_a_lost_rank_is_an_error_on_the_others(tmp_path, scenario):
    """A rank that exits mid-fit (or stops answering): the others raise
    DistributedError within the timeout, and nobody hangs."""
    res = launch(scenario, 2, tmp_path, needed=[0])
    assert res[0] is not None, "rank 0 wrote no results"
    assert res[0]["error"] is not None and "rank 0 of 2" in res[0]["error"], res[0]
    assert res[0]["seconds"] < TIMEOUT + 10
    if scenario == "die":
        assert res[1] is None


def test_no_process_group_is_a_clear_error():
    from tsm_apps.kmeans import TSMKMeans

    if torch.distributed.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="not initialised"):
        TSMKMeans(2, device="cpu", distributed=True).fit(np.zeros((4, 2)))


def test_single_process_fit_imports_no_torch_distributed():
    code = ("import sys, numpy as np; from tsm_apps.kmeans import TSMKMeans; "
            "TSMKMeans(2, device='cpu', random_state=0).fit(np.random.rand(20, 3)); "
            "print('torch.distributed' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------ GPUs (NCCL)

def _gpus():
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("init", ["k-means++", "k-means||"])
def test_nccl_two_gpus_equal_one(tmp_path, init):
    """torchrun-like launch of 2 ranks on NCCL, CuPy shards (one of them streamed from
    host memory): the centres of a one-GPU fit of the union (float64, 1e-10)."""
    res = launch(f"gpu:{init}", 2, tmp_path)
    assert all(r is not None for r in res)
    from tsm_apps.kmeans import TSMKMeans

    X, _ = data()
    ref = TSMKMeans(3, init=init, random_state=0, device="gpu").fit(X)
    for rank, r in enumerate(res):
        np.testing.assert_allclose(r["centers"], res[0]["centers"], rtol=0, atol=0)
        assert r["inertia"] == pytest.approx(ref.inertia_, rel=1e-10)
        if init == "k-means++":  # k-means|| draws other rounds than the one-GPU fit
            np.testing.assert_allclose(r["centers"], ref.cluster_centers_, rtol=1e-10, atol=1e-10)
            np.testing.assert_array_equal(r["labels"], shard(ref.labels_, rank, 2))


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_nccl_two_gpus_float32_kmeans_parallel(tmp_path):
    """float32 rows on 2 ranks: k-means||'s rounds on the TF32 tensor cores; the ranks
    agree bit for bit and reach the one-GPU fit's clustering."""
    res = launch("gpu:k-means||@float32", 2, tmp_path)
    assert all(r is not None for r in res)
    from tsm_apps.kmeans import TSMKMeans

    X, _ = data(np.float32)
    ref = TSMKMeans(3, init="k-means||", random_state=0, device="gpu").fit(X)
    for r in res:
        np.testing.assert_array_equal(r["centers"], res[0]["centers"])
        assert r["inertia"] == pytest.approx(ref.inertia_, rel=1e-4)


def _gpu_worker(init, rank, world, port, out):
    import datetime

    import cupy as cp
    import torch.distributed as dist

    from tsm_apps.kmeans import TSMKMeans

    torch.cuda.set_device(rank)
    cp.cuda.Device(rank).use()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    res = {}
    init, _, dtype = init.partition("@")  # "k-means||@float32": float32 rows
    try:
        X, _ = data(np.dtype(dtype or "float64"))
        Xl = shard(X, rank, world)
        # Rank 0: CuPy in GPU memory; rank 1: numpy streamed through a small budget.
        km = TSMKMeans(3, init=init, random_state=0, device="gpu", distributed=True,
                       max_gpu_memory=None if rank == 0 else 1 << 12)
        km.fit(cp.asarray(Xl) if rank == 0 else Xl)
        res = dict(centers=cp.asnumpy(cp.asarray(km.cluster_centers_)), labels=np.asarray(
            cp.asnumpy(cp.asarray(km.labels_))), inertia=km.inertia_)
    except BaseException:
        import traceback

        res["traceback"] = traceback.format_exc()
    finally:
        with open(out, "wb") as f:
            pickle.dump(res, f)
        os._exit(0)


@pytest.fixture
def one_rank_group(tmp_path):
    """A process group of this process alone (gloo), destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + str(tmp_path / "store"), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["memory", "streamed"])
@pytest.mark.parametrize("dtype,precision", [(np.float64, None), (np.float32, "float32"), (np.float32, "tf32")])
@pytest.mark.parametrize("empty", [False, True])
def test_one_rank_group_is_the_single_gpu_fit(one_rank_group, monkeypatch, where, dtype, precision, empty):
    """With one rank the group's steps are the single-GPU steps and loop (the allreduce
    is the identity): the same labels, centres, inertia and iterations, bit for bit,
    for X in GPU memory (the overlapped loop) and streamed (the plain loop), with an
    empty cluster relocated or not."""
    import cupy as cp

    import tsm_core
    from tsm_core.distributed import Comm
    from tsm_core.kmeans.distributed import kmeans_lloyd_distributed

    rng = np.random.default_rng(11)
    n, d, k = 30011, 24, 13  # awkward sizes
    X = (rng.standard_normal((n, d)) + 3 * rng.integers(-2, 3, (n, 1))).astype(dtype)
    C0 = X[rng.choice(n, k, replace=False)].copy()
    if empty:
        C0[-1] = 1e3  # far from every row: its cluster is empty after the first pass
    budget = X.nbytes // 3 if where == "streamed" else None
    comm = Comm(timeout=30)
    agr = comm.agree(n=n, d=d, dtype=dtype, device="gpu")
    src = tsm_core.kmeans_source(X if where == "streamed" else cp.asarray(X), max_gpu_memory=budget, n_clusters=k)
    with src:
        assert src.streamed == (where == "streamed")
        lg, ig, cg, ng = kmeans_lloyd_distributed(src, C0, comm, agr, max_iter=25, precision=precision)
        ls, is_, cs, ns = tsm_core.kmeans_lloyd(src, C0, max_iter=25, precision=precision)
    assert ng == ns
    np.testing.assert_array_equal(cp.asnumpy(lg), cp.asnumpy(ls))
    np.testing.assert_array_equal(cp.asnumpy(cg), cp.asnumpy(cs))
    assert ig == is_


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["memory", "streamed"])
def test_one_rank_group_screened_float32_is_the_single_gpu_fit(one_rank_group, monkeypatch, where):
    """From 256 centres "float32" runs as a TF32 screen (listed rows assigned again):
    a one-rank group's fit equals the single-GPU fit bit for bit, in memory and
    streamed, and the streamed fit the in-memory one up to the sums' rounding."""
    import cupy as cp

    import tsm_core
    from tsm_core.distributed import Comm
    from tsm_core.kmeans.distributed import kmeans_lloyd_distributed
    from tsm_core.kmeans.tensor import TensorAssign

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the screen runs on the warpgroup MMA (compute capability 9.0)")
    calls = []
    screened = TensorAssign._screened
    monkeypatch.setattr(TensorAssign, "_screened", lambda self, *a: calls.append(1) or screened(self, *a))
    rng = np.random.default_rng(12)
    n, d, k = 40009, 20, 300
    X = (rng.standard_normal((n, d)) + 2 * rng.integers(-3, 4, (n, 2)).repeat(d // 2, 1)).astype(np.float32)
    C0 = X[rng.choice(n, k, replace=False)].copy()
    budget = X.nbytes // 3 if where == "streamed" else None
    comm = Comm(timeout=30)
    agr = comm.agree(n=n, d=d, dtype=np.float32, device="gpu")
    src = tsm_core.kmeans_source(X if where == "streamed" else cp.asarray(X), max_gpu_memory=budget, n_clusters=k)
    with src:
        lg, ig, cg, ng = kmeans_lloyd_distributed(src, C0, comm, agr, max_iter=8, precision="float32")
        ls, is_, cs, ns = tsm_core.kmeans_lloyd(src, C0, max_iter=8, precision="float32")
    lm, im, cm, nm = tsm_core.kmeans_lloyd(cp.asarray(X), C0, max_iter=8, precision="float32")
    assert calls and ng == ns == nm
    np.testing.assert_array_equal(cp.asnumpy(lg), cp.asnumpy(ls))
    np.testing.assert_array_equal(cp.asnumpy(cg), cp.asnumpy(cs))
    assert ig == is_
    # streamed, the sorted centroid sums add each chunk's pieces: equal up to rounding
    assert (cp.asnumpy(ls) == cp.asnumpy(lm)).mean() > 0.999
    np.testing.assert_allclose(cp.asnumpy(cs), cp.asnumpy(cm), rtol=1e-4, atol=1e-4)
    assert is_ == pytest.approx(im, rel=1e-5)


@pytest.mark.gpu
def test_one_rank_group_verbose_lines_are_the_single_gpu_fit(one_rank_group):
    """The progress lines (the group's inertia each iteration) of a one-rank group are
    the single-GPU fit's."""
    import cupy as cp

    import tsm_core
    from tsm_core.distributed import Comm
    from tsm_core.kmeans.distributed import kmeans_lloyd_distributed

    X, _ = data()
    C0 = far_init(X)
    comm = Comm(timeout=30)
    agr = comm.agree(n=len(X), d=3, dtype=X.dtype, device="gpu")
    lines_g, lines_s = [], []
    kmeans_lloyd_distributed(cp.asarray(X), C0, comm, agr, max_iter=20, verbose=1, progress=lines_g.append)
    tsm_core.kmeans_lloyd(cp.asarray(X), C0, max_iter=20, verbose=1, progress=lines_s.append)
    assert lines_g == lines_s and len(lines_g) >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("tf32", [None, "0"])
def test_gpu_init_ops_rounds_in_tf32(monkeypatch, tf32):
    """The distributed k-means|| rounds' distances on float32 rows come from the TF32
    tensor cores, as on one GPU (TSM_KMEANS_INIT_TF32=0: the exact kernels): the
    positions of the nearest candidates those of float64 wherever the two best lie
    apart, the distances within TF32's rounding, the candidates padded past their
    count naming the last."""
    import cupy as cp

    import tsm_core
    from tsm_core.kmeans import init as kinit
    from tsm_core.kmeans.distributed import GpuInitOps

    if tf32 is not None:
        monkeypatch.setenv("TSM_KMEANS_INIT_TF32", tf32)
    calls = []
    exact = kinit._GpuOps._nearest
    monkeypatch.setattr(kinit._GpuOps, "_nearest", lambda self, *a: calls.append(1) or exact(self, *a))
    rng = np.random.default_rng(3)
    n, d, p = 20011, 37, 61  # odd d: the TF32 kernel's rows copied to 16-byte alignment
    X = rng.standard_normal((n, d)).astype(np.float32)
    P = X[rng.choice(n, p, replace=False)] + 0.1 * rng.standard_normal((p, d)).astype(np.float32)
    with tsm_core.kmeans_source(cp.asarray(X), n_clusters=p) as src:
        ops = GpuInitOps(src, d, np.float32)
        dist, pos = ops.nearest(cp.asarray(P))
    assert bool(calls) == (tf32 == "0")
    dist, pos = cp.asnumpy(dist), cp.asnumpy(pos)
    D = ((X.astype(np.float64)[:, None] - P.astype(np.float64)[None]) ** 2).sum(-1)
    # TF32 rounds each product's inputs to 11 significant bits: a distance's error
    # stays below 2^-9 (||x||^2 + ||c||^2) with room to spare
    B = 2.0 ** -9 * ((X.astype(np.float64) ** 2).sum(1) + (P.astype(np.float64) ** 2).sum(1).max())
    two = np.sort(D, 1)[:, :2]
    clear = two[:, 1] - two[:, 0] > 2 * B
    assert clear.mean() > 0.5 and (pos >= 0).all() and (pos < p).all()
    np.testing.assert_array_equal(pos[clear], D.argmin(1)[clear])
    assert (np.abs(dist - D[np.arange(n), pos]) <= B).all()

"""What a new user meets on a machine without a GPU: plan() and explain() agree and
name the reference GPU, out= comes back as the caller's own object for empty
products, the tuning cache keeps every key when processes write at once, the test
suite keeps to a temporary cache folder, and dir(tsm_core) lists every public name.
CPU only (the GPU, where there is one, is hidden from plan and explain here)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

import tsm_core
from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import cache as _cache
from tsm_core.runtime.device import KNOWN_GPUS, REFERENCE_GPU
from tsm_core.tsm2 import autotune as _autotune
from tsm_core.tsm2 import model as _model

# ------------------------------------------------------------------ plan / explain without a GPU


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(_model, "has_gpu", lambda: False)
    monkeypatch.setattr(_arrays, "has_gpu", lambda: False)


@pytest.mark.parametrize("shape, dtype, algorithm", [
    ((1_000_000, 1024, 16), "float32", "tsm2r"),
    ((10**7, 16, 16), "float64", "tsm2l"),
    ((4096, 4096, 4096), "float32", "cublas")])
def test_plan_without_a_gpu_is_the_reference_gpus_and_says_so(no_gpu, shape, dtype, algorithm):
    ref = KNOWN_GPUS[REFERENCE_GPU]
    p = tsm_core.plan(*shape, dtype)
    assert p.algorithm == algorithm
    assert p.spec_name == ref.name
    assert "No CUDA GPU was found" in p.note and ref.name in p.note
    words = p.describe()
    assert p.note in words and "reference GPU" in words
    # the same plan as asking for the reference GPU by name, bar the note
    named = tsm_core.plan(*shape, dtype, spec=ref)
    assert named.note == ""
    assert p.to_dict() == dict(named.to_dict(), note=p.note)


def test_explain_agrees_with_plan_without_a_gpu(no_gpu, capsys):
    A = np.broadcast_to(np.float32(0), (1_000_000, 1024))  # the shape, without 4 GB
    B = np.zeros((1024, 16), dtype=np.float32)
    text = tsm_core.explain(A, B)
    assert text == capsys.readouterr().out.rstrip("\n")
    p = tsm_core.plan(1_000_000, 1024, 16, "float32")
    assert p.describe() in text
    assert "No CUDA GPU" in text and KNOWN_GPUS[REFERENCE_GPU].name in text


# ------------------------------------------------------------------ out= of empty products


def _kinds():
    kinds = ["numpy"]
    try:
        import torch  # noqa: F401

        kinds.append("torch-cpu")
    except ImportError:  # pragma: no cover
        pass
    return kinds


def _array(kind, shape, fill):
    a = np.full(shape, fill, dtype=np.float64)
    if kind == "numpy":
        return a
    import torch

    return torch.from_numpy(a)


@pytest.mark.parametrize("kind", _kinds())
@pytest.mark.parametrize("m, k, n", [(0, 5, 3), (4, 5, 0), (0, 0, 0), (4, 0, 3)])
@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("fn", ["matmul", "tsm2r", "tsm2l"])
def test_out_comes_back_itself_for_empty_products(kind, m, k, n, beta, fn):
    A, B = _array(kind, (m, k), 1.0), _array(kind, (k, n), 1.0)
    out = _array(kind, (m, n), 2.0)
    got = getattr(tsm_core, fn)(A, B, out=out, alpha=3.0, beta=beta)
    assert got is out
    want = np.full((m, n), 2.0 * beta)  # k == 0: A @ B is zeros
    np.testing.assert_array_equal(np.asarray(got), want)


# ------------------------------------------------------------------ the tuning cache across processes


def _add_keys(directory: str, worker: int, count: int) -> None:
    from tsm_core.tsm2.autotune import TuneCache

    cache = TuneCache("Race GPU", directory)
    for i in range(count):
        cache.put(f"key-{worker}-{i}", {"worker": worker, "i": i}, 1e-3)


def test_tuning_cache_keeps_every_key_of_concurrent_processes(tmp_path):
    workers, count = 3, 60
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_add_keys, args=(str(tmp_path), w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = _autotune.TuneCache("Race GPU", tmp_path)._store.load()
    want = {f"key-{w}-{i}" for w in range(workers) for i in range(count)}
    assert set(data) == want
    assert data["key-2-7"] == {"params": {"worker": 2, "i": 7}, "time_s": 1e-3}
    # no temporary file is left behind
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == \
        ["tune-Race_GPU.json"]


# ------------------------------------------------------------------ the suite's cache folder


def test_the_suite_caches_in_a_temporary_folder(tsm_cache_dir):
    d = _cache.cache_dir()
    assert d == tsm_cache_dir
    assert not str(d.resolve()).startswith(str((Path.home() / ".cache" / "tsm").resolve()))
    assert _autotune.TuneCache("Any GPU").path.parent == tsm_cache_dir


# ------------------------------------------------------------------ the public surface


def test_dir_lists_every_public_name_and_all_is_complete():
    names = dir(tsm_core)
    for name in tsm_core.__all__:
        assert name in names, name
    for name in ("kmeans_assign", "kmeans_centroid_sums", "kmeans_plusplus", "kmeans_lloyd",
                 "kmeans_source", "autotune", "batched_matmul", "gemm", "ConvGroup"):
        assert name in tsm_core.__all__ and name in names
    assert set(tsm_core._LAZY) <= set(tsm_core.__all__)
    assert tsm_core.__version__ == "0.2.0"

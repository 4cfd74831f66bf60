"""The streamed source's ring of chunk buffers, on a simulated GPU (no GPU needed).

``_HostSource`` orders its copies and the caller's work on the chunks with CUDA
streams and events only. Here CuPy is replaced by a small simulator in which every
operation queued on a stream runs only when its dependencies (the previous
operation of its stream, the events it waits for) have run, in a random order among
those ready: work on a chunk that runs before its copy, or a copy that overwrites a
buffer before the work on its previous chunk ran, reads wrong rows, and the check
queued as the caller's work sees them. The GPU tests (tests/test_kmeans_gpu.py)
check the same source on a real device.
"""

from __future__ import annotations

import ctypes
import random
import sys
import types

import numpy as np
import pytest

from tsm_core.kmeans import sources


class _Op:
    def __init__(self, fn, deps):
        self.fn, self.deps, self.done = fn, [d for d in deps if d is not None], False


class _Sim:
    """Streams of operations run lazily, in a random order that respects their
    dependencies, up to what a host synchronisation needs."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.pending = []
        self.streams = {}

    def add(self, fn, deps):
        op = _Op(fn, deps)
        self.pending.append(op)
        return op

    def run_until(self, target=None):
        """Run operations (random ready ones first) until `target` has run (None: all)."""
        while self.pending and (target is None or not target.done):
            ready = [op for op in self.pending if all(d.done for d in op.deps)]
            op = self.rng.choice(ready)
            self.pending.remove(op)
            if op.fn is not None:
                op.fn()
            op.done = True


class _Stream:
    def __init__(self, sim, non_blocking=False):
        self.sim, self.last = sim, None
        self.ptr = id(self)
        sim.streams[self.ptr] = self

    def enqueue(self, fn, deps=()):
        self.last = self.sim.add(fn, [self.last, *deps])
        return self.last

    def wait_event(self, ev):
        if ev.op is not None:
            self.enqueue(None, [ev.op])

    def synchronize(self):
        self.sim.run_until(self.last)


class _Event:
    def __init__(self, sim):
        self.sim, self.op = sim, None

    def record(self, stream):
        self.op = stream.enqueue(None)

    def synchronize(self):
        if self.op is not None:
            self.sim.run_until(self.op)


class _DevArray(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def fake_cupy(sim, refuse_register=False):
    """The parts of CuPy that ``_HostSource`` uses, on `sim`."""
    registered = {}
    current = _Stream(sim)

    def host_register(ptr, nbytes, flags):
        if refuse_register:
            raise RuntimeError("cudaHostRegister refused (test)")
        registered[ptr] = nbytes

    def host_unregister(ptr):
        del registered[ptr]

    def memcpy_async(dst, src, nbytes, kind, stream_ptr):
        sim.streams[stream_ptr].enqueue(lambda: ctypes.memmove(dst, src, nbytes))

    runtime = types.SimpleNamespace(hostRegister=host_register, hostUnregister=host_unregister,
                                    memcpyAsync=memcpy_async, memcpyHostToDevice=1)
    cuda = types.SimpleNamespace(Stream=lambda non_blocking=False: _Stream(sim, non_blocking),
                                 Event=lambda disable_timing=True: _Event(sim),
                                 get_current_stream=lambda: current, runtime=runtime)
    cp = types.SimpleNamespace(cuda=cuda, registered=registered, current=current,
                               empty=lambda shape, dtype: np.full(shape, np.nan, dtype=dtype).view(_DevArray))
    return cp


@pytest.fixture
def sim_source(monkeypatch):
    def make(X, rows, seed=0, refuse_register=False):
        sim = _Sim(seed)
        cp = fake_cupy(sim, refuse_register)
        monkeypatch.setattr(sources, "_cp", lambda: cp)
        monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
            empty_pinned=lambda shape, dtype: np.empty(shape, dtype=dtype)))
        return sources._HostSource(X, rows), sim, cp

    return make


def _pass(src, cp, seen, stop=None):
    """One pass as the Lloyd loop makes it: a check queued as the work on each chunk
    (the rows it reads when it runs, and that they are X's rows a..b)."""
    for j, (a, Xc) in enumerate(src.chunks()):
        b = a + Xc.shape[0]

        def work(a=a, b=b, Xc=Xc):
            seen.append((a, b, bool(np.array_equal(Xc, src.X[a:b]))))

        cp.current.enqueue(work)
        if stop is not None and j == stop:
            break


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n,rows", [(10, 3), (9, 3), (5, 5), (7, 1), (11, 4)])
@pytest.mark.parametrize("refuse", [False, True])
def test_every_chunk_read_after_its_copy_and_before_its_buffer_is_reused(sim_source, seed, n, rows, refuse):
    X = np.arange(n * 3, dtype=np.float32).reshape(n, 3) - 7.5
    src, sim, cp = sim_source(X, rows, seed=seed, refuse_register=refuse)
    assert src.registered == (not refuse)
    m = -(-n // rows)
    seen = []
    for p in range(4):
        _pass(src, cp, seen, stop=1 if p == 1 else None)  # the second pass stops early
        if p % 2:
            cp.current.synchronize()  # the host reads a result now and then
    src.close()
    assert not sim.pending and not cp.registered
    starts = [a for a, _, _ in seen]
    expect = list(range(0, n, rows))
    assert starts == expect + expect[:min(2, m)] + expect + expect
    assert all(ok for _, _, ok in seen), "a chunk's work read rows other than its own"


def test_non_contiguous_rows_are_staged(sim_source):
    X = np.asfortranarray(np.random.default_rng(1).standard_normal((13, 4)))
    src, sim, cp = sim_source(X, 4, seed=3)
    assert not src.registered and src.staging is not None
    seen = []
    for _ in range(3):
        _pass(src, cp, seen)
    src.close()
    assert [a for a, _, _ in seen] == [0, 4, 8, 12] * 3 and all(ok for _, _, ok in seen)


def test_next_pass_first_chunks_are_queued_at_the_end_of_a_pass(sim_source):
    X = np.ones((12, 2), dtype=np.float32)
    src, sim, cp = sim_source(X, 2)
    seen = []
    _pass(src, cp, seen)
    # Six chunks handed out, the copies of the next pass's first NBUF chunks queued.
    assert src.seq == 6 and src.issued == 6 + sources.NBUF
    src.close()


@pytest.mark.parametrize("n,d,dtype,k", [(10**7, 128, np.float32, 1024), (60013, 96, np.float32, 12),
                                         (20011, 700, np.float64, 5), (1000, 8, np.float64, 8)])
@pytest.mark.parametrize("div", [3, 8, 64])
def test_chunks_fit_the_budget(n, d, dtype, k, div):
    item = np.dtype(dtype).itemsize
    budget = n * d * item // div
    rows = sources.stream_chunk_rows(n, d, dtype, k, budget)
    assert rows >= 1
    state = n * sources._per_row_state(dtype)
    if rows > 1:
        # The ring and one converted chunk within what is left after the per-row state.
        assert (sources.NBUF + 1) * rows * d * item <= max(budget - state, budget // 4)
    assert rows * d * item <= max(sources.CHUNK_BYTES, d * item)
    if rows > sources.ROW_BLOCK:
        assert rows % sources.ROW_BLOCK == 0


def test_chunks_do_not_shrink_with_k():
    n, d = 10**7, 128
    budget = n * d * 4 // 8
    assert sources.stream_chunk_rows(n, d, np.float32, 4096, budget) == \
        sources.stream_chunk_rows(n, d, np.float32, 64, budget)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["registered", "refused", "fortran"])
def test_gpu_passes_read_every_row(monkeypatch, how):
    """On the device: every pass (one left early) hands out X's rows, in order, into
    the ring; a copy of each chunk queued on the current stream sees X's rows."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    X = rng.standard_normal((10007, 33)).astype(np.float32)
    if how == "fortran":
        X = np.asfortranarray(X)
    if how == "refused":
        def refuse(*args):
            raise RuntimeError("cudaHostRegister refused (test)")

        monkeypatch.setattr(cp.cuda.runtime, "hostRegister", refuse)
    src = sources._HostSource(X, 1024)
    assert src.registered == (how == "registered")
    with src:
        for p in range(4):
            out = cp.full(X.shape, cp.nan, dtype=cp.float32)
            for j, (a, Xc) in enumerate(src.chunks()):
                out[a:a + Xc.shape[0]] = Xc
                if p == 1 and j == 3:
                    break
            if p != 1:
                np.testing.assert_array_equal(cp.asnumpy(out), X)
            else:
                np.testing.assert_array_equal(cp.asnumpy(out[:4096]), X[:4096])

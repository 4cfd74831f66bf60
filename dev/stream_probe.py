"""Probe: does a streamed k-means pass read host X at the host-to-device bandwidth?

One process, one GPU. X (n, d) float32 in host memory (a plain numpy array, as a
user passes it), clustered within a GPU memory budget of X.nbytes / DIV, so that it
is streamed (``tsm_core.kmeans.sources._HostSource``). Prints GB/s of

- ``pinned memcpy``: cudaMemcpyAsync of CHUNK-sized pieces from a pinned
  (cudaHostAlloc) buffer into one device buffer, back to back: the link with the
  memory kind the distributed bench's H2D figure uses;
- ``registered memcpy``: the same copies from X itself once page-locked in place
  (what the streamed source copies from), over all of X;
- ``copy-only pass``: the streamed source's ring over X with no work on the chunks
  (its copies, events and Python per chunk);
- ``assignment pass``: the Lloyd pass without the centroid sums;
- ``Lloyd iteration``: pass with sums, finalize and the status read, back to back
  as the fit runs them (the next pass's first copies overlap the status read);

each as X.nbytes / time and as a fraction of ``pinned memcpy``. The acceptance
compares the iteration with the H2D bandwidth of all GPUs copying at once (the
distributed bench); on one GPU that is ``pinned memcpy``.

    python dev/stream_probe.py [--n 1e7] [--d 128] [--k 1024] [--div 8]
                               [--precision float32] [--iters 5]

Exits 2 without a GPU.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _gbps(nbytes, s):
    return nbytes / s / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=float, default=1e7)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--div", type=int, default=8, help="GPU memory budget = X.nbytes / DIV")
    p.add_argument("--precision", default=None, help="k-means precision (default: X's, float32)")
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args(argv)
    try:
        import cupy as cp
        import cupyx

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no CuPy or no GPU
        print(f"no GPU: {e}")
        return 2
    import tsm_core
    from tsm_core.kmeans.lloyd import _GpuSteps
    from tsm_core.kmeans.sources import NBUF

    n, d, k = int(a.n), a.d, a.k
    X = np.empty((n, d), dtype=np.float32)
    rng = cp.random.default_rng(0)
    step = max(1, (256 << 20) // (4 * d))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        rng.standard_normal((r1 - r0, d), dtype=cp.float32).get(out=X[r0:r1])
    C0 = X[np.random.default_rng(1).choice(n, k, replace=False)].copy()
    budget = X.nbytes // a.div
    stream = cp.cuda.Stream(non_blocking=True)

    def timed(fn, reps):
        fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        cp.cuda.Device().synchronize()
        return (time.perf_counter() - t0) / reps

    with tsm_core.kmeans_source(X, max_gpu_memory=budget, n_clusters=k) as src:
        chunk = src.max_rows * d * 4
        print(f"X {n} x {d} float32 = {X.nbytes / 1e9:.2f} GB in host memory, budget {budget / 1e9:.2f} GB: "
              f"{len(src.starts)} chunks of {src.max_rows} rows ({chunk / 1e6:.0f} MB), {NBUF} buffers, "
              f"registered in place: {src.registered}")
        dev = cp.empty(chunk, dtype=cp.uint8)
        pinned = cupyx.empty_pinned(chunk, dtype=np.uint8)
        pinned.fill(7)
        pieces = len(src.starts)

        def memcpy_from(host_ptr_of):
            def run():
                for i in range(pieces):
                    a0 = src.starts[i]
                    nb = (min(n, a0 + src.max_rows) - a0) * d * 4
                    cp.cuda.runtime.memcpyAsync(dev.data.ptr, host_ptr_of(a0), nb, cp.cuda.runtime.memcpyHostToDevice,
                                                stream.ptr)
            return run

        t_pin = timed(memcpy_from(lambda a0: pinned.ctypes.data), 2)
        rows = []
        rows.append(("pinned memcpy", t_pin))
        if src.registered:
            rows.append(("registered memcpy", timed(memcpy_from(lambda a0: X.ctypes.data + a0 * d * 4), 2)))

        def copy_only():
            for _ in src.chunks():
                pass

        rows.append(("copy-only pass", timed(copy_only, 2)))
        st = _GpuSteps(src, cp.asarray(C0), None, "auto", a.precision or "float32")
        rows.append(("assignment pass", timed(lambda: st.pass_over(False), 2)))

        def iteration():
            st.pass_over(True)
            st.update()
            st.advance()

        rows.append(("Lloyd iteration", timed(iteration, a.iters)))
        print(f"route {st.method}; precision {st.precision}")
        for name, t in rows:
            print(f"{name:>18}: {t * 1e3:9.2f} ms  {_gbps(X.nbytes, t):7.2f} GB/s  {t_pin / t:5.2f} of pinned memcpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())

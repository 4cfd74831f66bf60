"""Probe: what a Lloyd iteration of the distributed fit costs over the single-GPU fit.

On one GPU, X (n, d) float32 in GPU memory, the same initial centres, a process
group of world size 1 (``--backend nccl`` or gloo; under torchrun, the group it
makes, each rank on GPU LOCAL_RANK with its own X). Per iteration, as the
difference of runs of I and I2 iterations (fixed costs cancel), median of
``--repeats``:

- ``single overlapped``: ``_lloyd_overlapped`` over ``_GpuSteps`` (what
  ``kmeans_lloyd`` and ``TSMKMeans`` run for X in GPU memory);
- ``single plain``: the plain ``lloyd`` loop over ``_GpuSteps`` (a host round trip
  an iteration while the GPU waits);
- ``group overlapped``: ``_lloyd_overlapped`` over ``_GroupGpuSteps`` (what
  ``kmeans_lloyd_distributed`` runs now);
- ``group plain``: the plain loop over ``_GroupGpuSteps`` (streamed shards);
- ``wrapped plain``: ``lloyd_distributed`` over ``DistributedSteps`` wrapping
  ``_GpuSteps`` (the distributed fit as it was before ``_GroupGpuSteps``);
- ``estimator``: ``TSMKMeans(distributed=True)`` against ``TSMKMeans()``.

Then one iteration's phases with CUDA events, single against group: the
assignment, the centroid sums, the reduction (pack, allreduce, unpack; nothing
with one rank), finalize, and the host's wait for the status.

    python dev/dist_overhead_probe.py [--n 4e6] [--d 128] [--k 1024] [--backend nccl]
                                      [--precision float32] [--iters 12,4]
    torchrun --nproc-per-node 2 dev/dist_overhead_probe.py ...

Exits 2 without a GPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=float, default=4e6)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    p.add_argument("--precision", default=None, help="k-means precision (default: float32, the tensor-core route)")
    p.add_argument("--iters", default="12,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-estimator", action="store_true")
    a = p.parse_args(argv)
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        print(f"no GPU: {e}")
        return 2
    import torch
    import torch.distributed as dist

    from tsm_core.distributed import Comm
    from tsm_core.kmeans import distributed as dk
    from tsm_core.kmeans.lloyd import _GpuSteps, _lloyd_overlapped, lloyd
    from tsm_core.kmeans.sources import kmeans_source

    local = int(os.environ.get("LOCAL_RANK", 0))
    cp.cuda.Device(local).use()
    torch.cuda.set_device(local)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(a.backend)
    else:
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group(a.backend, init_method="file://" + store, rank=0, world_size=1)
    comm = Comm()
    rank0 = comm.rank == 0

    def say(*args):
        if rank0:
            print(*args, flush=True)

    n, d, k = int(a.n), a.d, a.k
    prec = a.precision or "float32"
    X = cp.random.default_rng(comm.rank).standard_normal((n, d), dtype=cp.float32)
    C0 = cp.asarray(np.random.default_rng(1).standard_normal((k, d)).astype(np.float32))
    src = kmeans_source(X, n_clusters=k)
    agr = comm.agree(n=n, d=d, dtype=np.float32, device="gpu")
    I, I2 = (int(v) for v in a.iters.split(","))
    say(f"(n, d, k) = ({n}, {d}, {k}) float32 per rank, world {comm.world}, backend {a.backend}, precision {prec}")

    def barrier():
        cp.cuda.Device().synchronize()
        comm.allreduce(np.zeros(1), what="probe barrier")

    def single():
        return _GpuSteps(src, C0.copy(), None, "auto", prec)

    def group():
        return dk._GroupGpuSteps(src, C0.copy(), None, "auto", prec, comm=comm, agr=agr)

    loops = {
        "single overlapped": lambda it: _lloyd_overlapped(single(), it, -1.0),
        "single plain": lambda it: lloyd(single(), max_iter=it, tol=-1.0),
        "group overlapped": lambda it: _lloyd_overlapped(group(), it, -1.0),
        "group plain": lambda it: lloyd(group(), max_iter=it, tol=-1.0),
        "wrapped plain": lambda it: dk.lloyd_distributed(single(), comm, agr, gpu=True, max_iter=it, tol=-1.0),
    }

    def per_iter(run):
        run(I2)  # warm-up
        t = {I: [], I2: []}
        for _ in range(a.repeats):
            for it in (I, I2):
                barrier()
                t0 = time.perf_counter()
                done = run(it)
                cp.cuda.Device().synchronize()
                t[it].append(time.perf_counter() - t0)
                assert done == it, f"stopped after {done} of {it} iterations"
        return (statistics.median(t[I]) - statistics.median(t[I2])) / (I - I2)

    base = None
    for name, run in loops.items():
        s = per_iter(run)
        base = base or s
        say(f"{name:>18}: {s * 1e3:8.3f} ms an iteration  ({s / base:6.3f} of single overlapped)")

    if not a.skip_estimator:
        import warnings

        from tsm_apps.kmeans import TSMKMeans

        kw = dict(n_clusters=k, init=C0.get(), n_init=1, tol=0.0)
        if a.precision:
            kw["precision"] = a.precision
        for name, dist_on in (("estimator single", False), ("estimator distributed", True)):
            if dist_on is False and comm.world > 1:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                s = per_iter(lambda it: TSMKMeans(max_iter=it, distributed=dist_on, **kw).fit(X).n_iter_)
            say(f"{name:>22}: {s * 1e3:8.3f} ms an iteration")

    # One iteration's phases, CUDA events on the current stream.
    for name, make in (("single", single), ("group", group)):
        st = make()
        st.pass_over(update=False)
        cp.cuda.Device().synchronize()
        ev = [cp.cuda.Event() for _ in range(5)]
        phases = []
        for _ in range(5):
            barrier()
            ev[0].record()
            st.assign_chunk(0, src.X, st.C, st.cn, st.labels, st.mind, st.labels)
            ev[1].record()
            st.work.run(st.update_rows(0, n, src.X), st.labels, None, st.sums, st.wsum)
            ev[2].record()
            if name == "group":
                st._reduce()
            ev[3].record()
            st.finalize(st.C, st.C_new, st.cn_new, wait=False)
            ev[4].record()
            h0 = time.perf_counter()
            st.status_wait()
            host = time.perf_counter() - h0
            st.advance()
            phases.append([cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) for i in range(4)] + [host * 1e3])
        med = np.median(np.array(phases), axis=0)
        say(f"{name:>6} phases (ms): assign {med[0]:.3f}  sums {med[1]:.3f}  reduce {med[2]:.3f}  "
            f"finalize {med[3]:.3f}  host status wait {med[4]:.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

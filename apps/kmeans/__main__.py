"""Run TSMKMeans on a data set and print inertia, iterations and time.

    python -m tsm_apps.kmeans --dataset digits --n-clusters 10
    python -m tsm_apps.kmeans --dataset blobs --n 1000000 --d 256 --n-clusters 64
    python -m tsm_apps.kmeans --dataset uniform --n 100000 --d 4096 --n-clusters 16 --max-iter 20 --quiet
    torchrun --nproc-per-node 4 -m tsm_apps.kmeans --distributed --dataset blobs --n-samples 40000000 \\
        --n-features 128 --n-clusters 1024

Real data sets ship with scikit-learn (``tsm_datasets.real``); "blobs" and "uniform"
are seeded synthetic data (``tsm_datasets.synthetic``). Progress (data ready,
initialisation done, a line per Lloyd iteration with its inertia, convergence) is
printed as the fit goes; ``--quiet`` prints the result only.

``--distributed`` fits across the ranks of a torch.distributed job (torchrun sets the
environment; the process group is initialised here: NCCL for the GPU path, one GPU
per rank by LOCAL_RANK, gloo for the CPU): each rank generates its own share of the
``--n`` rows from a stream of its own (seeded by ``--seed`` and the rank; the blobs'
centres are shared), so the union depends on the seed and the number of ranks only;
real data sets are split by rows. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import numpy as np


def main(argv=None) -> int:
    """The command line (console script ``tsm-kmeans``); returns the exit status 0.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``); ``--help`` lists them.

    Returns
    -------
    int
        0 (the exit status).

    Raises
    ------
    SystemExit
        On bad arguments (argparse).

    Examples
    --------
    >>> from tsm_apps.kmeans.__main__ import main
    >>> main(["--dataset", "iris", "--n-clusters", "3", "--device", "cpu", "--quiet"])  # doctest: +ELLIPSIS
    iris: X (150, 4) float32, k=3, on the CPU
    inertia ...
    0
    """
    run(argv)
    return 0


def run(argv=None):
    """The command line's work; returns the fitted estimator.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default: ``sys.argv[1:]``); ``--help`` lists them.

    Returns
    -------
    TSMKMeans
        The fitted estimator.

    Raises
    ------
    SystemExit
        On bad arguments (argparse).

    Examples
    --------
    >>> from tsm_apps.kmeans.__main__ import run
    >>> km = run(["--dataset", "iris", "--n-clusters", "3", "--device", "cpu", "--quiet"])  # doctest: +ELLIPSIS
    iris: X (150, 4) float32, k=3, on the CPU
    inertia ...
    >>> km.n_clusters
    3
    """
    from tsm_datasets import real, synthetic

    p = argparse.ArgumentParser(prog="python -m tsm_apps.kmeans", description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="digits", choices=real.names() + ["blobs", "uniform"])
    p.add_argument("--n-clusters", type=int, default=8)
    # --n-samples / --n-features: under torchrun, whose parser takes --n and --d for its own.
    p.add_argument("--n", "--n-samples", type=int, default=100_000, help="rows (synthetic data)")
    p.add_argument("--d", "--n-features", type=int, default=64, help="features (synthetic data)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--init", default="k-means++", choices=["k-means++", "k-means||", "random"],
                   help="k-means||: a few passes over X instead of one per cluster (large k)")
    p.add_argument("--n-init", default="auto")
    p.add_argument("--max-iter", type=int, default=300)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=["auto", "gpu", "cpu"])
    p.add_argument("--max-gpu-memory", type=float, default=None, help="GiB; larger numpy X is streamed")
    p.add_argument("--quiet", action="store_true", help="print the result only, no progress")
    p.add_argument("--verbose", action="store_true", help="progress lines (the default unless --quiet)")
    p.add_argument("--distributed", action="store_true",
                   help="fit across the ranks of a torch.distributed job (torchrun); each rank makes its shard")
    p.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"],
                   help="--distributed: the process group's backend (auto: nccl on GPUs, gloo on CPUs)")
    p.add_argument("--timeout", type=float, default=None,
                   help="--distributed: seconds a collective may wait (default TSM_DIST_TIMEOUT)")
    a = p.parse_args(argv)
    progress = a.verbose or not a.quiet
    rank, world, own_group = 0, 1, False
    if a.distributed:
        rank, world, own_group = _process_group(a)
    out = print if rank == 0 else (lambda *args, **kw: None)

    from tsm_apps.kmeans import TSMKMeans
    import tsm_core

    t = time.perf_counter()
    if progress:
        what = "loading" if a.dataset in real.names() else f"generating {a.n} x {a.d}"
        out(f"{a.dataset}: {what}{f' over {world} ranks' if a.distributed else ''} ...", flush=True)
    if a.dataset in real.names():
        X, y = real.load(a.dataset, dtype=a.dtype)
        if a.distributed:
            X, y = np.array_split(X, world)[rank], np.array_split(y, world)[rank]
    elif a.distributed:
        X, y = _shard(a, rank, world, synthetic)
    elif a.dataset == "blobs":
        X, y, _ = synthetic.blobs(a.n, a.d, a.n_clusters, seed=a.seed, dtype=a.dtype)
    else:
        X, y = synthetic.uniform(a.n, a.d, seed=a.seed, dtype=a.dtype), None
    n_init = a.n_init if a.n_init == "auto" else int(a.n_init)
    mem = None if a.max_gpu_memory is None else int(a.max_gpu_memory * 2**30)
    gpu = a.device != "cpu" and tsm_core.has_gpu()
    km = TSMKMeans(a.n_clusters, init=a.init, n_init=n_init, max_iter=a.max_iter, tol=a.tol,
                   random_state=a.seed, verbose=int(progress), device=("gpu" if gpu else "cpu") if a.distributed
                   else a.device, max_gpu_memory=mem, distributed=a.distributed, timeout=a.timeout)
    shape = f"X {X.shape}" if not a.distributed else f"X ({a.n if a.dataset not in real.names() else '...'}, " \
        f"{X.shape[1]}) in {world} shards"
    out(f"{a.dataset}: {shape} {X.dtype}, k={a.n_clusters}, on the {'GPU' if gpu else 'CPU'}", flush=True)
    if progress:
        out(f"data ready in {time.perf_counter() - t:.2f} s; fitting ({a.init} initialisation, "
            f"at most {a.max_iter} iterations)", flush=True)
    t = time.perf_counter()
    try:
        km.fit(X)
        el = time.perf_counter() - t
        out(f"inertia {km.inertia_:.6g}  iterations {km.n_iter_}  time {el:.3f} s "
            f"({1e3 * el / km.n_iter_:.3f} ms per iteration, initialisation and transfers included)")
        if y is not None and not a.distributed:
            from sklearn.metrics import adjusted_rand_score

            print(f"adjusted Rand index against the known classes: "
                  f"{adjusted_rand_score(y, np.asarray(km.labels_)):.4f}")
    finally:
        if own_group:
            import torch.distributed as dist

            dist.destroy_process_group()
    return km


def _process_group(a):
    """(rank, world, whether it was initialised here) of the torch.distributed job."""
    import torch.distributed as dist

    from tsm_core.distributed import resolve_timeout

    import tsm_core

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), False
    gpu = a.device != "cpu" and tsm_core.has_gpu()
    backend = a.backend if a.backend != "auto" else ("nccl" if gpu else "gloo")
    if gpu:
        import cupy
        import torch

        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        cupy.cuda.Device(local).use()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=resolve_timeout(a.timeout)))
    return dist.get_rank(), dist.get_world_size(), True


def _shard(a, rank, world, synthetic):
    """This rank's rows of the synthetic data: n split as evenly as can be, from a
    stream seeded by (seed, rank); blobs about the centres that `seed` gives."""
    n = a.n // world + (rank < a.n % world)
    seed = int(np.random.SeedSequence([a.seed, rank]).generate_state(1)[0])
    if n == 0:
        return np.empty((0, a.d), dtype=a.dtype), None
    if a.dataset == "uniform":
        return synthetic.uniform(n, a.d, seed=seed, dtype=a.dtype), None
    X, y, C = synthetic.blobs(n, a.d, a.n_clusters, seed=seed, dtype=a.dtype)
    shared = synthetic.blobs(1, a.d, a.n_clusters, seed=a.seed, dtype=a.dtype)[2]
    X += (shared - C)[y]
    return X, y


if __name__ == "__main__":
    sys.exit(main())

"""Run TSMKMeans on a data set and print inertia, iterations and time.

    python -m tsm_apps.kmeans --dataset digits --n-clusters 10
    python -m tsm_apps.kmeans --dataset blobs --n 1000000 --d 256 --n-clusters 64
    python -m tsm_apps.kmeans --dataset uniform --n 100000 --d 4096 --n-clusters 16 --max-iter 20 --quiet

Real data sets ship with scikit-learn (``tsm_datasets.real``); "blobs" and "uniform"
are seeded synthetic data (``tsm_datasets.synthetic``). Progress (data ready,
initialisation done, a line per Lloyd iteration with its inertia, convergence) is
printed as the fit goes; ``--quiet`` prints the result only.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--n", type=int, default=100_000, help="rows (synthetic data)")
    p.add_argument("--d", type=int, default=64, help="features (synthetic data)")
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
    a = p.parse_args(argv)
    progress = a.verbose or not a.quiet

    from tsm_apps.kmeans import TSMKMeans
    import tsm_core

    t = time.perf_counter()
    if progress:
        what = "loading" if a.dataset in real.names() else f"generating {a.n} x {a.d}"
        print(f"{a.dataset}: {what} ...", flush=True)
    if a.dataset in real.names():
        X, y = real.load(a.dataset, dtype=a.dtype)
    elif a.dataset == "blobs":
        X, y, _ = synthetic.blobs(a.n, a.d, a.n_clusters, seed=a.seed, dtype=a.dtype)
    else:
        X, y = synthetic.uniform(a.n, a.d, seed=a.seed, dtype=a.dtype), None
    n_init = a.n_init if a.n_init == "auto" else int(a.n_init)
    mem = None if a.max_gpu_memory is None else int(a.max_gpu_memory * 2**30)
    km = TSMKMeans(a.n_clusters, init=a.init, n_init=n_init, max_iter=a.max_iter, tol=a.tol,
                   random_state=a.seed, verbose=int(progress), device=a.device, max_gpu_memory=mem)
    gpu = a.device != "cpu" and tsm_core.has_gpu()
    print(f"{a.dataset}: X {X.shape} {X.dtype}, k={a.n_clusters}, on the {'GPU' if gpu else 'CPU'}", flush=True)
    if progress:
        print(f"data ready in {time.perf_counter() - t:.2f} s; fitting ({a.init} initialisation, "
              f"at most {a.max_iter} iterations)", flush=True)
    t = time.perf_counter()
    km.fit(X)
    el = time.perf_counter() - t
    print(f"inertia {km.inertia_:.6g}  iterations {km.n_iter_}  time {el:.3f} s "
          f"({1e3 * el / km.n_iter_:.3f} ms per iteration, initialisation and transfers included)")
    if y is not None:
        from sklearn.metrics import adjusted_rand_score

        print(f"adjusted Rand index against the known classes: {adjusted_rand_score(y, np.asarray(km.labels_)):.4f}")
    return km


if __name__ == "__main__":
    sys.exit(main())

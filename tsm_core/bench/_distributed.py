"""``python -m tsm_core.bench distributed``: scaling past one GPU with torch.distributed.

For each GPU count G of ``--gpus`` (default 1, 2, 4, those the machine has), one
process per GPU is spawned (``torch.multiprocessing``, NCCL; gloo on the CPU with
``--cpu``, at tiny sizes, so that the harness itself can be tested without a GPU),
and each group measures, on that machine and in that one run:

- ``allreduce``: the latency of an allreduce (sum) of k d + k + 1 float32 (k = 1024
  centroid sums of d = 128 features, their counts and the inertia: 0.5 MB), the
  median of many single calls, each between two synchronisations;
- ``h2d``: host-to-device bandwidth from pinned host memory, all G GPUs copying at
  once, and GPU 0 alone;
- ``strong``: k-means per Lloyd iteration at (n, d, k) = (4e7, 128, 1024), float32,
  n split across the G GPUs;
- ``weak``: the same with 1e7 points per GPU;
- ``streamed``: each rank's shard (1e7 x 128 float32) in host memory, clustered
  with ``device="gpu"`` and a GPU memory budget of an eighth of the shard: per
  iteration time and aggregate throughput (all ranks' bytes over the slowest
  rank's iteration), against the concurrent H2D bandwidth (the same memory kind,
  page-locked, and all GPUs copying at once); the chunk size is recorded;
- ``products``: ``distributed_matmul(shard="rows")`` on a TSM2R shape per GPU
  (A_local 32768 x 16384, B 16384 x 8, float32): aggregate bandwidth against G
  times the one-GPU figure.

How a number is made. Every rank's data are random signed normal values generated
on its GPU from a seed (never zeros). Each timed region starts after a barrier (a
one-element allreduce and a device synchronisation) and ends with a device
synchronisation; a group's time is the slowest rank's. k-means runs
``TSMKMeans(n_clusters=k, init=C0, n_init=1, max_iter=I, tol=0, distributed=True)``
with the same initial centres C0 on every rank, after one warm-up fit, then fits of
I and I2 iterations. The time per iteration is clocked directly: each rank takes the
host clock at the end of every iteration, after the host has read the iteration's
status (which waits for its kernels and allreduce; ``_IterationClock``); an
iteration's time is the difference of consecutive ends, the first
``DROP_ITERATIONS`` of every fit are left out, the slowest rank's time of each
iteration counts (the allreduce makes it everyone's), and ``per_iter_s`` is the
median over the timed fits' iterations, with their min and max. The speedups,
efficiencies and acceptance rest on it. For comparison ``per_iter_fits_s`` keeps
``(t(I) - t(I2)) / (n_iter(I) - n_iter(I2))`` from the fits' times, which cancels a
fit's fixed costs (input checks, allocation, page-locking a streamed shard) on
average but carries their variance, seconds where a shard is page-locked (divided
by I - I2 = 8, a streamed figure above the copy rate). A streamed figure above
``SUSPECT_FRAC`` of the concurrent copy rate is flagged "above the copy rate:
measurement suspect" in the JSON, the table and the acceptance, never passed. With
one GPU the ordinary single-process fit (no ``distributed``) is timed as well and
is the baseline of the speedups. The streamed shard is an ordinary numpy array,
which the streamed source page-locks in place for the fit (its copies are DMA from
pinned memory).

``python -m tsm_core.bench distributed --only allreduce,h2d`` runs a subset (a
run must fit the time a machine is lent for) and names its files after it
(``distributed_allreduce_h2d.json``); ``--quick`` uses small sizes.
Writes ``<out>/distributed.json`` (every rank's numbers, the combined figures, the
acceptance checks, the GPUs, torch, NCCL and CUDA versions, command, date and git
commit) and ``<out>/distributed.png`` (time and efficiency against G, one panel
per experiment), and prints a table. torch and CuPy are imported when a run
starts, so ``--help`` works anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

EXPERIMENTS = ("allreduce", "h2d", "strong", "weak", "streamed", "products")
GPU_ONLY = ("h2d", "streamed")
KMEANS = ("strong", "weak", "streamed")
# The allreduce of one Lloyd iteration at k = 1024, d = 128: sums, counts, inertia.
ALLREDUCE_K, ALLREDUCE_D = 1024, 128

# Acceptance: name -> (op, threshold), the targets of this work.
ACCEPT = {
    "strong_speedup_2": (">=", 1.9),
    "strong_speedup_4": (">=", 3.7),
    "weak_ratio_4": ("<=", 1.08),
    "streamed_frac_h2d": (">=", 0.9),
    "products_efficiency": (">=", 0.9),
}


@dataclass(frozen=True)
class Sizes:
    """The sizes of one run (per experiment); FULL, QUICK and CPU below."""

    d: int
    k: int
    strong_n: int  # total points, split across the ranks
    weak_n: int  # points per rank
    iters: tuple  # (I, I2): the fits whose difference gives the time per iteration
    repeats: int  # timed fits of each length
    stream_n: int  # points per rank, in host memory
    stream_budget_div: int  # GPU memory budget = shard bytes / this
    h2d_bytes: int
    h2d_reps: int
    allreduce_reps: int
    prod: tuple  # (M_local, K, N) per rank
    prod_reps: int


FULL = Sizes(d=128, k=1024, strong_n=40_000_000, weak_n=10_000_000, iters=(12, 4), repeats=2,
             stream_n=10_000_000, stream_budget_div=8, h2d_bytes=1 << 30, h2d_reps=8,
             allreduce_reps=500, prod=(32768, 16384, 8), prod_reps=20)
QUICK = Sizes(d=128, k=1024, strong_n=4_000_000, weak_n=1_000_000, iters=(6, 2), repeats=1,
              stream_n=1_000_000, stream_budget_div=8, h2d_bytes=256 << 20, h2d_reps=4,
              allreduce_reps=200, prod=(16384, 8192, 8), prod_reps=10)
CPU = Sizes(d=16, k=16, strong_n=20000, weak_n=10000, iters=(6, 2), repeats=2, stream_n=0,
            stream_budget_div=8, h2d_bytes=0, h2d_reps=0, allreduce_reps=30,
            prod=(512, 64, 4), prod_reps=5)


def sizes_for(quick: bool, cpu: bool) -> Sizes:
    return CPU if cpu else (QUICK if quick else FULL)


def kmeans_supports_distributed() -> tuple[bool, str]:
    """Whether ``TSMKMeans`` takes ``distributed`` (its signature says), and why not."""
    try:
        from tsm_apps.kmeans import TSMKMeans
    except Exception as e:  # the app is not installed: the k-means part cannot run
        return False, f"tsm_apps.kmeans does not import: {type(e).__name__}: {e}"
    if "distributed" in inspect.signature(TSMKMeans).parameters:
        return True, ""
    return False, "TSMKMeans has no 'distributed' parameter in this version"


# ---------------------------------------------------------------- the ranks


class _Rank:
    """What a rank's experiments share: its place in the group, its device, its
    clocks and its data generator."""

    def __init__(self, rank, world, cfg, torch, dist):
        self.rank, self.world, self.cfg = rank, world, cfg
        self.torch, self.dist = torch, dist
        self.gpu = cfg["gpu"]
        self.sizes = Sizes(**cfg["sizes"])
        self.seed = cfg["seed"]
        self.device = torch.device("cuda", rank) if self.gpu else torch.device("cpu")
        self._token = torch.zeros(1, device=self.device)
        if self.gpu:
            import cupy

            self.cupy = cupy

    def sync(self):
        if self.gpu:
            self.torch.cuda.synchronize()
            self.cupy.cuda.Device().synchronize()

    def barrier(self):
        """All ranks here, and this rank's device idle."""
        self.sync()
        self.dist.all_reduce(self._token)
        self.sync()

    def loop(self, fn, reps) -> float:
        """Seconds per call of ``reps`` back-to-back calls, synchronised at the end."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / reps

    def timed(self, fn, reps) -> float:
        """`loop` started together on every rank (a barrier first)."""
        self.barrier()
        return self.loop(fn, reps)

    def seed_for(self, *tags) -> int:
        return int(np.random.SeedSequence([self.seed, *tags]).generate_state(1)[0])

    def randn(self, shape, seed, *, host=False):
        """Standard normal float32 of `shape`: on this rank's GPU, or in host memory
        (numpy) with ``host`` or without a GPU, generated on the GPU where there is one."""
        if not self.gpu:
            return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        rng = self.cupy.random.default_rng(seed)
        if not host:
            return rng.standard_normal(shape, dtype=self.cupy.float32)
        out = np.empty(shape, dtype=np.float32)
        rows = max(1, (256 << 20) // max(1, 4 * int(np.prod(shape[1:]))))
        for a in range(0, shape[0], rows):
            b = min(shape[0], a + rows)
            rng.standard_normal((b - a, *shape[1:]), dtype=self.cupy.float32).get(out=out[a:b])
        return out

    def free(self):
        if self.gpu:
            self.cupy.get_default_memory_pool().free_all_blocks()
            self.torch.cuda.empty_cache()


# ---------------------------------------------------------------- the iteration clock

# Iterations of a fit that the direct clock leaves out: the first two (compile,
# first-touch allocation, the pipeline of streamed chunks filling up).
DROP_ITERATIONS = 2
# A streamed figure above this fraction of the concurrent copy rate is not physical.
SUSPECT_FRAC = 1.05
SUSPECT = "above the copy rate: measurement suspect"

# The status reads of tsm_core's Lloyd loops (``lloyd`` and ``_lloyd_overlapped``),
# one an iteration, and the relocations of empty clusters, after which a second read
# ends the same iteration: (module, class, method, what).
_CLOCK_TARGETS = (
    ("tsm_core.kmeans.lloyd", "_GpuSteps", "finalize", "read"),  # a read unless wait=False
    ("tsm_core.kmeans.lloyd", "_GpuSteps", "status_wait", "read"),
    ("tsm_core.kmeans.lloyd", "_GpuSteps", "relocate_empty", "relocate"),
    ("tsm_core.kmeans.distributed", "DistributedSteps", "update", "read"),
    ("tsm_core.kmeans.distributed", "DistributedSteps", "relocate_empty", "relocate"),
    ("tsm_core.kmeans.distributed", "_GroupGpuSteps", "relocate_empty", "relocate"),
    ("tsm_apps.kmeans._cpu", "CpuSteps", "update", "read"),
    ("tsm_apps.kmeans._cpu", "CpuSteps", "relocate_empty", "relocate"),
    ("tsm_apps.kmeans._cpu", "SklearnSteps", "update", "read"),
)


class _IterationClock:
    """The host clock at the end of each Lloyd iteration of a fit, in this process.

    An iteration ends when the host has read its status (the centre shift, the
    empty clusters, whether a label changed): on the GPU that read waits for the
    iteration's kernels (and, in a group, its allreduce), on the CPU it is the
    update's result. `install` wraps those reads in the steps classes of the loops
    (``_CLOCK_TARGETS``; nothing else changes: a wrapped read calls the original and
    then, while a fit is timed, takes ``time.perf_counter()``). A read nested in
    another (the CPU group's update calls the rank's own) counts once, and after a
    relocation of empty clusters the second read of the iteration replaces the
    first. So a fit of n iterations leaves n end times, which `fit` checks against
    the estimator's ``n_iter_``."""

    def __init__(self):
        self.ends = None  # a list while a fit is timed
        self.depth = 0
        self.relocated = False
        self.installed: list[str] = []
        self.missing: list[str] = []
        self._originals: list[tuple] = []

    def install(self) -> "_IterationClock":
        """Wrap the targets that this installation has (once; `missing` lists the rest)."""
        import importlib

        if self.installed or self.missing:
            return self
        for module, cls_name, meth, what in _CLOCK_TARGETS:
            name = f"{module}.{cls_name}.{meth}"
            try:
                cls = getattr(importlib.import_module(module), cls_name)
            except (ImportError, AttributeError):
                self.missing.append(name)
                continue
            fn = cls.__dict__.get(meth)
            if fn is None:
                self.missing.append(name)
                continue
            setattr(cls, meth, self._read(fn) if what == "read" else self._relocate(fn))
            self._originals.append((cls, meth, fn))
            self.installed.append(name)
        return self

    def uninstall(self) -> None:
        """Put the original methods back."""
        for cls, meth, fn in reversed(self._originals):
            setattr(cls, meth, fn)
        self._originals, self.installed, self.missing = [], [], []

    def _read(self, fn):
        clock = self

        def read(*args, **kw):
            clock.depth += 1
            try:
                out = fn(*args, **kw)
            finally:
                clock.depth -= 1
            # finalize(wait=False) only queues the status's copy: no read, None.
            if clock.ends is not None and clock.depth == 0 and out is not None:
                now = time.perf_counter()
                if clock.relocated and clock.ends:
                    clock.ends[-1] = now
                else:
                    clock.ends.append(now)
                clock.relocated = False
            return out

        read.__wrapped__ = fn
        return read

    def _relocate(self, fn):
        clock = self

        def relocate(*args, **kw):
            out = fn(*args, **kw)
            if clock.ends is not None:
                clock.relocated = True
            return out

        relocate.__wrapped__ = fn
        return relocate

    def start(self) -> list:
        self.ends, self.depth, self.relocated = [], 0, False
        return self.ends

    def stop(self) -> list:
        ends, self.ends = self.ends, None
        return ends


CLOCK = _IterationClock()


def iteration_times(ends, drop: int = DROP_ITERATIONS) -> list:
    """Seconds of iterations drop, drop + 1, ... of a fit from its iteration end
    times (iteration i takes ends[i] - ends[i - 1]; drop >= 1).

    Examples
    --------
    >>> iteration_times([1.0, 1.5, 1.75, 2.0, 2.5])
    [0.25, 0.25, 0.5]
    """
    return [ends[i] - ends[i - 1] for i in range(max(1, drop), len(ends))]


def _exp_allreduce(r: _Rank) -> dict:
    torch, dist = r.torch, r.dist
    n = ALLREDUCE_K * ALLREDUCE_D + ALLREDUCE_K + 1
    # Small values: the batched calls below multiply them by the world size each time.
    x0 = torch.randn(n, device=r.device) * 2.0**-100
    x = x0.clone()
    for _ in range(20):
        dist.all_reduce(x)
    samples = []
    r.barrier()
    for _ in range(r.sizes.allreduce_reps):
        x.copy_(x0)
        r.sync()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        r.sync()
        samples.append(time.perf_counter() - t0)
    x.copy_(x0)
    batched = r.timed(lambda: dist.all_reduce(x), 40)
    return dict(bytes=4 * n, median_s=statistics.median(samples), min_s=min(samples),
                samples=len(samples), batched_s=batched)


def _exp_h2d(r: _Rank) -> dict:
    torch = r.torch
    nbytes, reps = r.sizes.h2d_bytes, r.sizes.h2d_reps
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    host.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=r.device)

    def copy():
        dev.copy_(host, non_blocking=True)

    copy()
    concurrent = r.timed(copy, reps)
    alone = None
    r.barrier()
    if r.rank == 0:
        alone = r.loop(copy, reps)
    r.barrier()
    return dict(bytes=nbytes, reps=reps, concurrent_s=concurrent, alone_s=alone)


def _fit_times(r: _Rank, make, X) -> dict:
    """Warm-up fit, then `repeats` timed fits of I and of I2 iterations: each fit's
    time and its iterations' end times (``ends_I``, ``ends_I2``: seconds from the
    fit's start, one list a fit; `CLOCK`)."""
    I, I2 = r.sizes.iters
    CLOCK.install()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer distinct clusters on random data, say
        make(I2).fit(X)
        out = {"t_I": [], "t_I2": [], "ends_I": [], "ends_I2": []}
        clock_errors = []
        for _ in range(r.sizes.repeats):
            for tag, it in (("I", I), ("I2", I2)):
                est = make(it)
                r.barrier()
                t0 = time.perf_counter()
                CLOCK.start()
                try:
                    est.fit(X)
                    r.sync()
                finally:
                    ends = CLOCK.stop()
                out["t_" + tag].append(time.perf_counter() - t0)
                out["n_iter_" + tag] = n_iter = int(est.n_iter_)
                if len(ends) == n_iter:
                    out["ends_" + tag].append([t - t0 for t in ends])
                else:  # the loops read their status differently from what CLOCK wraps
                    out["ends_" + tag].append(None)
                    clock_errors.append(f"{len(ends)} iteration ends for n_iter_ = {n_iter}")
    out["iters"] = [I, I2]
    out["clock"] = "; ".join(sorted(set(clock_errors))) or "ok"
    if CLOCK.missing:
        out["clock_missing"] = CLOCK.missing
    return out


def _kmeans(r: _Rank, n_local: int, tag: str, *, streamed: bool = False) -> dict:
    from tsm_apps.kmeans import TSMKMeans

    s = r.sizes
    X = r.randn((n_local, s.d), r.seed_for(1, r.world, r.rank, EXPERIMENTS.index(tag)),
                host=streamed)
    centres = np.random.default_rng(r.seed_for(2)).standard_normal((s.k, s.d)).astype(np.float32)
    kw = dict(n_clusters=s.k, init=centres, n_init=1, tol=0.0)
    if r.cfg.get("precision"):
        kw["precision"] = r.cfg["precision"]
    if streamed:
        budget = max(1 << 20, X.nbytes // s.stream_budget_div)
        kw.update(device="gpu", max_gpu_memory=int(budget))
    elif not r.gpu:
        kw["device"] = "cpu"
    rec = dict(n_local=n_local, d=s.d, k=s.k, x_bytes=int(X.nbytes),
               budget_bytes=kw.get("max_gpu_memory"), precision=r.cfg.get("precision"))
    if streamed and r.gpu:
        from tsm_core.kmeans.sources import stream_chunk_rows

        rec["chunk_rows"] = stream_chunk_rows(n_local, s.d, X.dtype, s.k, kw["max_gpu_memory"])
    rec.update(_fit_times(r, lambda it: TSMKMeans(max_iter=it, distributed=True, **kw), X))
    if r.world == 1 and not streamed:  # the single-process fit: the baseline
        rec["single"] = _fit_times(r, lambda it: TSMKMeans(max_iter=it, **kw), X)
    return rec


def _split(n: int, world: int, rank: int) -> int:
    return n // world + (1 if rank < n % world else 0)


def _exp_strong(r: _Rank) -> dict:
    return _kmeans(r, _split(r.sizes.strong_n, r.world, r.rank), "strong")


def _exp_weak(r: _Rank) -> dict:
    return _kmeans(r, r.sizes.weak_n, "weak")


def _exp_streamed(r: _Rank) -> dict:
    return _kmeans(r, r.sizes.stream_n, "streamed", streamed=True)


def _exp_products(r: _Rank) -> dict:
    import tsm_core
    from tsm_core.distributed.products import distributed_matmul

    m, k, n = r.sizes.prod
    xp = r.cupy if r.gpu else np
    A = r.randn((m, k), r.seed_for(3, r.world, r.rank))
    B = r.randn((k, n), r.seed_for(4))  # the same B on every rank
    C = xp.empty((m, n), dtype=xp.float32)
    distributed_matmul(A, B, out=C)
    rows = min(m, 2048)
    ref = A[:rows].astype(xp.float64) @ B.astype(xp.float64)
    C[...] = np.nan
    distributed_matmul(A, B, out=C)
    err = float(xp.linalg.norm(C[:rows].astype(xp.float64) - ref) / xp.linalg.norm(ref))
    reps = r.sizes.prod_reps
    rec = dict(m=m, k=k, n=n, bytes=(m * k + k * n + m * n) * 4, rel_err=err)
    rec["time_s"] = r.timed(lambda: distributed_matmul(A, B, out=C), reps)
    rec["time_validated_s"] = r.timed(lambda: distributed_matmul(A, B, out=C, validate=True), reps)
    rec["matmul_s"] = r.timed(lambda: tsm_core.matmul(A, B, out=C), reps)
    return rec


RANK_EXPERIMENTS = {"allreduce": _exp_allreduce, "h2d": _exp_h2d, "strong": _exp_strong,
                    "weak": _exp_weak, "streamed": _exp_streamed, "products": _exp_products}


def _group(world: int) -> str:
    return f"[{world} rank{'s' if world > 1 else ''}]"


def _progress(name: str, world: int, rec: dict) -> str:
    if "error" in rec:
        return f"{_group(world)} {name}: {rec['error']}"
    if name == "allreduce":
        what = f"{rec['median_s'] * 1e6:.1f} us (batched {rec['batched_s'] * 1e6:.1f} us)"
    elif name == "h2d":
        what = f"{rec['bytes'] * 1e-9 / rec['concurrent_s']:.1f} GB/s on rank 0 with all copying"
    elif name == "products":
        what = f"{rec['bytes'] * 1e-9 / rec['time_s']:.0f} GB/s on rank 0, rel err {rec['rel_err']:.1e}"
    else:
        what = f"fit of {rec['iters'][0]} iterations {min(rec['t_I']):.3f} s on rank 0"
        its = [t for e in rec.get("ends_I", []) if e for t in iteration_times(e)]
        if its:
            what += f", median iteration {statistics.median(its) * 1e3:.3f} ms"
        if rec.get("clock", "ok") != "ok":
            what += f" (iteration clock: {rec['clock']})"
    return f"{_group(world)} {name}: {what}"


def _worker(rank: int, world: int, port: int, cfg: dict, out_dir: str) -> None:
    """One rank: join the group, run the experiments, write rank<r>.json after each."""
    import torch
    import torch.distributed as dist

    from tsm_core.bench import _clean

    path = Path(out_dir) / f"rank{rank}.json"
    res: dict = {"rank": rank, "world": world}

    def save():
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(_clean(res)))
        os.replace(tmp, path)

    try:
        if cfg["gpu"]:
            import cupy

            torch.cuda.set_device(rank)
            cupy.cuda.Device(rank).use()
            res["device"] = torch.cuda.get_device_name(rank)
        dist.init_process_group("nccl" if cfg["gpu"] else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=cfg["collective_timeout_s"]))
        r = _Rank(rank, world, cfg, torch, dist)
        for name in cfg["experiments"]:
            t0 = time.perf_counter()
            try:
                rec = RANK_EXPERIMENTS[name](r)
            except Exception as e:  # recorded; the group may be out of step: stop here
                rec = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            r.free()
            rec["elapsed_s"] = time.perf_counter() - t0
            res[name] = rec
            save()
            if rank == 0:
                print(_progress(name, world, rec), flush=True)
            if "error" in rec:
                break
        dist.destroy_process_group()
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
        save()
        raise
    save()


# ---------------------------------------------------------------- the parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, cfg: dict, timeout_s: float) -> dict:
    """Spawn `world` ranks, wait up to `timeout_s`, terminate what is left; the
    ranks' reports and how the run ended."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tsm-distributed-") as out_dir:
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, world, port, cfg, out_dir), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        timed_out = [i for i, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
        codes = [p.exitcode for p in procs]
        ranks = []
        for i in range(world):
            f = Path(out_dir) / f"rank{i}.json"
            ranks.append(json.loads(f.read_text()) if f.exists() else {"rank": i, "error": "no report"})
    if timed_out:
        status = f"timeout after {timeout_s:.0f} s (ranks {timed_out} terminated)"
    elif any(c != 0 for c in codes):
        status = f"failed (exit codes {codes})"
    else:
        status = "ok"
    return dict(world=world, status=status, exit_codes=codes,
                elapsed_s=time.perf_counter() - t0, ranks=ranks)


def _ranks_of(run: dict, name: str):
    """The ranks' records of one experiment, or None unless every rank has one
    without an error."""
    recs = [rk.get(name) for rk in run["ranks"]]
    if not recs or any(rec is None or "error" in rec for rec in recs):
        return None
    return recs


def _errors_of(run: dict, name: str) -> list[str]:
    out = []
    for rk in run["ranks"]:
        rec = rk.get(name)
        if rec is not None and "error" in rec:
            out.append(f"rank {rk['rank']}: {rec['error']}")
    return out


def _iteration_samples(fits: list[dict]) -> tuple[list, str | None]:
    """The group's time of each iteration of each timed fit, from the ranks' end
    times: iterations from ``DROP_ITERATIONS`` on, the slowest rank's time of each
    (the allreduce makes every rank wait for it). Returns (samples, why none)."""
    samples = []
    for key in ("ends_I", "ends_I2"):
        per_rank = [f.get(key) for f in fits]
        if any(p is None for p in per_rank):
            return [], "no iteration end times (an older record)"
        if len({len(p) for p in per_rank}) != 1:
            return [], f"ranks timed different numbers of fits ({key})"
        for ends in zip(*per_rank):
            if any(e is None for e in ends):
                return [], "; ".join(sorted({f.get("clock", "?") for f in fits} - {"ok"}))
            times = [iteration_times(e) for e in ends]
            if len({len(t) for t in times}) != 1:
                return [], "ranks ran different numbers of iterations"
            samples.extend(max(ts) for ts in zip(*times))
    return samples, None if samples else f"no iteration past the first {DROP_ITERATIONS}"


def _per_iter(fits: list[dict]) -> dict:
    """The group's figures of one fit series. ``per_iter_s``: the median over the
    timed fits' iterations (the first ``DROP_ITERATIONS`` of each left out) of the
    slowest rank's time of the iteration, with its min and max; ``per_iter_fits_s``:
    ``(t(I) - t(I2)) / (n_iter(I) - n_iter(I2))`` from the slowest rank's median fit
    times, kept for comparison (it carries the variance of the fits' fixed parts)."""
    I, I2 = fits[0]["iters"]
    tI = max(statistics.median(f["t_I"]) for f in fits)
    tI2 = max(statistics.median(f["t_I2"]) for f in fits)
    nI, nI2 = fits[0].get("n_iter_I"), fits[0].get("n_iter_I2")
    by_fits = (tI - tI2) / (nI - nI2) if nI is not None and nI2 is not None and nI > nI2 else None
    samples, why = _iteration_samples(fits)
    out = dict(fit_s=tI, fit_short_s=tI2, n_iter=nI, n_iter_short=nI2,
               per_iter_s=statistics.median(samples) if samples else None,
               per_iter_min_s=min(samples) if samples else None,
               per_iter_max_s=max(samples) if samples else None,
               per_iter_samples=len(samples), per_iter_fits_s=by_fits, iters=[I, I2],
               per_iter_how=f"iteration end times, first {DROP_ITERATIONS} iterations of each "
                            "fit left out, slowest rank of each iteration")
    if why:
        out["clock_error"] = why
    return out


def combine(runs: list[dict]) -> dict:
    """The figures per experiment and GPU count, from the ranks' records; efficiency
    against the one-GPU run of the same document where there is one."""
    out: dict = {name: [] for name in EXPERIMENTS}
    for run in sorted(runs, key=lambda r: r["world"]):
        G = run["world"]
        for name in EXPERIMENTS:
            recs = _ranks_of(run, name)
            errors = _errors_of(run, name)
            if recs is None:
                if errors:
                    out[name].append(dict(gpus=G, error="; ".join(errors)))
                continue
            if name == "allreduce":
                row = dict(bytes=recs[0]["bytes"],
                           latency_s=max(x["median_s"] for x in recs),
                           batched_s=max(x["batched_s"] for x in recs))
            elif name == "h2d":
                nb = recs[0]["bytes"] * recs[0]["reps"]
                per = [recs[0]["bytes"] / x["concurrent_s"] / 1e9 for x in recs]
                row = dict(bytes=recs[0]["bytes"], per_gpu_gbps_min=min(per),
                           per_gpu_gbps_mean=statistics.mean(per),
                           aggregate_gbps=G * nb / (max(x["concurrent_s"] for x in recs)
                                                    * recs[0]["reps"]) / 1e9,
                           alone_gbps=recs[0]["bytes"] / recs[0]["alone_s"] / 1e9)
            elif name == "products":
                total = sum(x["bytes"] for x in recs)
                t = max(x["time_s"] for x in recs)
                row = dict(m_local=recs[0]["m"], k=recs[0]["k"], n=recs[0]["n"],
                           bytes_per_gpu=recs[0]["bytes"], time_s=t,
                           aggregate_gbps=total / t / 1e9,
                           time_validated_s=max(x["time_validated_s"] for x in recs),
                           aggregate_gbps_validated=total / max(x["time_validated_s"] for x in recs) / 1e9,
                           matmul_s=max(x["matmul_s"] for x in recs),
                           max_rel_err=max(x["rel_err"] for x in recs))
            else:
                row = dict(n_total=sum(x["n_local"] for x in recs), n_local_max=max(
                    x["n_local"] for x in recs), d=recs[0]["d"], k=recs[0]["k"],
                    precision=recs[0].get("precision"), **_per_iter(recs))
                if name == "streamed":
                    row["budget_bytes"] = recs[0]["budget_bytes"]
                    row["chunk_rows"] = recs[0].get("chunk_rows")
                    total = sum(x["x_bytes"] for x in recs)
                    row["x_bytes_total"] = total
                    for sfx in ("", "_fits"):
                        t = row["per_iter" + sfx + "_s"]
                        row["aggregate_gbps" + sfx] = total / t / 1e9 if t and t > 0 else None
                if all("single" in x for x in recs):
                    row["single"] = _per_iter([x["single"] for x in recs])
            out[name].append(dict(gpus=G, **row))
    _efficiencies(out)
    return out


def _base(rows):
    return next((r for r in rows if r["gpus"] == 1 and "error" not in r), None)


def _efficiencies(out: dict) -> None:
    """Speedups and efficiencies against one GPU, in place."""
    for name in ("strong", "weak"):
        b = _base(out[name])
        if b is None:
            continue
        single = b.get("single") or {}
        which = "single-process fit" if single.get("per_iter_s") else "distributed fit, 1 GPU"
        # The direct clock's figures, then the differences of fits' ("_fits").
        for sfx in ("", "_fits"):
            key = "per_iter" + sfx + "_s"
            t1 = single.get(key) if single.get("per_iter_s") else b.get(key)
            for r in out[name]:
                t = r.get(key)
                if not t or not t1 or t <= 0 or t1 <= 0:
                    continue
                if not sfx:
                    r["baseline"] = which
                    r["baseline_per_iter_s"] = t1
                if name == "strong":
                    r["speedup" + sfx] = t1 / t
                    r["efficiency" + sfx] = t1 / t / r["gpus"]
                else:
                    r["ratio_to_1" + sfx] = t / t1
                    r["efficiency" + sfx] = t1 / t
    h2d = {r["gpus"]: r for r in out["h2d"] if "error" not in r}
    for r in out["streamed"]:
        h = h2d.get(r["gpus"])
        if not h:
            continue
        r["h2d_aggregate_gbps"] = h["aggregate_gbps"]
        for sfx in ("", "_fits"):
            if r.get("aggregate_gbps" + sfx):
                r["frac_h2d" + sfx] = r["aggregate_gbps" + sfx] / h["aggregate_gbps"]
                r["efficiency" + sfx] = r["frac_h2d" + sfx]
        # Faster than the copies that feed it cannot be: say so, never pass it silently.
        if (r.get("frac_h2d") or 0) > SUSPECT_FRAC:
            r["suspect"] = SUSPECT
    b = _base(out["products"])
    for r in out["products"]:
        if b and "error" not in r:
            r["efficiency"] = r["aggregate_gbps"] / (r["gpus"] * b["aggregate_gbps"])
    for r in out["h2d"]:
        if "error" not in r:
            r["efficiency"] = r["per_gpu_gbps_min"] / r["alone_gbps"]
    b = _base(out["allreduce"])
    for r in out["allreduce"]:
        if b and "error" not in r:
            r["ratio_to_1"] = r["latency_s"] / b["latency_s"]


def acceptance(results: dict) -> dict:
    """The acceptance entries that the measured GPU counts allow (``pass`` None
    where a figure is missing)."""
    from tsm_core.bench import _check

    def row(name, G):
        return next((r for r in results[name] if r["gpus"] == G and "error" not in r), None)

    acc = {}
    for G in (2, 4):
        r = row("strong", G)
        acc[f"strong_speedup_{G}"] = _check([r.get("speedup")] if r else [],
                                            *ACCEPT[f"strong_speedup_{G}"])
    r = row("weak", 4)
    acc["weak_ratio_4"] = _check([r.get("ratio_to_1")] if r else [], *ACCEPT["weak_ratio_4"])
    fr = {r["gpus"]: r.get("frac_h2d") for r in results["streamed"] if "error" not in r}
    acc["streamed_frac_h2d"] = e = _check(list(fr.values()), *ACCEPT["streamed_frac_h2d"], by=fr)
    suspect = {r["gpus"]: r["frac_h2d"] for r in results["streamed"] if r.get("suspect")}
    if suspect:  # a failure stands; a pass resting on an impossible figure does not
        e["suspect"] = suspect
        e["note"] = f"{SUSPECT} (above {SUSPECT_FRAC:g} of the concurrent copy rate)"
        if e["pass"]:
            e["pass"] = None
    ef = {r["gpus"]: r.get("efficiency") for r in results["products"]
          if "error" not in r and r["gpus"] > 1}
    acc["products_efficiency"] = _check(list(ef.values()), *ACCEPT["products_efficiency"], by=ef)
    return acc


# ---------------------------------------------------------------- provenance


def _environment(gpu: bool, gpus_present: int) -> dict:
    import torch

    from tsm_core.bench import _environment as gpu_environment
    from tsm_core.bench import _run_quiet

    if gpu:
        import cupy

        env = gpu_environment(cupy)
        names = []
        for i in range(gpus_present):
            p = cupy.cuda.runtime.getDeviceProperties(i)
            names.append(p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"]))
        env["gpus"] = names
        env["topology"] = _run_quiet(["nvidia-smi", "topo", "-m"])
    else:
        root = Path(__file__).resolve().parents[2]
        env = dict(gpu="none (gloo on the CPU)", gpu_slug="cpu", numpy=np.__version__,
                   python=platform.python_version(),
                   git_commit=_run_quiet(["git", "-C", str(root), "rev-parse", "HEAD"]))
        status = _run_quiet(["git", "-C", str(root), "status", "--porcelain"])
        env["git_dirty"] = None if env["git_commit"] is None else bool(status)
    env["host"] = platform.node()
    env["cpu"] = platform.processor() or platform.machine()
    env["cpu_count"] = os.cpu_count()
    env["torch"] = torch.__version__
    env["torch_cuda"] = torch.version.cuda
    try:
        v = torch.cuda.nccl.version() if gpu else None
        env["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else (str(v) if v else None)
    except Exception:  # torch built without NCCL
        env["nccl"] = None
    env["nccl_env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL"))}
    return env


def _gpu_count() -> int:
    from tsm_core.runtime.arrays import has_gpu

    if not has_gpu():
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


# ---------------------------------------------------------------- figure and table


PANELS = (("allreduce", "allreduce 0.5 MB", "latency_s", 1e6, "us", "ratio_to_1", "latency / 1 GPU"),
          ("h2d", "host to device, all GPUs at once", "per_gpu_gbps_min", 1, "GB/s per GPU",
           "efficiency", "per GPU / one alone"),
          ("strong", "k-means strong scaling", "per_iter_s", 1e3, "ms per iteration",
           "efficiency", "efficiency"),
          ("weak", "k-means weak scaling", "per_iter_s", 1e3, "ms per iteration",
           "efficiency", "efficiency"),
          ("streamed", "k-means, shards streamed from host", "per_iter_s", 1e3,
           "ms per iteration", "frac_h2d", "throughput / H2D"),
          ("products", "row-sharded products (TSM2R shape)", "time_s", 1e3, "ms per call",
           "efficiency", "efficiency"))


def plot(doc: dict, path: Path) -> Path:
    """distributed.png: one panel per experiment, its time (left axis) and
    efficiency (right axis, dashed) against the GPU count."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 8.5))
    axes = fig.subplots(2, 3).ravel()
    res = doc["results"]
    for ax, (name, title, key, scale, unit, eff, eff_label) in zip(axes, PANELS):
        rows = [r for r in res.get(name, []) if "error" not in r and r.get(key) is not None]
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("processes (gloo, CPU)" if doc.get("cpu") else "GPUs")
        if not rows:
            why = (doc.get("skipped") or {}).get(name, "not measured")
            ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True, fontsize=8,
                    transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        g = [r["gpus"] for r in rows]
        ys = [r[key] * scale for r in rows]
        ax.plot(g, ys, "o-", color="C0")
        if key == "per_iter_s":  # k-means: the iterations' spread, and the figure by fits
            lo = [y - r["per_iter_min_s"] * scale for y, r in zip(ys, rows)]
            hi = [r["per_iter_max_s"] * scale - y for y, r in zip(ys, rows)]
            ax.errorbar(g, ys, yerr=[lo, hi], fmt="none", ecolor="C0", capsize=3, lw=0.8)
            top = [y + h for y, h in zip(ys, hi)]
            fits = [(r["gpus"], r["per_iter_fits_s"] * scale) for r in rows if r.get("per_iter_fits_s")]
            if fits:
                ax.plot([x for x, _ in fits], [y for _, y in fits], "x:", color="0.5",
                        label="difference of fits")
                ax.legend(fontsize=7, loc="lower left")
                top += [y for _, y in fits]
            ys = ys + top
        ax.set_ylabel(unit, color="C0")
        ax.set_xticks(g)
        ax.set_ylim(0, max(ys) * 1.15 or 1.0)
        e = [(r["gpus"], r[eff]) for r in rows if r.get(eff) is not None]
        if e:
            ax2 = ax.twinx()
            ax2.plot([x for x, _ in e], [y for _, y in e], "s--", color="C1")
            ax2.axhline(1.0, color="C1", lw=0.5, alpha=0.5)
            ax2.set_ylabel(eff_label, color="C1")
            if name == "streamed":  # above it: a measurement to doubt
                ax2.axhline(SUSPECT_FRAC, color="C3", lw=0.8, ls=":")
            ax2.set_ylim(0, max(1.2, max(y for _, y in e) * 1.1))
    env = doc["environment"]
    fig.suptitle(f"tsm_core across GPUs (torch.distributed): {env.get('gpu')}, "
                 f"{doc['date_utc']}, commit {str(env.get('git_commit'))[:10]}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _f(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def format_table(doc: dict) -> str:
    """The printout: a row per experiment and GPU count, then the acceptance. For
    k-means the time is the direct clock's median iteration (its min and max at the
    end of the row) and ``fits`` the difference of fits, for comparison."""
    res = doc["results"]
    lines = [f"{'experiment':10} {'GPUs':>4} {'time':>12} {'fits':>10} {'figure':>22} {'efficiency':>10}"]
    for name in EXPERIMENTS:
        for r in res.get(name, []):
            if "error" in r:
                lines.append(f"{name:10} {r['gpus']:>4} error: {r['error'][:80]}")
                continue
            fits, tail = "", ""
            if name == "allreduce":
                t, fig = f"{r['latency_s'] * 1e6:9.1f} us", f"x{_f(r.get('ratio_to_1'), '.2f')} of 1 GPU"
            elif name == "h2d":
                t = "-"
                fig = f"{r['per_gpu_gbps_min']:.1f} GB/s/GPU (1: {r['alone_gbps']:.1f})"
            elif name == "products":
                t, fig = f"{r['time_s'] * 1e3:9.3f} ms", f"{r['aggregate_gbps']:.0f} GB/s total"
            else:
                t = f"{r['per_iter_s'] * 1e3:9.3f} ms" if r.get("per_iter_s") else "-"
                fits = f"{r['per_iter_fits_s'] * 1e3:.3f}" if r.get("per_iter_fits_s") else "-"
                if name == "strong":
                    fig = f"x{_f(r.get('speedup'), '.2f')} speedup"
                elif name == "weak":
                    fig = f"x{_f(r.get('ratio_to_1'), '.3f')} of 1 GPU time"
                else:
                    fig = f"{_f(r.get('aggregate_gbps'), '.1f')} GB/s total"
                if r.get("per_iter_s"):
                    tail = (f"  iterations {r['per_iter_min_s'] * 1e3:.3f}-{r['per_iter_max_s'] * 1e3:.3f} ms"
                            f" ({r['per_iter_samples']})")
                if r.get("clock_error"):
                    tail += f"  no direct clock: {r['clock_error']}"
                if name == "streamed" and r.get("frac_h2d") is not None:
                    tail += f"  {r['frac_h2d']:.2f} of the copy rate (fits {_f(r.get('frac_h2d_fits'), '.2f')})"
                if r.get("suspect"):
                    tail += f"  {r['suspect'].upper()}"
            lines.append(f"{name:10} {r['gpus']:>4} {t:>12} {fits:>10} {fig:>22} "
                         f"{_f(r.get('efficiency'), '10.2f'):>10}{tail}")
    for name, e in doc["acceptance"].items():
        tag = {True: "PASS", False: "FAIL", None: "n/a "}[e["pass"]]
        v = e["value"]
        note = ""
        if e.get("suspect"):
            at = ", ".join(f"{g} GPUs {_f(x, '.2f')}" for g, x in e["suspect"].items())
            note = f": {SUSPECT} ({at} of the concurrent copy rate, above {SUSPECT_FRAC:g})"
        lines.append(f"{tag} distributed: {name} = {_f(v, '.4g')} ({e['op']} {e['threshold']}){note}")
    for name, why in doc.get("skipped", {}).items():
        lines.append(f"skipped {name}: {why}")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m tsm_core.bench {command}",
        description="Scaling across GPUs with torch.distributed (NCCL): allreduce latency, "
                    "host-to-device bandwidth, k-means strong and weak scaling, streamed "
                    "shards, row-sharded products. Writes OUT/distributed.json and .png.")
    p.add_argument("--gpus", default=None,
                   help="comma-separated GPU counts, one group of processes each "
                        "(default 1,2,4 with a GPU, 1,2 with --cpu; counts above the "
                        "machine's are skipped and recorded)")
    p.add_argument("--out", default=None, help="output directory (default "
                   "benchmarks/results/<gpu-slug>, or benchmarks/results/cpu with --cpu)")
    p.add_argument("--quick", action="store_true", help="small sizes")
    p.add_argument("--cpu", action="store_true",
                   help="gloo processes on the CPU at tiny sizes (tests the harness; "
                        "h2d and streamed need a GPU and are skipped)")
    p.add_argument("--only", default=",".join(EXPERIMENTS),
                   help=f"comma-separated experiments (default all: {','.join(EXPERIMENTS)})")
    p.add_argument("--precision", default=None,
                   help="TSMKMeans precision (default: the estimator's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=540.0,
                   help="seconds allowed for each group of processes (terminated after)")
    p.add_argument("--collective-timeout", type=float, default=300.0,
                   help="torch.distributed's timeout for one collective, seconds")
    p.add_argument("--no-plot", action="store_true")
    return p


def main(command: str, argv: list[str]) -> int:
    """Run the distributed benchmark; 0 = every group ran, 1 = a group or an
    experiment failed, 2 = no GPU (without ``--cpu``)."""
    args = _parser(command).parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(only) - set(EXPERIMENTS))
    if unknown:
        print(f"unknown experiments {unknown}; choose from {EXPERIMENTS}", file=sys.stderr)
        return 1
    present = 0 if args.cpu else _gpu_count()
    if not args.cpu and present == 0:
        print("tsm_core.bench distributed needs a CUDA GPU (or --cpu); found none", file=sys.stderr)
        return 2
    counts = [int(x) for x in (args.gpus or ("1,2" if args.cpu else "1,2,4")).split(",") if x.strip()]
    skipped: dict = {}
    worlds = []
    for G in counts:
        if G < 1 or (not args.cpu and G > present):
            skipped[f"{G} GPUs"] = f"the machine has {present} GPUs"
        elif G not in worlds:
            worlds.append(G)
    experiments = []
    for name in only:
        if args.cpu and name in GPU_ONLY:
            skipped[name] = "needs a GPU (run without --cpu)"
        else:
            experiments.append(name)
    km_ok, km_why = kmeans_supports_distributed()
    if not km_ok:
        for name in KMEANS:
            if name in experiments:
                experiments.remove(name)
                skipped[name] = km_why
    sizes = sizes_for(args.quick, args.cpu)
    cfg = dict(gpu=not args.cpu, experiments=experiments, sizes=asdict(sizes), seed=args.seed,
               precision=args.precision, collective_timeout_s=args.collective_timeout)
    env = _environment(not args.cpu, present)
    out_dir = Path(args.out or Path("benchmarks") / "results" / env["gpu_slug"])
    out_dir.mkdir(parents=True, exist_ok=True)
    command_line = shlex.join(["python", "-m", "tsm_core.bench", command, *argv])
    print(f"tsm_core.bench distributed on {env.get('gpu')} ({present} GPUs): groups of "
          f"{worlds} processes, experiments {experiments}", flush=True)
    t0 = time.perf_counter()
    runs = []
    for G in worlds:
        run = run_world(G, cfg, args.timeout)
        runs.append(run)
        print(f"{_group(G)} {run['status']} in {run['elapsed_s']:.0f} s", flush=True)
    from tsm_core.bench import _clean, _write

    results = combine(runs)
    doc = _clean(dict(
        sweep="distributed",
        date_utc=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=command_line, seed=args.seed, quick=args.quick, cpu=args.cpu,
        gpu_counts=worlds, experiments=experiments, skipped=skipped,
        kmeans_distributed=km_ok, sizes=asdict(sizes), precision=args.precision,
        elapsed_s=time.perf_counter() - t0, environment=env, results=results,
        acceptance=acceptance(results), runs=runs))
    # A subset of the experiments gets its own files, so that runs split to fit a
    # machine's time limit do not overwrite one another.
    stem = "distributed" if only == list(EXPERIMENTS) else "distributed_" + "_".join(only)
    path = out_dir / f"{stem}.json"
    _write(path, doc)
    print(f"wrote {path}", flush=True)
    if not args.no_plot:
        try:
            print(f"wrote {plot(doc, out_dir / f'{stem}.png')}", flush=True)
        except ImportError as e:
            print(f"no figure ({e}); pip install matplotlib", file=sys.stderr)
    print(format_table(doc), flush=True)
    failed = [r for r in runs if r["status"] != "ok"] or [
        1 for rows in results.values() for r in rows if "error" in r]
    return 1 if failed else 0

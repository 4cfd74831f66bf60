"""The sorted centroid update's parts (ms, CUDA events, median of 9): the counting
sort (histogram, scan, scatter, offsets), the pieces' partial sums, the reduction,
and the whole `_Sums.run`, per storage type.

    python dev/kmeans_sums_parts.py 2e6,512,256 1e7,32,256
"""
import cupy as cp
import numpy as np

from tsm_core.kmeans import configs
from tsm_core.kmeans.assign import storage_rows
from tsm_core.kmeans.launch import NULL, _kernel
from tsm_core.kmeans.update import _Sums
from tsm_core.runtime import timing
from _probe import shapes


def ms(fn, reps=9):
    """Median ms of fn() between CUDA events, after one untimed call."""
    return timing.event_median(fn, warmup=1, reps=reps) * 1e3


for n, d, k in shapes([(2_000_000, 512, 256), (10_000_000, 32, 256), (4_000_000, 128, 1024)]):
    X = cp.random.default_rng(0).uniform(-1, 1, (n, d), dtype=cp.float32)
    labels = cp.asarray(np.random.default_rng(1).integers(0, k, n).astype(np.int32))
    for st in ("float32", "bfloat16"):
        Xs = storage_rows(X, "float32", st)
        s = _Sums(n, d, k, st)
        S, W = cp.empty((k, d)), cp.empty(k)
        t_run = ms(lambda: s.run(Xs, labels, None, S, W))
        if s.route != "sorted" or s.sort != "count":
            print(f"({n}, {d}, {k}) {st} route {s.route}/{getattr(s, 'sort', '-')}: run {t_run:.3f}", flush=True)
            continue
        rw = s.rw
        nw = -(-n // rw)
        smem = configs.SORT_WB * k * 4
        nb = -(-nw // configs.SORT_WB)
        grid = (nb,)
        cnt, incl = s.cnt[: k * nb], s.incl[: k * nb]
        order = s.order[:n]

        def sort():
            _kernel(f"kmeans_hist<{configs.SORT_WB}>", smem)(grid, (configs.SORT_WB * 32,), (
                labels, np.int32(n), np.int32(k), np.int32(rw), np.int32(nw), cnt), shared_mem=smem)
            cp.cumsum(cnt, out=incl)
            _kernel(f"kmeans_scatter<{configs.SORT_WB}>", smem)(grid, (configs.SORT_WB * 32,), (
                labels, np.int32(n), np.int32(k), np.int32(rw), np.int32(nw), cnt, incl, order), shared_mem=smem)
            _kernel(f"kmeans_offsets<{configs.PIECE}>")((1,), (1024,), (
                cnt, incl, np.int32(k), np.int32(nb), np.int32(n), s.off, s.pstart))

        def hist():
            _kernel(f"kmeans_hist<{configs.SORT_WB}>", smem)(grid, (configs.SORT_WB * 32,), (
                labels, np.int32(n), np.int32(k), np.int32(rw), np.int32(nw), cnt), shared_mem=smem)

        vec = 16 // Xs.itemsize
        v, lpr, ns = configs.partials_config(d, st, vec)
        tasks = (-(-n // configs.PIECE) + k) * ns

        def partials():
            _kernel(configs.partials_name(st, v, lpr))((-(-tasks // 8),), (256,), (
                Xs, np.int64(d), np.int32(d), np.int32(ns), order, s.off, s.pstart, np.int32(k), NULL, s.part, s.wpart))

        def reduce():
            _kernel("kmeans_reduce<double>")((-(-(k * d) // 256),), (256,), (
                s.part, s.wpart, s.pstart, np.int32(k), np.int32(d), np.int32(0), S, W))

        t_sort, t_hist, t_part, t_red = ms(sort), ms(hist), ms(partials), ms(reduce)
        gb = Xs.nbytes / 1e9
        print(f"({n}, {d}, {k}) {st} cfg v={v} lpr={lpr} ns={ns} rw={rw}: run {t_run:.3f} | sort {t_sort:.3f} "
              f"(hist {t_hist:.3f}) | partials {t_part:.3f} ({gb / t_part:.2f} TB/s) | reduce {t_red:.3f}",
              flush=True)

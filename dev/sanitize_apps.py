"""The kernels of the other families once each, on small awkward problems, checked
against a float64 reference: a sweep for compute-sanitizer (as dev/sanitize.py
is for TSM2R / TSM2L).

    compute-sanitizer --tool memcheck  --error-exitcode 3 python dev/sanitize_apps.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python dev/sanitize_apps.py

Covers the k-means assignment routes (fused, tile, cuBLAS) and centroid-sum routes
(direct, sorted) and a short Lloyd run; ABFT's row_checksums and ft_matmul; the
batched GEMM (every kernel version); gemm at odd sizes (the planner's small-problem
split-K, peeled strips with realigned operands, forced split-K tails of both tile
widths) and 1- and 2-level Strassen;
an Inception block (module 1) at batch 1, 2 and 12 (tuned: every tile configuration
runs), and with each cp.async configuration forced. CuPy's memory pool is off, so an
access past an array's end is its own allocation's overrun. Each case prints one
line; the exit status is 1 if any result is wrong or any call raised.

Options: --only SUBSTRING.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = p.parse_args()
    from tsm_core import has_gpu

    if not has_gpu():
        print("sanitize_apps: no CUDA GPU found", file=sys.stderr)
        return 2
    import cupy as cp

    cp.cuda.set_allocator(None)  # every array its own cudaMalloc
    import tsm_core

    rng = np.random.default_rng(7)
    fails = []

    def case(name, fn):
        if args.only and args.only not in name:
            return
        try:
            err = fn()
            ok = err is True or (err is not False and err < 1e-4)
        except Exception as exc:  # a case that raises is a failure, reported by name
            ok, err = False, f"{type(exc).__name__}: {exc}"
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {err}", flush=True)
        if not ok:
            fails.append(name)

    def rel(x, ref):
        x, ref = cp.asnumpy(x).astype(np.float64), np.asarray(ref, dtype=np.float64)
        return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-300))

    # k-means: assignment must pick a centre within rounding of the nearest.
    def assign(method, dtype, n, d, k):
        X = rng.standard_normal((n, d)).astype(dtype)
        C = rng.standard_normal((k, d)).astype(dtype)
        lab, mind = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), method=method)
        D = ((X[:, None, :].astype(np.float64) - C[None].astype(np.float64)) ** 2).sum(-1)
        chosen = D[np.arange(n), cp.asnumpy(lab)]
        return float(np.max((chosen - D.min(1)) / np.maximum(D.min(1), 1e-30)))

    for method, (n, d, k) in [("fused", (517, 600, 13)), ("tile", (517, 257, 65)), ("gemm", (517, 33, 7))]:
        for dt in (np.float32, np.float64):
            case(f"kmeans_assign {method} {np.dtype(dt).name} {n}x{d}x{k}",
                 lambda method=method, dt=dt, n=n, d=d, k=k: assign(method, dt, n, d, k))

    def sums(route, dt):
        os.environ["TSM_KMEANS_UPDATE"] = route
        n, d, k = 2053, 130, 9
        X = rng.standard_normal((n, d)).astype(dt)
        lab = rng.integers(0, k, n)
        s, ws = tsm_core.kmeans_centroid_sums(cp.asarray(X), cp.asarray(lab.astype(np.int32)), k)
        ref = np.zeros((k, d))
        np.add.at(ref, lab, X.astype(np.float64))
        return rel(s, ref)

    for route in ("direct", "sorted"):
        for dt in (np.float32, np.float64):
            case(f"kmeans_centroid_sums {route} {np.dtype(dt).name}", lambda route=route, dt=dt: sums(route, dt))
    os.environ.pop("TSM_KMEANS_UPDATE", None)

    def lloyd():
        from tsm_apps.kmeans import TSMKMeans

        X = rng.standard_normal((3001, 40)).astype(np.float32)
        km = TSMKMeans(5, n_init=1, max_iter=5, random_state=0, device="gpu").fit(cp.asarray(X))
        return bool(np.isfinite(km.inertia_)) and km.cluster_centers_.shape == (5, 40)

    case("kmeans lloyd (TSMKMeans, 5 iterations)", lloyd)

    # ABFT.
    def checksums(dt):
        X = rng.standard_normal((131, 257)).astype(dt)
        W = np.stack([np.ones(257), (np.arange(257) + 1) / 257.0], 1)
        S = tsm_core.row_checksums(cp.asarray(X), V=cp.asarray(W.astype(dt)))
        S = S[0] if isinstance(S, tuple) else S
        return rel(S, X.astype(np.float64) @ W)

    for dt in (np.float32, np.float64):
        case(f"abft row_checksums {np.dtype(dt).name}", lambda dt=dt: checksums(dt))

    def ft(dt):
        from tsm_apps import abft

        A = rng.standard_normal((129, 67)).astype(dt)
        B = rng.standard_normal((67, 71)).astype(dt)
        C, rep = abft.ft_matmul(cp.asarray(A), cp.asarray(B))
        return rel(C, A.astype(np.float64) @ B)

    for dt in (np.float32, np.float64):
        case(f"abft ft_matmul {np.dtype(dt).name}", lambda dt=dt: ft(dt))

    # Batched irregular GEMM: a batch of `shapes` (random operands, empty outputs) and
    # its worst relative error against the float64 product.
    def make_batch(shapes, dt):
        As = [cp.asarray(rng.standard_normal((m, k)).astype(dt)) for m, n, k in shapes]
        Bs = [cp.asarray(rng.standard_normal((k, n)).astype(dt)) for m, n, k in shapes]
        Cs = [cp.empty((m, n), dtype=dt) for m, n, k in shapes]
        return As, Bs, Cs

    def batch_err(As, Bs, Cs):
        return max(rel(c, cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b)) for a, b, c in zip(As, Bs, Cs))

    # Every kernel version (version 2's tensor-core path runs the last problem's
    # 32 x 64 tiles: K >= 128).
    def batched(dt, version):
        As, Bs, Cs = make_batch([(1, 1, 1), (17, 33, 5), (70, 3, 129), (65, 64, 1), (130, 70, 40),
                            (1009, 521, 263)], dt)
        tsm_core.prepare_batched(As, Bs, Cs, version=version).run()
        return batch_err(As, Bs, Cs)

    for dt in (np.float32, np.float64):
        for v in (0, 1, 2):
            case(f"batched v{v} {np.dtype(dt).name}", lambda dt=dt, v=v: batched(dt, v))

    # Versions 3 and 4 (float32): enough small problems that the planner keeps the
    # 128 x 64 and 128 x 128 tiles of the large ones (edges in M and N, a partial last
    # k step, K = 1).
    def batched_wide(version, top):
        As, Bs, Cs = make_batch([(1009, 521, 263), (257, 140, 9), (130, 129, 1), (384, 200, 20)]
                           + [(16, 16, 16)] * 600, np.float32)
        prep = tsm_core.prepare_batched(As, Bs, Cs, version=version)
        assert (prep.plan.tiles[:, 3] == top).sum() >= 10, prep.plan.histogram()
        prep.run()
        return batch_err(As, Bs, Cs)

    from tsm_core.batched import api as _batched

    tc_versions = (5, 6) if _batched.wgmma_ok() else (5,)  # 6: wgmma, compute capability 9.0
    for v in tc_versions:  # cp.async rings, 128 x 128 on the tensor cores (float32)
        case(f"batched v{v} float32", lambda v=v: batched(np.float32, v))
    for v, top in ((3, 5), (4, 6), (5, 6)) + (((6, 6),) if 6 in tc_versions else ()):
        case(f"batched v{v} float32 wide", lambda v=v, top=top: batched_wide(v, top))

    # Split-K (versions 1, 3, 5): a few problems of long K, launched twice (the
    # counters the last block of each tile resets are reused by the second launch).
    def batched_split(dt, version):
        As, Bs, Cs = make_batch([(130, 70, 4099), (100, 129, 3000), (33, 17, 2500), (5, 3, 7),
                            (128, 128, 2048), (64, 200, 1025)], dt)
        prep = tsm_core.prepare_batched(As, Bs, Cs, version=version)
        assert prep.plan.split_problems >= 3, prep.plan.splits
        prep.run()
        prep.run()
        return batch_err(As, Bs, Cs)

    for dt, v in ((np.float32, 1), (np.float64, 1), (np.float32, 3)) + tuple(
            (np.float32, v) for v in tc_versions):
        case(f"batched split v{v} {np.dtype(dt).name}", lambda dt=dt, v=v: batched_split(dt, v))

    # torch tensors through the public call: the first call plans and remembers the
    # batch, the next two are hits of the C++ fast path (batched/fastpath.cpp: its own
    # cuLaunchKernel), where it builds.
    def batched_torch(dt):
        import torch

        from tsm_core.batched import api as _batched

        shapes = [(1, 1, 1), (17, 33, 5), (130, 70, 129), (1009, 521, 263), (300, 200, 140)]
        As, Bs, Cs = make_batch(shapes, dt)
        tA, tB, tC = ([torch.as_tensor(x, device="cuda") for x in xs] for xs in (As, Bs, Cs))
        for _ in range(3):
            tsm_core.batched_matmul(tA, tB, tC)
        torch.cuda.synchronize()
        assert _batched._NATIVE and _batched._NATIVE[0] is not None, "C++ fast path not loaded"
        return batch_err(As, Bs, Cs)

    for dt in (np.float32, np.float64):
        case(f"batched torch fast path {np.dtype(dt).name}", lambda dt=dt: batched_torch(dt))

    # gemm and Strassen.
    def gemm(dt, order, n):
        A = rng.standard_normal((n, n + 2)).astype(dt)
        B = rng.standard_normal((n + 2, n - 1)).astype(dt)
        C = tsm_core.gemm(cp.asarray(A, order=order), cp.asarray(B, order=order))
        return rel(C, A.astype(np.float64) @ B)

    for dt in (np.float32, np.float64):
        for order in "CF":
            case(f"gemm {np.dtype(dt).name} {order} 131", lambda dt=dt, order=order: gemm(dt, order, 131))

    def gemm_shape(m, k, n, dt=np.float32, **launch):
        A = rng.standard_normal((m, k)).astype(dt)
        B = rng.standard_normal((k, n)).astype(dt)
        if not launch:  # the planner: peeled strips on a second stream, realigned copies
            C = tsm_core.gemm(cp.asarray(A), cp.asarray(B))
        else:  # a forced split-K tail (tiles t1.. as S k-ranges, then the reduce kernel)
            from tsm_core.tiled import launch as _gemm

            C = cp.full((m, n), cp.nan, dtype=dt)
            _gemm._launch_gemm(cp.asarray(A), cp.asarray(B), C, 1.0, 0.0, **launch)
        return rel(C, A.astype(np.float64) @ B)

    case("gemm float32 peeled + realigned 2049x20x2050", lambda: gemm_shape(2049, 20, 2050))
    case("gemm float32 split tail wide 300x333x520", lambda: gemm_shape(300, 333, 520, wn=4, split=(3, 2)))
    case("gemm float64 split tail 129x1000x257", lambda: gemm_shape(129, 1000, 257, np.float64, split=(0, 4)))

    # gemm_pipe (the wide tile's whole tiles): edge blocks, a partial last k-tile
    # (340 = 21 k-tiles + 4), C- and F-ordered operands (cp.async and register stages).
    def gemm_pipe(m, k, n, order):
        from tsm_core.tiled import launch as _gemm

        A = cp.asarray(rng.standard_normal((m, k)).astype(np.float32), order=order)
        B = cp.asarray(rng.standard_normal((k, n)).astype(np.float32), order=order)
        C = cp.full((m, n), cp.nan, dtype=np.float32)
        _gemm._launch_pipe(A, B, C, 1.0, 0.0)
        return rel(C, cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B))

    for order in "CF":
        case(f"gemm_pipe float32 {order} 300x340x520", lambda order=order: gemm_pipe(300, 340, 520, order))

    # gemm_ws (warp-specialized; named barriers between producer and consumers): edge
    # blocks, 22 k-tiles (its four stages wrap around), one k-tile, a partial last
    # k-tile (340 = 21 k-tiles + 4); on sm_90 only.
    def gemm_ws(m, k, n, b_order="C"):
        from tsm_core.tiled import launch as _gemm

        A = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
        B = cp.asarray(rng.standard_normal((k, n)).astype(np.float32), order=b_order)
        C = cp.full((m, n), cp.nan, dtype=np.float32)
        if not _gemm.ws_ok(4, True, b_order == "F", k):
            return 0.0  # not an sm_90 device: nothing to check
        _gemm._launch_ws(A, B, C, 1.0, 0.0)
        return rel(C, cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B))

    for m, k, n in ((300, 352, 520), (129, 16, 260), (300, 340, 520)):
        case(f"gemm_ws float32 {m}x{k}x{n}", lambda m=m, k=k, n=n: gemm_ws(m, k, n))
    case("gemm_ws float32 300x340x520 B F-ordered", lambda: gemm_ws(300, 340, 520, "F"))

    # Edge blocks read past the matrix's last row (column) from that row, and a vector
    # along m (n) may end in the leading dimension's padding: F-ordered views of
    # parents 3 rows (columns) longer, the tile kernel forced, both tile widths.
    def gemm_views(m, k, n, wn):
        from tsm_core.tiled import launch as _gemm

        pa = cp.asfortranarray(cp.asarray(rng.standard_normal((m + 3, k)).astype(np.float32)))
        pb = cp.asarray(rng.standard_normal((k, n + 3)).astype(np.float32))
        A, B = pa[:m], pb[:, :n]  # ld 132 and 136: aligned, vectors on
        C = cp.full((m, n), cp.nan, dtype=np.float32)
        _gemm._launch_gemm(A, B, C, 1.0, 0.0, wn=wn, split=False)
        return rel(C, cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B))

    for wn in (2, 4):
        case(f"gemm float32 edge views 129x61x133 wn={wn}", lambda wn=wn: gemm_views(129, 61, 133, wn))

    def strassen(dt, levels, n):
        from tsm_core.tiled import configs as _gemm

        A = rng.standard_normal((n, n)).astype(dt)
        B = rng.standard_normal((n, n)).astype(dt)
        keep = _gemm.PIPE_MIN_WAVE
        _gemm.PIPE_MIN_WAVE = 0  # gemm_pipe's products and the hybrid at these small sizes
        try:
            C = tsm_core.strassen(cp.asarray(A), cp.asarray(B), levels=levels)
        finally:
            _gemm.PIPE_MIN_WAVE = keep
        return rel(C, A.astype(np.float64) @ B)

    # 520: aligned blocks (the hybrid at two levels); 544 and 576: blocks whose k is a
    # multiple of 16 (gemm_ws's products on sm_90)
    for levels, n in ((1, 259), (1, 520), (1, 544), (2, 517), (2, 520), (2, 576)):
        case(f"strassen levels={levels} float32 {n}", lambda levels=levels, n=n: strassen(np.float32, levels, n))

    # Inception block 3a (module 1) on the GPU against its CPU reference.
    def inception(batch):
        from tsm_apps.inception._block import InceptionBlock

        blk = InceptionBlock(1, seed=0)
        x = rng.standard_normal((batch, 192, 9, 11)).astype(np.float32)
        return rel(blk(cp.asarray(x)), blk.forward_cpu(x))

    for batch in (1, 2):
        case(f"inception 3a batch {batch}", lambda batch=batch: inception(batch))
    # 12 x 99 = 1188 GEMM columns: the first call tunes, running every configuration.
    case("inception 3a batch 12 (tuned)", lambda: inception(12))

    # The cp.async kernel forced, at an image whose H*W is (12 x 12) and is not
    # (9 x 11) a multiple of 4 (its 16-byte and 4-byte 1x1 copies).
    def inception_tile(tag, hw):
        from tsm_apps.inception._block import InceptionBlock

        os.environ["TSM_CONV_TILE"] = tag
        try:
            blk = InceptionBlock(1, seed=0)
            x = rng.standard_normal((2, 192, *hw)).astype(np.float32)
            return rel(blk(cp.asarray(x)), blk.forward_cpu(x))
        finally:
            del os.environ["TSM_CONV_TILE"]

    for tag in ("a128x128", "a64x128", "a64x128b3", "t128x128", "t64x128", "t64x128b3", "64x64d16",
                "32x32d32", "32x32w4", "64x64w2"):
        for hw in ((9, 11), (12, 12)):
            case(f"inception 3a {tag} {hw[0]}x{hw[1]}", lambda tag=tag, hw=hw: inception_tile(tag, hw))

    print(f"{len(fails)} failed" + (f": {fails}" if fails else ""))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

"""Probes behind the gemm edge-block and realigned-copy changes (docs/lab/tiled.md), on the GPU:

    python dev/gemm_probes.py ab --old OLD.cu [N ...]
        tsm_core.gemm with tiled/gemm.cu as given in OLD.cu against the tree's,
        three interleaved rounds per size (old, new, cuBLAS). OLD.cu is a previous
        version of the file, e.g. `git show 4bf05e3:tsm_core/kernels/gemm.cu` (the
        file's path before tsm_core/tiled/); its includes are inlined from the
        tree's tsm_core/include/.
    python dev/gemm_probes.py realign
        the realigned copy (tiled.launch._realigned, realign_copy) against cudaMemcpy2D.
    python dev/gemm_probes.py ratio
        tsm_core.gemm with tiled.configs.REALIGN_RATIO at 1024 (the planner's), 256
        and 0.

float32, C-ordered square operands, seed 0; TFLOP/s counted as 2 N^3.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _square(rng, n):
    import cupy as cp

    A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    return A, B, cp.empty((n, n), np.float32)


def source_ab(old_path: str, sizes) -> None:
    import cupy as cp

    import tsm_core
    from tsm_core.runtime import compile as _compile
    from tsm_core.runtime.timing import time_fn

    old_mods = {}  # the old version's compiled modules, kept between rounds

    def use(which):  # the tree's gemm.cu, or OLD.cu with its own module cache
        return (_compile.source_from("gemm", old_path, old_mods) if which == "old"
                else contextlib.nullcontext())

    rng = np.random.default_rng(0)
    for n in sizes:
        A, B, C = _square(rng, n)
        ref = A.astype(cp.float64) @ B.astype(cp.float64)
        t = {"old": [], "new": [], "cublas": []}
        for _ in range(3):
            for w in ("old", "new"):
                with use(w):
                    tsm_core.gemm(A, B, out=C)
                    err = float(cp.abs(C - ref).max() / cp.abs(ref).max())
                    t[w].append(time_fn(lambda: tsm_core.gemm(A, B, out=C), reps=15).median_s)
            t["cublas"].append(time_fn(lambda: cp.matmul(A, B, out=C), reps=15).median_s)
        f = 2 * n**3 / 1e12
        r = {w: f / float(np.median(v)) for w, v in t.items()}
        print(f"N={n:6d}  old {r['old']:.1f}  new {r['new']:.1f}  cuBLAS {r['cublas']:.1f} TFLOP/s"
              f"  new/old {r['new'] / r['old']:.3f}  new/cuBLAS {r['new'] / r['cublas']:.3f}"
              f"  err {err:.1e}", flush=True)


def realign() -> None:
    import cupy as cp

    from tsm_core.runtime.timing import time_fn
    from tsm_core.tiled import launch as tlaunch

    def memcpy2d(X, stream):  # what _realigned did before the realign kernel
        rows, cols = X.shape
        buf = cp.empty((rows, -(-cols // 4) * 4), dtype=X.dtype)
        cp.cuda.runtime.memcpy2DAsync(buf.data.ptr, buf.strides[0], X.data.ptr, X.strides[0],
                                      cols * X.itemsize, rows,
                                      cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        return buf

    rng = np.random.default_rng(0)
    s = cp.cuda.get_current_stream()
    for n in (2049, 3583, 4095, 8191):
        X = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        a = time_fn(lambda: memcpy2d(X, s), reps=15).median_s
        b = time_fn(lambda: tlaunch._realigned(X, s), reps=15).median_s
        print(f"N={n}: memcpy2D {a * 1e6:.1f} us, realign_copy {b * 1e6:.1f} us "
              f"({2 * X.nbytes / b / 1e9:.0f} GB/s)", flush=True)


def ratio() -> None:
    import tsm_core
    from tsm_core.runtime.timing import time_fn
    from tsm_core.tiled import configs as tconfigs

    rng = np.random.default_rng(0)
    kept = tconfigs.REALIGN_RATIO
    for n in (1023, 1025, 1279, 1537, 2047):
        A, B, C = _square(rng, n)
        t: dict = {}
        for _ in range(3):
            for r in (1024, 256, 0):
                tconfigs.REALIGN_RATIO = r
                t.setdefault(r, []).append(
                    time_fn(lambda: tsm_core.gemm(A, B, out=C), reps=15).median_s)
        f = 2 * n**3 / 1e12
        print(f"N={n}: " + "  ".join(f"ratio {r}: {f / np.median(v):.1f}" for r, v in t.items())
              + " TFLOP/s", flush=True)
    tconfigs.REALIGN_RATIO = kept


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["ab"], ["realign"], ["ratio"]):
        from tsm_core import has_gpu

        if not has_gpu():
            print("gemm_probes: no CUDA GPU found")
            return 2
    if argv[:1] == ["ab"] and len(argv) >= 3 and argv[1] == "--old":
        sizes = [int(x) for x in argv[3:]] or [1023, 1024, 1025, 1536, 2047, 2049, 3583, 4095,
                                                 4096]
        source_ab(argv[2], sizes)
    elif argv == ["realign"]:
        realign()
    elif argv == ["ratio"]:
        ratio()
    else:
        print(__doc__)
        return 0 if argv[:1] in (['-h'], ['--help']) else 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

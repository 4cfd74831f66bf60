"""Probes behind the Inception block 3b changes (docs/lab/conv.md), on the GPU:

    python dev/inception_probes.py pool --old OLD.cu
        block 3b's stored max-pool alone (a MaxPoolSpec group, two tile configs)
        with conv/conv.cu as given in OLD.cu against the tree's, both checked
        against torch's max_pool2d; then the tree's first launch with and without
        the max-pool. OLD.cu is a previous version of the file, e.g.
        `git show b566c4e:tsm_core/kernels/conv.cu` (the file's path
        before tsm_core/conv/); its includes are inlined from the tree's
        tsm_core/include/.
    python dev/inception_probes.py stages
        block 3b's two launches on the tensor-core tiles at other cp.async stage
        depths and K steps than CONFIGS' (ConvGroup with a forced TileConfig).
    python dev/inception_probes.py gap
        block 3b at batch 32 and 128, each launch and the whole block on both clocks:
        the anchors' (single calls between events) and back to back (time_fn), ours
        and cuDNN's, with and without the per-call output allocation.
    python dev/inception_probes.py table6-host
        where a Table 6 call's host time goes (torch path): median host
        microseconds of each step, and the anchors' clock of each alone.

Batches 32 and 128 (Table 6: batch 1), seed 0; device times from
``tsm_core.runtime.timing.time_fn`` (back-to-back calls behind a spin, ms).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _block_buffers(n: int):
    import cupy as cp

    from tsm_apps.inception._block import InceptionBlock

    blk = InceptionBlock(2, seed=0)
    x = cp.asarray(np.random.default_rng(0).standard_normal((n, 256, 28, 28), dtype=np.float32))
    y = blk.forward_gpu(x)  # tunes both launches
    t3, t5, xp = blk._tmp[(x.device.id, n, 28, 28)]
    return blk, {"x": x, "y": y, "t3": t3, "t5": t5, "xp": xp}


def pool(old_path: str) -> None:
    import cupy as cp
    import torch

    import tsm_core
    from tsm_core import ConvSpec, MaxPoolSpec
    from tsm_core.conv import configs as cconfigs
    from tsm_core.runtime import compile as _compile
    from tsm_core.runtime.timing import time_fn

    tags = {c.tag: c for c in cconfigs.CONFIGS}
    for n in (32, 128):
        blk, bufs = _block_buffers(n)
        x, xp = bufs["x"], bufs["xp"]
        ref = cp.asarray(torch.nn.functional.max_pool2d(torch.as_tensor(x, device="cuda"), 3, 1, 1))
        mp = MaxPoolSpec(256, "x", ("xp", 0))
        out = []
        for version in ("tree", "old"):
            with (_compile.source_from(cconfigs.FAMILY, old_path) if version == "old"
                  else contextlib.nullcontext()):
                for tag in ("a64x128b3", "64x64"):
                    g = tsm_core.ConvGroup([mp], config=tags[tag], tune=False)
                    xp.fill(np.nan)
                    g({"x": x, "xp": xp})
                    ok = bool(cp.array_equal(xp, ref))
                    t = time_fn(lambda: g({"x": x, "xp": xp}, checked=True), reps=20).median_s * 1e3
                    out.append(f"max-pool alone, {version} {tag} {t:.4f}{'' if ok else ' WRONG'}")
        P = blk.params
        convs = [ConvSpec(*P["b1"], "x", ("y", 0)), ConvSpec(*P["b2_reduce"], "x", ("t3", 0)),
                 ConvSpec(*P["b3_reduce"], "x", ("t5", 0))]
        for name, specs in (("launch 1", convs + [mp]), ("launch 1 less the max-pool", convs)):
            g = tsm_core.ConvGroup(specs, channels={"y": blk.out_channels},
                                   config=tags["t64x128b3"], tune=False)
            g(bufs)
            t = time_fn(lambda: g(bufs, checked=True), reps=20).median_s * 1e3
            out.append(f"{name}, tree t64x128b3 {t:.4f}")
        print(f"batch {n}: " + "; ".join(out), flush=True)


def stages() -> None:
    from tsm_core.conv import configs as cconfigs
    from tsm_core.conv import plan as cplan
    from tsm_core.conv import tune as ctune
    from tsm_core.runtime.timing import time_fn

    variants = ([(128, 128, 8, s, 2) for s in (3, 4, 5, 6)] + [(64, 128, 16, s, 2) for s in (3, 4, 5)]
                + [(64, 128, 8, s, 3) for s in (4, 5, 6)] + [(128, 128, 16, 3, 2), (64, 128, 8, 6, 2)])
    for n in (32, 128):
        blk, bufs = _block_buffers(n)
        for li, g in enumerate(blk.groups()):
            ref = {k: v.copy() for k, v in bufs.items()}
            row = []
            for bm, bn, bk, st, minb in variants:
                cfg = cconfigs.TileConfig(bm, bn, bk, 8 if bm == 128 else 4, 8, minb, stages=st, tc=True)
                if cplan.tc_smem_bytes(cfg) * minb > 227 * 1024:
                    continue
                gc = copy.copy(g)  # the group with this configuration forced
                gc.config, gc._plans, gc._launches, gc._checked = cfg, {}, {}, {}
                gc(bufs, checked=True)
                err = max(ctune.rel_diff(bufs[k], ref[k]) for k in ("y", "t3", "t5", "xp"))
                t = time_fn(lambda: gc(bufs, checked=True), reps=20).median_s * 1e3
                row.append(f"{bm}x{bn}k{bk}s{st}b{minb} {t:.4f}"
                           + ("" if err <= ctune.TUNE_AGREE else f" DIFFERS {err:.1e}"))
            print(f"batch {n} launch {li + 1}: " + ", ".join(row), flush=True)


def gap() -> None:
    import cupy as cp
    import torch

    from tsm_apps.inception import InceptionBlock
    from tsm_core.runtime.timing import call_ms, time_fn

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    for n in (32, 128):
        blk = InceptionBlock(2, seed=0)
        x = torch.randn(n, 256, 28, 28, device="cuda")
        xc = cp.from_dlpack(x)
        with torch.no_grad():
            for _ in range(3):
                blk(x)
            out = cp.empty((n, blk.out_channels, 28, 28), np.float32)
            shape = tuple(out.shape)
            t3, t5, xp = blk._tmp[(0, n, 28, 28)]
            bufs = {"x": xc, "y": out, "t3": t3, "t5": t5, "xp": xp}
            g1, g2 = blk.groups()
            r = {"block, back to back": time_fn(lambda: blk(x), reps=20).median_s * 1e3,
                 "block, single calls": call_ms(lambda: blk(x), rep=30),
                 "block with out=, single calls": call_ms(
                     lambda: blk.forward_gpu(xc, out=out, checked=True), rep=30),
                 "torch.empty alone, single calls": call_ms(lambda: torch.empty(shape, device="cuda"),
                                                            rep=30),
                 "cuDNN, single calls": call_ms(lambda: blk.torch_reference(x), rep=30),
                 "cuDNN, back to back": time_fn(lambda: blk.torch_reference(x), reps=20).median_s * 1e3,
                 "launch 1, single calls": call_ms(lambda: g1(bufs, checked=True), rep=30),
                 "launch 1, back to back": time_fn(lambda: g1(bufs, checked=True), reps=20).median_s * 1e3,
                 "launch 2, single calls": call_ms(lambda: g2(bufs, checked=True), rep=30),
                 "launch 2, back to back": time_fn(lambda: g2(bufs, checked=True), reps=20).median_s * 1e3}
        print(f"batch {n} (ms): " + ", ".join(f"{k} {v:.4f}" for k, v in r.items()), flush=True)


def table6_host() -> None:
    import cupy as cp
    import torch

    from tsm_apps.inception import Table6Set
    from tsm_apps.inception._block import _torch_stream_of, torch_fast_key
    from tsm_core.runtime.timing import call_ms, time_fn

    def host_us(fn, n=500):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return statistics.median(ts) * 1e6

    F = torch.nn.functional
    for module in (2, 5, 7):
        s = Table6Set(module, seed=0)
        x = torch.randn(1, 192, s.hw, s.hw, device="cuda")
        xc = cp.from_dlpack(x)
        s(x)
        s(x)
        launch = s._fast[torch_fast_key(x, 192)]
        y = torch.empty((1, s.out_channels, s.hw, s.hw), device="cuda")
        stream = _torch_stream_of(0)
        w, b = (torch.from_numpy(a).cuda() for a in s.weights[0])
        steps = {"nothing": lambda: None, "torch_fast_key": lambda: torch_fast_key(x, 192),
                 "torch.empty": lambda: torch.empty((1, s.out_channels, s.hw, s.hw),
                                                    dtype=torch.float32, device=x.device),
                 "stream": lambda: _torch_stream_of(0),
                 "launch": lambda: launch([x.data_ptr(), y.data_ptr()], stream),
                 "whole call": lambda: s(x),
                 "CuPy forward_gpu": lambda: s.forward_gpu(xc),
                 "one cuDNN conv2d": lambda: F.conv2d(x, w, b)}
        cells = [f"{k} {host_us(f):.1f}/{call_ms(f, rep=100) * 1e3:.1f}" for k, f in steps.items()]
        dev = time_fn(lambda: launch([x.data_ptr(), y.data_ptr()], stream), reps=20).median_s * 1e6
        tiles = [p[4].tag for p in s.group()._plans.values()]
        print(f"set {module} ({tiles}, device {dev:.1f} us); host us / anchors' clock us: "
              + ", ".join(cells), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="probe", required=True)
    sub.add_parser("pool").add_argument("--old", required=True, help="a previous conv/conv.cu")
    sub.add_parser("stages")
    sub.add_parser("gap")
    sub.add_parser("table6-host")
    args = p.parse_args()
    from tsm_core import has_gpu

    if not has_gpu():
        print("inception_probes: no CUDA GPU found")
        return 2
    if args.probe == "pool":
        pool(args.old)
    elif args.probe == "stages":
        stages()
    elif args.probe == "gap":
        gap()
    else:
        table6_host()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

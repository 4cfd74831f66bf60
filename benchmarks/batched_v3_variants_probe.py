"""The A/B behind kernel version 3's form (batched GEMM, float32): version 3 as it
stands (128 x 64 tiles, 8 x 4 outputs a thread, rows and columns in two runs, three
blocks per SM) against variants built from the same batched/batched.cu text by
substitution, and against versions 1 and 4 as they stand:

- ``noinline``: the 128 x 64 path called out of line (``__noinline__``): no spills,
  an ABI stack frame;
- ``cols4``: its four columns read as one run (one 16-byte read) instead of two;
- ``64x128``: the sixth type 64 x 128 with 4 x 8 outputs a thread instead.

Each variant is compiled through ``_compile.source_from`` and launched on the
planner's tiling (the sixth type's shape patched for ``64x128``), on three uniform
batches and seven cells of the paper's sweep (datasets/irregular.py, seed 0).
Device time (``tsm_core.runtime.timing.time_fn``); every result checked against the
float64 product.

    python benchmarks/batched_v3_variants_probe.py [--out DIR]

Prints a table and writes DIR/batched_v3_variants_probe.json.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

V3_CALL = "tile_gemm_v1<T, 128, 64, 256, 8, 4, false, true, XBK>("
UNIFORM = [("1024x1024x256 x32", [(1024, 1024, 256)] * 32), ("512x512x512 x64", [(512, 512, 512)] * 64),
           ("256x256x256 x256", [(256, 256, 256)] * 256)]
SWEEP = [(1024, 256, 256), (1024, 512, 64), (1024, 128, 32), (512, 512, 128), (512, 256, 64),
         (512, 128, 256), (256, 512, 256)]


def variants(src):
    """name -> (kernel text or None for the tree's, version, sixth type's (rows, cols))."""
    assert V3_CALL in src and "constexpr bool SPLIT_M = SPLIT, SPLIT_N = SPLIT;" in src
    wrapper = ("template <typename T, int BK>\n__device__ __noinline__ void tile_v3_out_of_line("
               "const long long* __restrict__ meta, int prob, int m0, int n0, T alpha, T beta, "
               "T* smem) {\n    tile_gemm_v1<T, 128, 64, 256, 8, 4, false, true, BK>(meta, prob, "
               "m0, n0, alpha, beta, smem);\n}\n\n}  // namespace tsm_batched\n")
    noinline = src.replace("}  // namespace tsm_batched\n", wrapper, 1).replace(
        V3_CALL, "tile_v3_out_of_line<T, XBK>(")
    cols4 = src.replace("constexpr bool SPLIT_M = SPLIT, SPLIT_N = SPLIT;",
                        "constexpr bool SPLIT_M = SPLIT, SPLIT_N = SPLIT && TN == 8;")
    wide_nt = src.replace(V3_CALL, "tile_gemm_v1<T, 64, 128, 256, 4, 8, false, true, XBK>(")
    return {"v1": (None, 1, None), "v3": (None, 3, (128, 64)), "v3_noinline": (noinline, 3, (128, 64)),
            "v3_cols4": (cols4, 3, (128, 64)), "v3_64x128": (wide_nt, 3, (64, 128)),
            "v4": (None, 4, (128, 64))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_v3_variants_probe: no CUDA GPU found; nothing to time")
        return 1
    import cupy
    import numpy as np
    import torch

    from tsm_datasets.irregular import irregular_shapes
    from tsm_core.batched import api as _batched
    from tsm_core.runtime import compile as _compile
    from tsm_core.runtime import timing as _timing

    src = _compile.source("batched")
    vs = variants(src)
    paths = {}
    for name, (text, _, _) in vs.items():
        if text is not None:
            paths[name] = os.path.join(args.out, f"batched_{name}.cu")
            with open(paths[name], "w") as f:
                f.write(text)
    cases = list(UNIFORM) + [(f"sweep {mn}/{mk}/{b}", [tuple(int(v) for v in x) for x in
                                                       irregular_shapes(mn, mk, b, seed=0)])
                             for mn, mk, b in SWEEP]
    dev = torch.device("cuda")
    rows = []
    try:
        for cname, shapes in cases:
            g = torch.Generator(device=dev)
            g.manual_seed(1)
            As = [torch.randn(m, k, device=dev, generator=g) for m, n, k in shapes]
            Bs = [torch.randn(k, n, device=dev, generator=g) for m, n, k in shapes]
            Cs = [torch.empty(m, n, device=dev) for m, n, k in shapes]
            refs = [a.double() @ b.double() for a, b in zip(As, Bs)]
            meta = cupy.asarray(_batched._meta_rows(As, Bs, Cs, "torch", np.array(shapes)))
            row = dict(case=cname)
            for name, (text, version, six) in vs.items():
                if six is not None:
                    _batched._TM[5], _batched._TN[5] = six
                regs = _batched.regs_fallback(np.float32, version)
                plan = _batched.plan_batched(shapes, version=version, regs=regs)
                expr = _batched._name_expr(np.float32, version)
                if text is None:
                    kern = _compile.get_kernel("batched", expr)
                else:
                    with _compile.source_from("batched", paths[name]):
                        kern = _compile.get_kernel("batched", expr)
                tiles = cupy.asarray(plan.tiles)
                fn = lambda: kern((plan.n_tiles,), (256,), (meta, tiles, np.float32(1), np.float32(0)))  # noqa: E731
                for c in Cs:
                    c.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = max(((c.double() - r).abs().max() / r.abs().max()).item() for c, r in zip(Cs, refs))
                if not err < 1e-5:
                    raise RuntimeError(f"{name} on {cname}: relative error {err:.1e}")
                row[f"{name}_ms"] = _timing.time_fn(fn, reps=15).median_s * 1e3
            for name in vs:
                if name != "v1":
                    row[f"{name}_over_v1"] = row["v1_ms"] / row[f"{name}_ms"]
            rows.append(row)
            print(f"{cname:22s} v1 {row['v1_ms']:.4f} ms | over v1: "
                  + "  ".join(f"{n} {row[f'{n}_over_v1']:.3f}" for n in vs if n != "v1"), flush=True)
    finally:
        _batched._TM[5], _batched._TN[5] = 128, 64
    doc = dict(probe="batched_v3_variants_probe",
               command="python benchmarks/batched_v3_variants_probe.py",
               gpu=torch.cuda.get_device_name(), rows=rows)
    path = os.path.join(args.out, "batched_v3_variants_probe.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run one GoogLeNet Inception block on our kernels and on cuDNN, and compare.

    python apps/inception/run.py --module 8 [--batch N] [--repeat R] [--seed S]
                                 [--weights PATH [--prefix P]] [--table6]

Prints both times (ms, median of R event-timed calls after 3 warm-ups, as the
benchmark), the speedup and the largest relative difference (max |ours - cuDNN| /
max |cuDNN|). ``--table6`` runs the paper's Table 6 GEMM lists (batch 1) instead:
each set in one launch against one cuDNN conv2d per branch. ``--weights`` loads a
torch state dict (see ``InceptionBlock.from_state_dict``). Without a GPU it says
so and runs the CPU reference (compared with torch's CPU convolutions if torch is
installed). Progress lines say what is running; ``--quiet`` leaves the results only.
From a checkout that is not installed, the script finds the checkout's packages itself.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _bootstrap_checkout() -> None:
    """Run as a script from a checkout that is not installed: register the checkout's
    ``tsm_core/``, ``apps/`` and ``datasets/`` folders as the packages ``tsm_core``,
    ``tsm_apps`` and ``tsm_datasets`` (each only where that name is not importable),
    without putting the repository root on sys.path, where its ``apps`` and
    ``datasets`` folders would shadow other projects' packages of those names."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    for name, folder in (("tsm_core", "tsm_core"), ("tsm_apps", "apps"), ("tsm_datasets", "datasets")):
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            continue
        spec = importlib.util.spec_from_file_location(name, root / folder / "__init__.py",
                                                      submodule_search_locations=[str(root / folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


if __package__ in (None, ""):  # python apps/inception/run.py
    _bootstrap_checkout()

import numpy as np  # noqa: E402

import tsm_apps.inception  # noqa: E402,F401  (the block definitions; fails early when not importable)


def _block(args):
    from tsm_apps.inception import InceptionBlock

    if args.weights:
        return InceptionBlock.from_state_dict(args.module, args.weights, prefix=args.prefix)
    return InceptionBlock(args.module, seed=args.seed)


def _say(args, text: str) -> None:
    """A progress line (none with --quiet)."""
    if not args.quiet:
        print(text, flush=True)


def run_cpu(args) -> int:
    from tsm_apps.inception import Table6Set

    print("no CUDA GPU found: running the CPU reference (numpy, float64 inside)", flush=True)
    rng = np.random.default_rng(args.seed)
    if args.table6:
        sets = [Table6Set(m, seed=args.seed) for m in range(1, 10)]
        for s in sets:
            x = rng.standard_normal((1, 192, s.hw, s.hw)).astype(np.float32)
            t = time.perf_counter()
            y = s.forward_cpu(x)
            print(f"Table 6 set {s.module}: {s.gemm_sizes()} -> {y.shape}, "
                  f"{1e3 * (time.perf_counter() - t):.2f} ms on the CPU")
        return 0
    blk = _block(args)
    x = rng.standard_normal((args.batch, blk.in_channels, blk.hw, blk.hw)).astype(np.float32)
    _say(args, f"block {blk.name}: forward pass of a {tuple(x.shape)} input on the CPU ...")
    t = time.perf_counter()
    y = blk(x)
    dt = time.perf_counter() - t
    print(f"block {blk.name} (module {args.module}), batch {args.batch}: output {y.shape}, "
          f"CPU reference {1e3 * dt:.1f} ms")
    try:
        import torch
    except ImportError:
        print("torch not installed: no comparison")
        return 0
    _say(args, "the same block in torch (CPU) for comparison ...")
    ref = blk.torch_reference(torch.from_numpy(x)).numpy()
    print(f"max relative difference to torch (CPU): {np.abs(y - ref).max() / np.abs(ref).max():.2e}")
    return 0


def run_gpu(args) -> int:
    from tsm_apps.inception import bench

    bench.setup_torch()
    if args.table6:
        _say(args, "Table 6 sets 1..9: tuning on first use, then timing against cuDNN ...")
        for m in range(1, 10):
            r = bench.bench_table6(m, seed=args.seed, rep=args.repeat)
            print(f"Table 6 set {m} {r['gemms']}: ours {r['ours_ms']:.4f} ms, cuDNN per branch "
                  f"{r['cudnn_ms']:.4f} ms, speedup x{r['speedup']:.2f}, max rel diff {r['max_rel_err']:.1e}")
        return 0
    _say(args, f"module {args.module}, batch {args.batch}: tuning on first use, then {args.repeat} timed "
               "calls of ours and of cuDNN ...")
    if args.weights:
        import torch

        blk = _block(args)
        x = torch.randn(args.batch, blk.in_channels, blk.hw, blk.hw, device="cuda")
        with torch.no_grad():
            ref = blk.torch_reference(x)
            err = bench.relerr(blk(x), ref)
            t_ours = bench.anchor_time_ms(lambda: blk(x), rep=args.repeat)
            t_torch = bench.anchor_time_ms(lambda: blk.torch_reference(x), rep=args.repeat)
        r = dict(block=blk.name, ours_ms=t_ours, cudnn_ms=t_torch, speedup=t_torch / t_ours,
                 max_rel_err=err, tiles=[])
    else:
        r = bench.bench_block(args.module, args.batch, seed=args.seed, rep=args.repeat)
    print(f"block {r['block']} (module {args.module}), batch {args.batch}")
    if not args.weights:
        from tsm_apps.inception import InceptionBlock

        blk = InceptionBlock(args.module, seed=args.seed)
        for g in blk.groups():
            print("  " + g.describe(args.batch, blk.hw, blk.hw).replace("\n", "\n  "))
    print(f"  ours (tsm_core.ConvGroup, 2 launches): {r['ours_ms']:.4f} ms  tiles {r['tiles']}")
    print(f"  cuDNN (torch eager, TF32 off):         {r['cudnn_ms']:.4f} ms")
    print(f"  speedup x{r['speedup']:.2f}, max relative difference {r['max_rel_err']:.2e}")
    return 0


def main(argv=None) -> int:
    """The command line; returns the exit status.

    Parameters
    ----------
    argv : list of str, optional
        The options (default: ``sys.argv[1:]``); ``--help`` lists them.

    Returns
    -------
    int
        0.

    Raises
    ------
    SystemExit
        On bad arguments (argparse).

    Examples
    --------
    >>> import contextlib, io
    >>> from tsm_apps.inception import run
    >>> out = io.StringIO()
    >>> with contextlib.redirect_stdout(out):  # the CPU reference, or the GPU against cuDNN
    ...     status = run.main(["--module", "1", "--quiet", "--repeat", "3"])
    >>> status, "block 3a (module 1), batch 1" in out.getvalue()
    (0, True)
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", type=int, default=8, choices=range(1, 10), help="1..9 = 3a, 3b, 4a-4e, 5a, 5b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weights", help="torch state dict path (plain or torchvision GoogLeNet layout)")
    ap.add_argument("--prefix", help="key prefix of the block in --weights")
    ap.add_argument("--table6", action="store_true", help="run the paper's Table 6 GEMM lists instead")
    ap.add_argument("--quiet", action="store_true", help="print the results only, no progress lines")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.repeat < 1:
        ap.error("--batch and --repeat must be >= 1")
    from tsm_core import has_gpu

    return run_gpu(args) if has_gpu() else run_cpu(args)


if __name__ == "__main__":
    sys.exit(main())

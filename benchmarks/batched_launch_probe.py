"""What one launch of a prepared batch costs the host, and the parts of it (H100,
developer tool; session 18):

    python benchmarks/batched_launch_probe.py [--out DIR]

On the 128 / 128 / 8 cell of the paper's sweep (torch CUDA tensors, seed 0): the
host time per call (median of 30 rounds of 200 calls, the GPU drained between
rounds) of ``PreparedBatch.run``, of its parts (torch's stream query, the _Launch
call), of ``cuLaunchKernel`` through CuPy's driver binding and through ctypes with
the same arguments, and of a CUDA graph of the same launch; then each of them timed
as the bench times a call (CUDA events around one call, median of 50). Prints a
table and writes DIR/batched_launch_probe.json.
"""

import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_launch_probe: no CUDA GPU found; nothing to time")
        return 1
    import torch
    from cupy.cuda import driver

    from tsm_datasets.irregular import irregular_shapes
    from tsm_core.batched import api as _batched

    dev = torch.device("cuda")
    g = torch.Generator(device=dev)
    g.manual_seed(0)
    shapes = irregular_shapes(128, 128, 8, seed=0)
    As = [torch.randn(m, k, device=dev, generator=g) for m, n, k in shapes]
    Bs = [torch.randn(k, n, device=dev, generator=g) for m, n, k in shapes]
    Cs = [torch.empty(m, n, device=dev) for m, n, k in shapes]
    prep = _batched.prepare_batched(As, Bs, Cs)
    L = prep._launch
    prep.run()
    torch.cuda.synchronize()
    st = _batched._torch_stream()
    fp, grid, argp = L.fptr, L.grid, L._args[2]
    launch = driver.launchKernel
    cu = ctypes.CDLL("libcuda.so.1")
    f = cu.cuLaunchKernel
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        prep.run()
    fns = {
        "PreparedBatch.run": prep.run,
        "torch stream query (_torch_stream)": _batched._torch_stream,
        "_Launch call": lambda: L(prep.alpha, prep.beta, st),
        "cuLaunchKernel (CuPy driver binding)": lambda: launch(fp, grid, 1, 1, 256, 1, 1,
                                                                L.shmem, st, argp, 0),
        "cuLaunchKernel (ctypes)": lambda: f(fp, grid, 1, 1, 256, 1, 1, L.shmem, st, argp, None),
        "CUDA graph replay": graph.replay,
    }

    def host_us(fn, n=200, rounds=30):
        ts = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            ts.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
        return sorted(ts)[len(ts) // 2]

    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def event_us(fn, n=50):
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3)
        return sorted(ts)[len(ts) // 2]

    rows = []
    print(f"{'what':40s}{'host us':>10s}{'event us':>10s}")
    for name, fn in fns.items():
        h = host_us(fn)
        e = event_us(fn) if "stream query" not in name else float("nan")
        rows.append(dict(what=name, host_us=h, event_us=e))
        print(f"{name:40s}{h:10.2f}{e:10.2f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batched_launch_probe.json"), "w") as fh:
        json.dump(dict(command="python benchmarks/batched_launch_probe.py", cell=[128, 128, 8],
                       rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

import sys, os, time, argparse
sys.path.insert(0, os.getcwd())
import torch, cupy
import numpy as np
from tsm_core import _batched
from datasets.irregular import irregular_shapes
dev = torch.device("cuda")
shapes = irregular_shapes(128, 128, 8, seed=0)
As = [torch.randn(m, k, device=dev) for m, n, k in shapes]
Bs = [torch.randn(k, n, device=dev) for m, n, k in shapes]
Cs = [torch.empty(m, n, device=dev) for m, n, k in shapes]
prep = _batched.prepare_batched(As, Bs, Cs)
L = prep._launch
prep.run(); torch.cuda.synchronize()
from cupy.cuda import driver
launch = driver.launchKernel
st = _batched._torch_stream()
L(1.0, 0.0, st)
def bench(name, f, n=200, rounds=30):
    ts = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n): f()
        ts.append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    ts.sort()
    print(f"{name:40s} {ts[len(ts)//2]:.2f} us (min {ts[0]:.2f})", flush=True)
bench("prep.run()", prep.run)
bench("_torch_stream()", _batched._torch_stream)
bench("torch.cuda.current_device()", torch.cuda.current_device)
bench("torch._C._cuda_getDevice()", torch._C._cuda_getDevice)
raw = torch._C._cuda_getCurrentRawStream
bench("raw(0)", lambda: raw(0))
bench("L(1.0, 0.0, st)", lambda: L(1.0, 0.0, st))
args = L._args[2]
fp, g = L.fptr, L.grid
bench("launchKernel direct", lambda: launch(fp, g, 1, 1, 256, 1, 1, 0, st, args, 0))
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
f = cu.cuLaunchKernel
f.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
bench("ctypes cuLaunchKernel", lambda: f(fp, g, 1, 1, 256, 1, 1, 0, st, args, None))
# CUDA graph of the launch
s = torch.cuda.Stream()
gr = torch.cuda.CUDAGraph()
with torch.cuda.graph(gr, stream=s):
    prep.run()
bench("graph.replay()", gr.replay)
ev0 = torch.cuda.Event(enable_timing=True); ev1 = torch.cuda.Event(enable_timing=True)
def evt(fn, n=50):
    ts=[]
    for _ in range(n):
        torch.cuda.synchronize(); ev0.record(); fn(); ev1.record(); ev1.synchronize(); ts.append(ev0.elapsed_time(ev1)*1e3)
    ts.sort(); return ts[len(ts)//2]
print("event-timed us: prep.run %.2f  direct launch %.2f  ctypes %.2f  graph %.2f" % (evt(prep.run), evt(lambda: launch(fp, g, 1, 1, 256, 1, 1, 0, st, args, 0)), evt(lambda: f(fp, g, 1, 1, 256, 1, 1, 0, st, args, None)), evt(gr.replay)))

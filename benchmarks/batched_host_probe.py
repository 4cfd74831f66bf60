"""Host time of the batched call's steps on torch CUDA tensors, per call (us):

    python benchmarks/batched_host_probe.py

For cells 128 / 128 / {8, 64, 256} of the paper's sweep: the public call
(``batched_matmul``, a batch seen before), a prepared run and the bare launch, each
through the C++ fast path (csrc/fastpath.cpp; where it builds) and through the
Python path (``*_python``: identity key, CuPy's launch binding); the C++ lookup of
a batch it does not know (every tensor's record read, no launch); torch's stream
lookup, the Python identity key (`_ident_key`: id, version counter and data pointer
of every tensor), the key's dictionary lookup, ``cudaGetDevice``, and one
``torch.mm`` of the loop baseline; since session 22, the C++ ``call`` alone
(``native_call``), its device-and-stream read (``current``, through c10 where
enabled) and both again through torch's Python getters (``*_no_c10``). Best of
five loops of 300 calls each; the GPU runs behind (the queue is drained between
loops). Developer tool (session 19; the
C++ path since session 21).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _t(torch, fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best.append((t1 - t0) / n * 1e6)
    return min(best)


def main() -> int:
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_host_probe: no CUDA GPU found")
        return 1
    import cupy
    import torch

    import tsm_core
    from datasets.irregular import irregular_shapes
    from tsm_core import _batched as tb

    dev = torch.device("cuda")
    tb._native()
    print(f"c10 stream lookup: {tb._C10_STREAMS}", flush=True)
    for bs in (8, 64, 256):
        shapes = irregular_shapes(128, 128, bs, seed=0)
        As = [torch.randn(m, k, device=dev) for m, n, k in shapes]
        Bs = [torch.randn(k, n, device=dev) for m, n, k in shapes]
        Cs = [torch.empty(m, n, device=dev) for m, n, k in shapes]
        prep = tb.prepare_batched(As, Bs, Cs)
        tsm_core.batched_matmul(As, Bs, Cs)
        L, st = prep._launch, tb._torch_stream()
        nat = tb._native()
        r = {}
        if nat is not None:  # the C++ fast path (the default where it builds)
            r.update(call=_t(torch, lambda: tsm_core.batched_matmul(As, Bs, Cs)),
                     native_call=_t(torch, lambda: nat.call(As, Bs, Cs, 1.0, 0.0)),
                     prepared=_t(torch, prep.run), launch=_t(torch, lambda: L(1.0, 0.0, st)),
                     native_lookup_miss=_t(torch, lambda: nat.lookup_launch(
                         As, Bs, Cs[::-1], 0, st, 1.0, 0.0)),
                     current=_t(torch, nat.current))
            # torch's Python getters of device and stream instead of c10's
            state = nat.stream_state()
            if state[2]:
                nat.use_c10("")
                try:
                    r.update(call_no_c10=_t(torch, lambda: tsm_core.batched_matmul(As, Bs, Cs)),
                             current_no_c10=_t(torch, nat.current))
                finally:
                    nat.use_c10(state[2])
        # The Python path: identity key, CuPy's launch binding.
        saved = tb._use_native(None)
        try:
            tsm_core.batched_matmul(As, Bs, Cs)
            r.update(call_python=_t(torch, lambda: tsm_core.batched_matmul(As, Bs, Cs)),
                     prepared_python=_t(torch, prep.run),
                     launch_python=_t(torch, lambda: L(1.0, 0.0, st)))
        finally:
            tb._use_native(saved)
        r.update(stream=_t(torch, tb._torch_stream),
                 ident_key=_t(torch, lambda: tb._ident_key(As, Bs, Cs)),
                 key_and_lookup=_t(torch, lambda: tb._idents.get(tb._ident_key(As, Bs, Cs)[0])),
                 get_device=_t(torch, cupy.cuda.runtime.getDevice),
                 torch_mm=_t(torch, lambda: torch.mm(As[0], Bs[0], out=Cs[0])))
        print(f"batch {bs} ({3 * bs} tensors): " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

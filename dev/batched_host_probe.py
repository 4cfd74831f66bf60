"""Host time of the batched call's steps on torch CUDA tensors, per call (us):

    python dev/batched_host_probe.py

For cells 128 / 128 / {8, 64, 256} of the paper's sweep: the public call
(``batched_matmul``, a batch seen before), a prepared run and the bare launch, each
through the C++ fast path (batched/fastpath.cpp; where it builds) and through the
Python path (``*_python``: identity key, CuPy's launch binding); the C++ lookup of
a batch it does not know (every tensor's record read, no launch); torch's stream
lookup, the Python identity key (`batched.memo.ident_key`: id, version counter and
data pointer of every tensor), the key's dictionary lookup, ``cudaGetDevice``, and one
``torch.mm`` of the loop baseline; the C++ ``call`` alone
(``native_call``), its device-and-stream read (``current``, through c10 where
enabled) and both again through torch's Python getters (``*_no_c10``). Best of
five loops of 300 calls each; the GPU runs behind (the queue is drained between
loops). Last, the bench's clock on four of its cells: the
per-call path's time over a prepared run's at each distance the C++ reading loop
asks ahead; and on five cells a repeated call launched through its one-node CUDA
graph against cuLaunchKernel.
"""

import argparse
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


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_host_probe: no CUDA GPU found")
        return 2
    import cupy
    import torch

    import tsm_core
    from tsm_datasets.irregular import irregular_shapes
    from tsm_core.batched import api as tb
    from tsm_core.batched import launch as tlaunch
    from tsm_core.batched import memo as tmemo

    dev = torch.device("cuda")
    tb._native()
    print(f"c10 stream lookup: {tlaunch._C10_STREAMS}", flush=True)
    for bs in (8, 64, 256):
        shapes = irregular_shapes(128, 128, bs, seed=0)
        As = [torch.randn(m, k, device=dev) for m, n, k in shapes]
        Bs = [torch.randn(k, n, device=dev) for m, n, k in shapes]
        Cs = [torch.empty(m, n, device=dev) for m, n, k in shapes]
        prep = tb.prepare_batched(As, Bs, Cs)
        tsm_core.batched_matmul(As, Bs, Cs)
        L, st = prep._launch, tlaunch.torch_stream()
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
        r.update(stream=_t(torch, tlaunch.torch_stream),
                 ident_key=_t(torch, lambda: tmemo.ident_key(As, Bs, Cs)),
                 key_and_lookup=_t(torch, lambda: tmemo.idents.get(tmemo.ident_key(As, Bs, Cs)[0])),
                 get_device=_t(torch, cupy.cuda.runtime.getDevice),
                 torch_mm=_t(torch, lambda: torch.mm(As[0], Bs[0], out=Cs[0])))
        print(f"batch {bs} ({3 * bs} tensors): " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()),
              flush=True)
    nat = tb._native()
    if nat is not None:
        _event_clock(torch, tsm_core, tb, nat)
        _graph_clock(torch, tsm_core, tb, nat)
    return 0


def _graph_clock(torch, tsm_core, tb, nat, rounds=5):
    """The bench's clock on small and large cells: a repeated call launched through
    its one-node CUDA graph against cuLaunchKernel (``use_graphs``), and a prepared
    run (which launches directly), us, median over rounds."""
    from tsm_core.bench._batched import cell_tensors
    from tsm_core.runtime.timing import call_ms
    from tsm_datasets.irregular import irregular_shapes

    before = nat.use_graphs(None)
    try:
        for mn, mk, bs in ((128, 128, 8), (256, 128, 8), (512, 256, 8), (1024, 512, 16),
                           (128, 128, 256)):
            shapes = irregular_shapes(mn, mk, bs, seed=0)
            As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, 0)
            prep = tb.prepare_batched(As, Bs, Cs)
            ours = lambda: tsm_core.batched_matmul(As, Bs, Cs)  # noqa: E731
            t = {"graph": [], "direct": [], "prepared": []}
            for _ in range(rounds):
                for name in t:
                    if name == "prepared":
                        t[name].append(call_ms(prep.run, rep=30) * 1e3)
                        continue
                    nat.use_graphs(name == "graph")
                    ours()
                    t[name].append(call_ms(ours, rep=30) * 1e3)
            med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
            print(f"graph clock {mn}/{mk}/{bs}: per call through its graph {med['graph']:.1f} us, "
                  f"launched directly {med['direct']:.1f}, prepared {med['prepared']:.1f}", flush=True)
    finally:
        nat.use_graphs(before)


def _event_clock(torch, tsm_core, tb, nat, rounds=3):
    """The bench's own clock (events around one call, after a synchronize) on a few of
    its cells: the per-call path's time over the prepared run's, in us, at each
    distance the C++ reading loop asks ahead (``set_ahead``; 4 is the default).
    Here the tensors' objects come to the CPU from further away than in the loops
    above (measured on the H100, 2026-11-27: about 25 ns a tensor in the bench against 17 here)."""
    from tsm_core.bench._batched import cell_tensors
    from tsm_core.runtime.timing import call_ms
    from tsm_datasets.irregular import irregular_shapes

    dists = (0, 4, 8, 16)
    before = nat.set_ahead(4)
    try:
        for mn, mk, bs in ((128, 128, 256), (256, 256, 128), (512, 256, 256), (1024, 512, 256)):
            shapes = irregular_shapes(mn, mk, bs, seed=0)
            As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, 0)
            prep = tb.prepare_batched(As, Bs, Cs)
            ours = lambda: tsm_core.batched_matmul(As, Bs, Cs)  # noqa: E731
            ours()
            extra = {d: [] for d in dists}
            for _ in range(rounds):
                for d in dists:
                    nat.set_ahead(d)
                    t_call = call_ms(ours, rep=30)
                    t_prep = call_ms(prep.run, rep=30)
                    extra[d].append((t_call - t_prep) * 1e3)
            med = {d: sorted(v)[len(v) // 2] for d, v in extra.items()}
            print(f"event clock {mn}/{mk}/{bs} ({3 * bs} tensors), per call over prepared, us: "
                  + ", ".join(f"ahead {d}: {med[d]:.1f}" for d in dists), flush=True)
    finally:
        nat.set_ahead(before)


if __name__ == "__main__":
    raise SystemExit(main())

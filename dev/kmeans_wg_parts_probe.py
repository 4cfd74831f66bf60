"""Probe of the tensor-core assignment's parts per precision: the whole
``TensorAssign.run`` and its main kernel alone (the margin decisions' share is the
difference), with the rows the margin rule flags, on uniform data with centres drawn
from the rows (as the precision sweep). Also the main kernel's rate in TFLOP/s
(2nkd, the products a precision multiplies counted once).

    PRECS=tf32,float32,bfloat16 python dev/kmeans_wg_parts_probe.py [n,d,k ...]
"""
import os

import cupy as cp
import numpy as np

from tsm_core.kmeans.assign import storage_rows
from tsm_core.kmeans.tensor import NULL, TensorAssign, _sms
from tsm_core.runtime.timing import time_fn
from _probe import assignment_case, shapes as probe_shapes

SHAPES = [(4_000_000, 128, 1024), (1_000_000, 128, 8192), (10_000_000, 32, 256)]


def main_only(tc, X, labels, mind, changed):
    n = X.shape[0]
    ldw = X.strides[0] // 4
    lists = tc.lists if tc.marg else NULL
    counts = tc.counts if tc.marg else NULL
    tiles = -(-n // 128)
    if tc.marg:
        tc.counts.fill(0)
    tc.k_main((min(tiles, _sms()) if tc.persist else tiles,), (256,), (
        X, np.int64(ldw), np.int32(n), np.int32(tc.d), tc.Cs, np.int32(tc.ldw_c), tc.cn, tc.mu,
        np.int32(tc.k), np.float32(tc.ea), np.float32(tc.eb), tc.cm2,
        labels, mind, labels, changed, lists, counts, np.int32(n)), shared_mem=tc.smem)


def probe(n, d, k):
    X, C, labels, mind, changed = assignment_case(n, d, k)
    line = f"{str((n, d, k)):>22}"
    for prec in os.environ.get("PRECS", "tf32,float32,bfloat16").split(","):
        Xs = storage_rows(X, "float32", prec)
        tc = TensorAssign(n, d, k, prec)
        tc.prepare(C)
        kind = "wgp" if tc.persist else "wg" if tc.wg else "mma"
        whole = time_fn(lambda: tc.run(Xs, labels, mind, changed, labels), reps=7).median_s * 1e3
        line += f" | {prec} [{kind}] run {whole:.2f}"
        if tc.wg:
            main = time_fn(lambda: main_only(tc, Xs, labels, mind, changed), reps=7).median_s * 1e3
            line += f" main {main:.2f} ({2 * n * k * d / main / 1e9:.0f} TF/s)"
        if tc.marg:
            st = tc.stats
            line += f" pairs {st['pairs'] / st['rows']:.4f} full {st['full'] / st['rows']:.5f}"
        del tc, Xs
        cp.get_default_memory_pool().free_all_blocks()
    print(line, flush=True)


if __name__ == "__main__":
    shapes = probe_shapes(SHAPES)
    for s in shapes:
        probe(*s)

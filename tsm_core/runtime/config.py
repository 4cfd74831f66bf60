"""Every ``TSM_*`` environment switch in one table: name, kind, default, meaning.

The families read their switches through :func:`flag`, :func:`text` and
:func:`integer`, never ``os.environ`` directly, so that this table is the whole
list (``python -m tsm_core.runtime.config`` prints it). Values are read at each call,
so a switch set by a test or a benchmark takes effect at once.

Examples
--------
>>> from tsm_core.runtime import config
>>> config.flag("TSM_AUTOTUNE")
True
>>> sorted(config.SWITCHES)[:2]
['TSM_AUTOTUNE', 'TSM_BATCHED_GRAPHS']
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Switch:
    """One environment switch.

    Attributes
    ----------
    name : str
        The environment variable.
    kind : str
        ``"flag"`` (on/off: 1/true/yes/on or 0/false/no/off), ``"text"`` or ``"int"``.
    default : object
        The value when the variable is unset or empty (``None``: the library decides).
    family : str
        Which part of tsm_core reads it.
    help : str
        What it does.
    """

    name: str
    kind: str
    default: object
    family: str
    help: str


SWITCHES = {s.name: s for s in (
    Switch("TSM_CACHE_DIR", "text", None, "runtime",
           "directory of the on-disk caches (device measurements, tuned choices, the "
           "compiled fast path); default ~/.cache/tsm"),
    Switch("TSM_LOG", "text", None, "runtime",
           "log level of the 'tsm_core' logger when no handler is configured "
           "(DEBUG, INFO, WARNING, ...); default WARNING, with INFO for one-time measurements"),
    Switch("TSM_AUTOTUNE", "flag", True, "tsm2",
           "use configurations kept by tsm_core.autotune (0 ignores them)"),
    Switch("TSM_PROFILE", "flag", True, "tsm2",
           "profile TSM2L's fixed cost and streaming rate once per GPU and kind "
           "(0: the planner's Little's-law model instead)"),
    Switch("TSM_VERIFY_DISPATCH", "flag", True, "tsm2",
           "time a tall-and-skinny kernel against cuBLAS once per shape class before "
           "matmul keeps it (0 trusts the model)"),
    Switch("TSM_BATCHED_SPLITK", "flag", True, "batched",
           "split the k range of the longest problems of a batch"),
    Switch("TSM_BATCHED_TC", "flag", None, "batched",
           "float64 batches on the DMMA tiles (default: on for float64)"),
    Switch("TSM_BATCHED_WIDE", "flag", True, "batched",
           "the 64 x 128 / 128 x 128 tiles for large problems"),
    Switch("TSM_BATCHED_TC3", "flag", True, "batched",
           "float32 batches may take the 3xTF32 tensor-core tiles (version 5)"),
    Switch("TSM_BATCHED_GRAPHS", "flag", True, "batched",
           "repeated torch batches launch through a one-node CUDA graph"),
    Switch("TSM_NATIVE", "text", "auto", "batched",
           "the compiled fast path of torch batched calls: auto (build if a C++ "
           "compiler is found), 0 (never), 1 (a failed build is an error)"),
    Switch("TSM_CONV_TILE", "text", None, "conv",
           "force one tile configuration of the convolution kernels (its tag)"),
    Switch("TSM_CONV_SPLITK", "int", None, "conv",
           "force the split-K count of every convolution segment"),
    Switch("TSM_CONV_TUNE", "flag", True, "conv",
           "time the candidate configurations of a convolution group on first use"),
    Switch("TSM_CONV_TC", "flag", None, "conv",
           "allow the tensor-core tiles among the convolution candidates"),
    Switch("TSM_KMEANS_ASSIGN", "text", None, "kmeans",
           "force the assignment route: fused, tile, gemm or mma, or packed where it applies"),
    Switch("TSM_KMEANS_UPDATE", "text", None, "kmeans",
           "force the centroid update: direct, sorted, or count / radix (sorted with that sort)"),
    Switch("TSM_KMEANS_FUSED", "text", None, "kmeans",
           "the fused kernel's configuration as 'warps,rows,steps'"),
    Switch("TSM_KMEANS_TILE", "text", "v2", "kmeans",
           "the tile kernel's version: v2, or v1 (old)"),
    Switch("TSM_KMEANS_WGMMA", "flag", None, "kmeans",
           "the warpgroup-MMA assignment of short rows (compute capability 9.0): 1 wherever it fits, "
           "0 never; unset: precision='float32' at any k, and tf32 and 16-bit rows against more "
           "than 128 centres or with d >= 128 (with TSM_KMEANS_WS=0: tf32 with k >= 1024 only; "
           "where each was measured faster)"),
    Switch("TSM_KMEANS_PERSIST", "flag", None, "kmeans",
           "the warpgroup-MMA assignment as a persistent kernel (one block an SM over the row "
           "tiles, the next tile's rows copied during the current one): 1 wherever the warpgroup "
           "kernel runs and TSM_KMEANS_WS=0, 0 never; unset: with TSM_KMEANS_WS=0, "
           "precision='float32' rows of d <= 64 against at most 1024 centres (where it was "
           "measured faster)"),
    Switch("TSM_KMEANS_PACKED", "flag", None, "kmeans",
           "the packed assignment of short rows against few centres (rows of one slice, d <= 128 "
           "in float32 and 256 in 16 bits; any precision but float64): several rows a warp, "
           "distances from the differences in float32, and in a fit the centroid sums in the "
           "same pass over X: 1 wherever it fits (k <= 32 in float32, 16 in 16 bits), 0 never; "
           "unset: k <= 16 and d <= 64 (float32), 48 (tf32); 16-bit rows k <= 8, d <= 32 "
           "(where it was measured faster)"),
    Switch("TSM_KMEANS_INIT_TF32", "flag", None, "kmeans",
           "k-means|| (init='k-means||'): the rounds' distances of float32 rows to their "
           "candidates on the TF32 tensor cores (the sampling needs them to a few parts in "
           "1e3) instead of the exact SIMT kernels: 1 or unset on; 0 off (the exact kernels; "
           "the rounds 6x slower at 4e6 x 128, k = 1024, H200)"),
    Switch("TSM_KMEANS_WS", "flag", None, "kmeans",
           "the warpgroup-MMA assignment warp-specialised (a producer thread copies centre tiles "
           "and rows with cp.async.bulk; two consumer warpgroups multiply and fold without a "
           "block barrier; 1.2-2.2x faster than its per-tile and persistent forms, H200): 1 or "
           "unset wherever the warpgroup kernel runs (rows too far apart for its buffers take the "
           "per-tile kernel); 0 never"),
    Switch("TSM_KMEANS_DIRECT_LANES", "flag", True, "kmeans",
           "the direct centroid update packs short rows into a warp (32 / LPR rows a step, "
           "LPR lanes a row); 0: one row a warp (3/4 of the lanes idle at d = 32)"),
    Switch("TSM_KMEANS_SPLIT", "text", "bf16x3", "kmeans",
           "the products of precision='float32' on the warpgroup-MMA kernel: bf16x3 (three "
           "bfloat16 products, a bound about 16 times tighter at 1.5 times the tensor-core work; "
           "measured faster at every shape tried) or tf32 (one TF32 product, more rows re-decided)"),
    Switch("TSM_KMEANS_LONG", "flag", None, "kmeans",
           "rows longer than 128 words (float32 values, or pairs of 16-bit ones) on cuBLAS's dot "
           "products, folded into each row's nearest centre; in precision='float32' the rows within "
           "the TF32 bound of a tie assigned again by three bfloat16 products summed in chunks, then "
           "float64 (longrows.py): 1 on; 0 off (the fused mma.sync kernel); unset on from 256 "
           "centres, and for 'float32' rows of 1024 values or more at any k"),
    Switch("TSM_KMEANS_SCREEN", "flag", None, "kmeans",
           "precision='float32' on the warpgroup-MMA kernel as a TF32 screen: one TF32 product "
           "keeping each row's best and second distance, then the rows within the TF32 bound of "
           "a tie assigned again by the three-product kernel and the margin rule (the same "
           "labels): 1 on; 0 off; unset on from 256 centres (below, the second pass costs more "
           "than it saves)"),
    Switch("TSM_KMEANS_OVERLAP", "flag", True, "kmeans",
           "overlap the next iteration's assignment with the centroid update"),
    Switch("TSM_DIST_TIMEOUT", "int", 300, "distributed",
           "seconds a collective of the distributed fits and products may wait before every "
           "rank still alive raises (a rank died or stopped answering)"),
    Switch("TSM_KMEANS_CPU", "text", "auto", "kmeans",
           "TSMKMeans's Lloyd iterations without a GPU: sklearn (scikit-learn's compiled "
           "iteration), numpy, or auto (sklearn where its routine imports and passes a check)"),
)}


def _switch(name: str) -> Switch:
    try:
        return SWITCHES[name]
    except KeyError:
        raise KeyError(f"{name} is not a tsm switch; see tsm_core.runtime.config.SWITCHES") from None


def raw(name: str) -> str | None:
    """The variable's value, stripped, or None where it is unset or empty."""
    _switch(name)
    v = os.environ.get(name, "").strip()
    return v or None


def flag(name: str, default=None):
    """An on/off switch: True, False, or the table's default (``default`` overrides it)
    where unset; an unrecognised value counts as on, as it always has."""
    s = _switch(name)
    v = raw(name)
    if v is None:
        return s.default if default is None else default
    return v.lower() not in _FALSE


def text(name: str):
    """A text switch: its value, or the table's default where unset."""
    s = _switch(name)
    v = raw(name)
    return s.default if v is None else v


def integer(name: str):
    """An integer switch: its value, or the table's default where unset."""
    s = _switch(name)
    v = raw(name)
    if v is None:
        return s.default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


def describe() -> str:
    """The table as text, one switch a line, with its current value."""
    rows = []
    for s in SWITCHES.values():
        cur = raw(s.name)
        now = f" (now {cur})" if cur is not None else ""
        rows.append(f"{s.name:<22} {s.kind:<5} default {s.default!s:<5}{now}  [{s.family}] {s.help}")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(describe())

"""The k-means kernels' configurations and routes, as data and pure functions.

Nothing here imports CuPy or launches anything: the launchers (``assign``,
``update``) ask these functions which instantiation of ``kmeans.cu`` to run, and the
compile checks (``all_names``) enumerate every one they can pick.

Assignment routes (``choose_method``): ``fused`` (k <= 32, d >= 512: one read of X,
the distances in registers), ``tile`` (a SIMT GEMM tile with the argmin and ||x||^2
in its epilogue: one read of X; version v2 by default, v1 with
``TSM_KMEANS_TILE=old``) and ``gemm`` (cuBLAS dot products in row batches, then
``kmeans_argmin_rows``). Centroid-update routes (``update_route``): ``direct``
(per-warp accumulators in shared memory, small k) and ``sorted`` (a stable counting
sort by label, then sums per piece of <= PIECE rows).

Examples
--------
>>> import numpy as np
>>> from tsm_core.kmeans import configs
>>> configs.choose_method(16, 4096), configs.choose_method(1024, 64), configs.choose_method(1024, 4096)
('fused', 'tile', 'gemm')
>>> configs.update_route(16, 4096, np.float32, 4)
'direct'
"""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config

PIECE = 256  # rows per piece of the centroid update
GEMM_BATCH_BYTES = 64 << 20  # dot-product block of the cuBLAS route
FUSED_KMAX = 32  # the fused kernel keeps k <= 32 distances per row in registers
FUSED_DMIN = 512  # below this d the lane-split of d leaves lanes idle (tile route)
ROW_BLOCK = 1024  # rows per block of the direct centroid update
DIRECT_SMEM = 74 * 1024  # three blocks per SM (227 KiB of shared memory on sm_90)
SORT_RW = 256  # rows per warp of the counting sort
SORT_WB = 4  # warps per block of the counting sort


# ------------------------------------------------------------------ assignment


def fused_config(k: int, dtype, vec: int) -> tuple:
    """(VEC, W, R, KP, KT) of kmeans_assign_fused for k centres.

    R * KP partial sums per lane: 64 keeps float32 at ~124 registers (two blocks of
    256 threads per SM); float64 takes twice the registers, so half the rows.
    ``TSM_KMEANS_FUSED="W,R,STEPS"`` overrides warps, rows per warp and warp steps
    per C tile (for tuning sweeps; such configurations are not compile-checked)."""
    dtype = np.dtype(dtype)
    kp = 8 if k <= 8 else 16 if k <= 16 else 32
    # At most 4 rows: with R=8 the tile's prefetched X alone is 64 registers (228 in all).
    r = max(1, min(4, 64 // kp))
    if dtype == np.float64:
        r = max(1, r // 2)
    w, steps = 8, 2
    tune = config.text("TSM_KMEANS_FUSED")
    if tune:
        w, r, steps = (int(t) for t in tune.split(","))
    return vec, w, r, kp, steps * 32 * vec


def fused_name(cfg: tuple, dtype) -> str:
    vec, w, r, kp, kt = cfg
    return f"kmeans_assign_fused<{_compile.ctype(dtype)}, {vec}, {w}, {r}, {kp}, {kt}>"


def all_names(dtype) -> list:
    """Every instantiation the launchers here can pick for `dtype` (compile checks):
    a numpy float dtype, or "float16" / "bfloat16" (the update side's kernels)."""
    if x_type(dtype) in ("float16", "bfloat16"):
        return update_names(dtype)
    item = np.dtype(dtype).itemsize
    names = set()
    vecs = [v for v in (4, 2, 1) if v * item <= 16]
    for vec in vecs:
        for k in (1, 9, 17):
            names.add(fused_name(fused_config(k, dtype, vec), dtype))
        names.add(tile_name(dtype, vec, "v1"))
        names.add(tile_name(dtype, vec, "v2"))
    c = _compile.ctype(dtype)
    names.add(f"kmeans_centres_t<{c}>")
    names.add(f"kmeans_argmin_rows<{c}>")
    names |= set(update_names(dtype))  # the centroid update's
    return sorted(names)


# v2 tile kernel: (vector width of the X loads, BK) for each width that X allows, by
# itemsize. Measured with ptxas (sm_90, 128 registers for two blocks of 256 threads
# per SM): these compile without spills; float2 loads with BK = 8 and any BK = 16
# for float spill a few words (the 8 x 8 block leaves no slack), so float2 rows
# take scalar loads (8 per thread and step, next to 512 FFMAs).
TILE2_STEP = {4: {4: (4, 8), 2: (1, 8), 1: (1, 8)}, 8: {2: (2, 16), 1: (1, 8)}}


def tile_version() -> str:
    """'v2' (kmeans_assign_tile2, the default) or 'v1' (kmeans_assign_tile, kept to
    compare on the device: ``TSM_KMEANS_TILE=old``)."""
    return "v1" if (config.text("TSM_KMEANS_TILE") or "").lower() in ("old", "v1") else "v2"


def tile_config(dtype, version: str | None = None, vec: int | None = None) -> tuple:
    """(BM, BN, BK, TM, TN) of the tile kernel: rows and centres per block tile, the
    k-depth of a step and each thread's register block.

    v2 (gemm.cu's blocking, 256 threads, two blocks per SM): float 256 x 64 tiles,
    8 x 8 per thread; double 64 x 64, 4 x 4; BK from TILE2_STEP for the vector width
    `vec` that X allows (default the widest). v1: 128 threads, float
    (64, 64, 32, 8, 4) (~145 registers: three blocks per SM), double (32, 64, 16, 4, 4)."""
    version = version or tile_version()
    item = np.dtype(dtype).itemsize
    if version == "v2":
        vec = 16 // item if vec is None else vec
        bk = TILE2_STEP[item][vec][1]
        return (256, 64, bk, 8, 8) if item == 4 else (64, 64, bk, 4, 4)
    return (64, 64, 32, 8, 4) if item == 4 else (32, 64, 16, 4, 4)


def tile_name(dtype, vec: int, version: str | None = None) -> str:
    """The tile kernel's instantiation for X rows that allow `vec`-wide loads."""
    version = version or tile_version()
    bm, bn, bk, tm, tn = tile_config(dtype, version, vec)
    if version == "v2":
        v = TILE2_STEP[np.dtype(dtype).itemsize][vec][0]
        return f"kmeans_assign_tile2<{_compile.ctype(dtype)}, {v}, {bn // tn}, {bk}>"
    return f"kmeans_assign_tile<{_compile.ctype(dtype)}, {vec}, {bm}, {bn}, {bk}, {tm}, {tn}>"


def tile_needs_xx() -> bool:
    """v1 takes ||x||^2 from a separate pass over X; v2 sums it while X is staged."""
    return tile_version() == "v1"


def choose_method(k: int, d: int) -> str:
    """'fused' where the distances fit in registers and d is long enough to split
    over the lanes (one read of X, at its bandwidth); 'tile' (SIMT GEMM with the
    argmin fused) where one tile of centres covers k or rows are short, so that the
    X tile is re-read per centre tile from L2 only; 'gemm' (cuBLAS dot products in
    row batches, then the argmin) for long rows and many centres."""
    if k <= FUSED_KMAX and d >= FUSED_DMIN:
        return "fused"
    if k <= tile_config(np.float32)[1] or d <= 1024:
        return "tile"
    return "gemm"


# ------------------------------------------------------------------ tensor-core assignment

MMA_BM = 128  # rows per block tile of kmeans_assign_mma
MMA_BN = 128  # centres per centre tile
MMA_KW = 32  # 32-bit words of a row per pipeline slab
MMA_STAGES = 3  # slabs in flight (cp.async ring)
MMA_PART_BYTES = 256 << 20  # the split-centre partial results at most
PRECISIONS = ("float32", "tf32", "bfloat16", "float16", "float64")


def mma_smem(stages: int = MMA_STAGES) -> int:
    """Dynamic shared memory of kmeans_assign_mma: `stages` slabs of X's and C's tiles
    (rows 36 words apart). Three stages: 110,592 bytes, two blocks per SM on sm_90."""
    return stages * (MMA_BM + MMA_BN) * (MMA_KW + 4) * 4


WG_MAX_WORDS = 128  # rows the wgmma kernel holds in registers: at most this many words
WG_STAGES = 3
WG_MIN_TILES = 8  # by default, float32 rows against at least this many tiles of 128 centres


WS_MIN_D = 128  # warp-specialised (the default), TF32 and 16-bit rows of one centre tile take the wgmma kernel from this d


LONG_MIN_D = 129  # float32 rows longer than the warpgroup kernels take
LONG_MIN_K = 256  # and at least this many centres
LONG_MIN_D_ANY_K = 1024  # "float32" from rows this long at any k


def use_long(d: int, k: int, cc: int, switch, precision: str = "tf32") -> bool:
    """Whether rows of d values in `precision` against k centres take the long-row
    route (``longrows.py``: cuBLAS's dot products, then the fold and, in "float32",
    the decisions) on compute capability 8.0 and later: where `switch`
    (TSM_KMEANS_LONG: True, False or None) says, else for rows of at least
    LONG_MIN_D words (float32 values, or pairs of 16-bit ones) against LONG_MIN_K
    centres or more, and "float32" rows of 1024 values or more against any k.
    Measured on the H200 (2026-11-28, ms per assignment, fused mma.sync kernel ->
    long-row route; uniform rows, centres one Lloyd step on): "float32" 24.8 -> 8.6
    at (1e5, 4096, 1024), 19.2 -> 7.4 at (2e6, 512, 256), 4.2 -> 2.2 at
    (1e6, 256, 256), 4.1 -> 3.1 at (5e5, 1024, 64); tf32 7.98 -> 3.05, 4.92 -> 4.80,
    5.50 -> 3.66 at (1e6, 256, 1024). Against 64 centres it lost at d = 256 (tf32
    0.70 -> 1.17, "float32" 1.52 -> 1.62) and in tf32 at d = 1024 (1.28 -> 1.96).

    >>> use_long(4096, 1024, 90, None), use_long(256, 64, 90, None), use_long(128, 1024, 90, None)
    (True, False, False)
    >>> use_long(1024, 64, 90, None, "float32"), use_long(1024, 64, 90, None, "tf32")
    (True, False)
    >>> use_long(256, 1024, 90, None, "bfloat16"), use_long(258, 1024, 90, None, "float16")
    (False, True)
    >>> use_long(64, 8, 90, True), use_long(4096, 1024, 90, False), use_long(4096, 1024, 75, True)
    (True, False, False)
    """
    if cc < 80:
        return False
    if switch is not None:
        return bool(switch)
    words = d if precision in ("tf32", "float32") else -(-d // 2)
    if words < LONG_MIN_D:
        return False
    return k >= LONG_MIN_K or precision == "float32" and d >= LONG_MIN_D_ANY_K


def use_wg(d: int, k: int, tin: int, cc: int, switch, ws: bool = False) -> int:
    """NS for the wgmma kernel, or 0 for the mma.sync one: rows that fit its registers
    on compute capability 9.0, where `switch` (TSM_KMEANS_WGMMA: True, False or None)
    allows. By default: float32 rows as bfloat16 pairs (tin 3, "float32") at any k;
    TF32 rows against WG_MIN_TILES tiles or more; with the warp-specialised form
    (`ws`, TSM_KMEANS_WS) TF32 and 16-bit rows against two or more centre tiles, or
    one tile at d >= WS_MIN_D.
    Measured on the H200 (2026-11-28), per assignment against the mma.sync kernel:
    the warp-specialised kernel 1.2-2.2x faster at d = 32-256, k = 64-8192 in TF32 and
    bfloat16, and 0.87x (TF32) / 0.87x (bfloat16) at (1e7, 32, 8), one tile of short
    rows; the per-tile form gained in TF32 only where a block had many tiles (H100).

    >>> [use_wg(d, k, 0, 90, None, ws=True) for d, k in ((128, 1024), (32, 128), (32, 129))]
    [16, 0, 4]
    >>> use_wg(128, 256, 0, 90, None), use_wg(128, 1024, 0, 90, None)
    (0, 16)
    >>> use_wg(256, 64, 1, 90, None, ws=True), use_wg(32, 8, 1, 90, None, ws=True), use_wg(32, 8, 1, 90, True)
    (16, 0, 2)
    >>> use_wg(128, 1024, 1, 90, None), use_wg(128, 1024, 0, 80, True), use_wg(129, 1024, 0, 90, True)
    (0, 0, 0)
    >>> use_wg(128, 1024, 3, 90, None), use_wg(129, 1024, 3, 90, True), use_wg(17, 8, 3, 90, None)
    (8, 0, 2)
    >>> use_wg(64, 256, 3, 90, None), use_wg(64, 256, 3, 90, False)
    (4, 0)
    """
    if tin == 3:  # float32 rows as bfloat16 pairs: 16 elements a step, hi and lo held
        ns = wg_steps(d, 2) if wg_steps(d, 1) else 0
    else:
        ns = wg_steps(d, 1 if tin == 0 else 2)
    if cc != 90 or not ns or switch is False:
        return 0
    if switch is None and tin != 3:
        tiles = -(-k // 128)
        if ws and tiles < 2 and d < WS_MIN_D or not ws and (tin in (1, 2) or tiles < WG_MIN_TILES):
            return 0
    return ns


PERSIST_MAX_D = 64  # by default the persistent kernel takes "float32" rows of d <= this
PERSIST_MAX_TILES = 8  # against at most this many tiles of 128 centres


def use_persist(d: int, k: int, tin: int, switch) -> bool:
    """Whether the warpgroup kernel runs in its persistent form, where `switch`
    (TSM_KMEANS_PERSIST: True, False or None) allows; by default for float32 rows as
    bfloat16 pairs (tin 3) of d <= PERSIST_MAX_D against at most PERSIST_MAX_TILES
    centre tiles. Measured on the H200 (2026-11-28): there a row tile's products are
    short, and the persistent kernel hides the next tile's row copy and this tile's
    finish behind them (1.04-1.21x over the per-tile form at six shapes); with
    longer rows or more tiles it was 0.84-0.99x.

    >>> use_persist(32, 256, 3, None), use_persist(128, 256, 3, None), use_persist(64, 2048, 3, None)
    (True, False, False)
    >>> use_persist(32, 256, 0, None), use_persist(32, 256, 0, True), use_persist(32, 256, 3, False)
    (False, True, False)
    """
    if switch is not None:
        return bool(switch)
    return tin == 3 and d <= PERSIST_MAX_D and -(-k // 128) <= PERSIST_MAX_TILES


def wg_steps(d: int, epw: int) -> int:
    """NS, the 8-word k-steps of rows of d elements at `epw` elements a word on the
    wgmma kernel, or 0 where its rows would not fit its registers.

    >>> wg_steps(128, 1), wg_steps(256, 2), wg_steps(129, 1), wg_steps(3, 2)
    (16, 16, 0, 1)
    """
    dw = -(-d // epw)
    ns = -(-dw // 8)
    return ns if ns * 8 <= WG_MAX_WORDS else 0


def wg_smem(ns: int, planes: int = 1) -> int:
    """Shared memory of the wgmma kernel: WG_STAGES centre tiles of `planes` x 128 x
    8 ns words and a ring of four tiles' norms."""
    return (WG_STAGES * planes * 128 * ns * 8 + 4 * 128) * 4


SMEM_MAX = 227 * 1024  # dynamic shared memory a block may take on compute capability 9.0


def wgp_stages(ns: int, planes: int = 1) -> int:
    """The centre ring's depth in the persistent wgmma kernel: 3 where its shared
    memory (`wgp_smem`) fits SMEM_MAX, else 2.

    >>> wgp_stages(16), wgp_stages(8, 2), wgp_stages(8), wgp_stages(2, 2)
    (2, 2, 3, 3)
    """
    return 3 if wgp_smem(ns, planes, 3) <= SMEM_MAX else 2


def wgp_smem(ns: int, planes: int = 1, stages: int | None = None) -> int:
    """Shared memory of the persistent wgmma kernel (kmeans_assign_wgp): `stages`
    centre tiles of `planes` x 128 x 8 ns words, a ring of four tiles' norms and a
    buffer of 128 rows of the words its A fragments read (8 ns, or 16 ns for float32
    rows as bfloat16 pairs: planes == 2), each padded by 4 words.

    >>> wgp_smem(16), wgp_smem(8, 2)
    (200704, 200704)
    """
    stages = wgp_stages(ns, planes) if stages is None else stages
    rw = ns * (16 if planes == 2 else 8)
    return (stages * planes * 128 * ns * 8 + 4 * 128 + 128 * (rw + 4)) * 4


def ws_smem(ns: int, planes: int = 1, stages: int | None = None) -> int:
    """Shared memory of the warp-specialised wgmma kernel (kmeans_assign_ws): `stages`
    centre tiles of `planes` x 128 x 8 ns words with their 128 norms each, two
    buffers of 64 rows of at most 8 ns words (16 ns for float32 rows as bfloat16
    pairs: planes == 2), the 2 stages + 4 mbarriers and a word for each consumer
    thread.

    >>> ws_smem(8, 1, 4), ws_smem(8, 2, 2), ws_smem(16, 1, 2)
    (167008, 198720, 198720)
    """
    stages = ws_stages(ns, planes) if stages is None else stages
    rw = ns * (16 if planes == 2 else 8)
    return (stages * (planes * 128 * ns * 8 + 128) + 2 * 64 * rw + 256) * 4 + (2 * stages + 4) * 8


def ws_stages(ns: int, planes: int = 1) -> int:
    """The centre ring's depth in kmeans_assign_ws: the most of 4, 3, 2 whose shared
    memory fits SMEM_MAX.

    >>> ws_stages(16), ws_stages(8, 2), ws_stages(8), ws_stages(4, 2), ws_stages(2)
    (2, 2, 4, 4, 4)
    """
    return next((st for st in (4, 3) if ws_smem(ns, planes, st) <= SMEM_MAX), 2)


def use_ws(switch) -> bool:
    """Whether the wgmma kernel runs warp-specialised (kmeans_assign_ws) where
    `switch` (TSM_KMEANS_WS: True, False or None) allows: on unless switched off.
    Measured on the H200 (2026-11-28) against the per-tile and persistent forms at six
    shapes (d = 32-128, k = 8-8192): 1.2-2.2x faster, except 16-bit rows at
    (1e7, 32, 8), one centre tile (0.81x), which use_wg keeps on mma.sync. Its GPU
    tests (bit-identical to the per-tile kernel, three runs each) and
    compute-sanitizer's memcheck and racecheck pass.

    >>> use_ws(None), use_ws(True), use_ws(False)
    (True, True, False)
    """
    return switch is not False


def mma_groups(k: int, d: int, itemsize: int, rows: int) -> int:
    """G, the blocks that split one row tile's centre tiles between them.

    A block re-reads its X tile once per centre tile. While the rows of all resident
    blocks (264 on the H100, 128 rows each) fit in L2 those re-reads stay there; for
    rows of 1 KiB or more they would not, so every centre tile gets a block of its
    own (G consecutive blocks run together and read the tile from DRAM once),
    bounded by the partial results' memory."""
    ntile = -(-k // MMA_BN)
    if ntile == 1 or d * itemsize < 1024:
        return 1
    cap = max(1, MMA_PART_BYTES // (20 * max(rows, 1)))
    return max(1, min(ntile, cap))


def resolve_precision(precision, dtype) -> str:
    """The precision of a run on rows of `dtype` (a numpy dtype or "bfloat16"):
    `precision`, or by default the rows' own ("float32" for float32 rows).

    >>> resolve_precision(None, np.float32), resolve_precision("tf32", np.float64)
    ('float32', 'tf32')
    """
    name = x_type(dtype)
    if precision is None:
        return name
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
    if precision == "float64" and name != "float64":
        raise ValueError(f"precision='float64' needs float64 rows; got {name}")
    if precision in ("float32", "tf32") and name in ("float16", "bfloat16"):
        raise ValueError(f"precision={precision!r} cannot be computed from {name} rows; use "
                         f"precision={name!r} or pass float32 rows")
    return precision


def storage_dtype(precision: str) -> str:
    """The dtype X is held in for `precision` ("float32" for tf32)."""
    return "float32" if precision == "tf32" else precision


def choose_route(k: int, d: int, precision: str) -> str:
    """The assignment route for `precision`: float64 as ``choose_method``; short rows
    against few centres (``use_packed``) the packed kernel ('packed': a fit's
    assignment and centroid sums in one pass over X); float32 and tf32 keep the exact
    fused kernel where k <= 32 and rows are long (it reads X once at its bandwidth);
    else the tensor cores ('mma'). ``TSM_KMEANS_ASSIGN`` forces a route: any of
    fused, tile, gemm for float32 rows; mma; packed where it applies.

    >>> choose_route(16, 4096, "float32"), choose_route(1024, 128, "float32"), choose_route(16, 4096, "bfloat16")
    ('fused', 'mma', 'mma')
    >>> choose_route(8, 32, "float32"), choose_route(8, 32, "float16"), choose_route(8, 32, "float64")
    ('packed', 'packed', 'tile')
    """
    if precision == "float64":
        return choose_method(k, d)
    forced = config.text("TSM_KMEANS_ASSIGN")
    if forced == "packed" and use_packed(k, d, precision, True):
        return forced
    if precision in ("float32", "tf32") and forced in ("fused", "tile", "gemm", "mma") or forced == "mma":
        return forced
    if use_packed(k, d, precision, config.flag("TSM_KMEANS_PACKED")):
        return "packed"
    if precision in ("float32", "tf32") and k <= FUSED_KMAX and d >= FUSED_DMIN:
        return "fused"
    return "mma"


# ------------------------------------------------------------------ centroid update

X_TYPES = ("float32", "float64", "float16", "bfloat16")  # X's types on the update side
SORT_KMAX = 4096  # the counting sort up to this k (a histogram of k ints per warp), a radix sort above
PARTIALS_LPR = (4, 8, 16, 32)  # lanes per row of kmeans_partials


def x_type(dtype) -> str:
    """The name of X's element type among X_TYPES: a numpy dtype (or its name),
    "bfloat16", or a torch dtype ("torch.bfloat16").

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.kmeans import configs
    >>> configs.x_type(np.float16), configs.x_type("bfloat16"), configs.x_type("torch.float32")
    ('float16', 'bfloat16', 'float32')
    """
    name = str(dtype).replace("torch.", "")
    if name in X_TYPES:
        return name
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in X_TYPES:
        raise TypeError(f"X must be float32, float64, float16 or bfloat16; got {dtype}")
    return name


def x_itemsize(xdtype) -> int:
    return {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}[x_type(xdtype)]


def acc_itemsize(xdtype) -> int:
    """Bytes of the update's accumulators in registers and shared memory: float for
    half X, X's own type otherwise."""
    return max(4, x_itemsize(xdtype))


def x_ctype(xdtype) -> str:
    """C++ type of X in the kernels' names (``__half``, ``__nv_bfloat16`` for the half types)."""
    t = x_type(xdtype)
    return _compile.ctype(t if t in ("float16", "bfloat16") else np.dtype(t))


def direct_lanes(d: int, vec: int) -> int:
    """LPR, the lanes per row of kmeans_sums_direct: the least of PARTIALS_LPR that
    covers d at VEC elements a lane, so that short rows keep every lane busy (32 / LPR
    rows a warp step); 32 (a warp a row, d-slices of 32*VEC columns) for long rows or
    with ``TSM_KMEANS_DIRECT_LANES=0``.

    >>> direct_lanes(32, 4), direct_lanes(4096, 4)
    (8, 32)
    """
    if not config.flag("TSM_KMEANS_DIRECT_LANES"):
        return 32
    need = -(-d // vec)
    return next((p for p in PARTIALS_LPR if p >= need), 32)


def direct_config(k: int, d: int, dtype, vec: int):
    """(VEC, W, shared bytes) of kmeans_sums_direct, or None where k is too large
    for per-warp accumulators (the sorted route then). The widest vector first: it
    reads 32*VEC contiguous elements of a row per warp (or 32 / LPR rows of LPR*VEC,
    `direct_lanes`). The accumulators are float for half-precision X: 32*VEC per warp
    and label, and a weight per row group (32 / LPR of them), warp and label."""
    item = acc_itemsize(dtype)
    v = vec
    while v >= 1:
        g = 32 // direct_lanes(d, v)
        for w in (8, 4):
            smem = w * k * (32 * v + g) * item
            if smem <= DIRECT_SMEM:
                return v, w, smem
        v //= 2
    return None


def update_route(k: int, d: int, dtype, vec: int = 1) -> str:
    """'direct' where eight warps with full 16-byte vectors fit their accumulators in
    shared memory (measured on the H100: at (1e5, 4096, 16) it reads X at ~2.8 TB/s;
    with narrower slices or 4 warps, k=64 d=256, the sorted route was faster, 0.44
    against 0.69 ms); 'sorted' otherwise. ``TSM_KMEANS_UPDATE`` overrides it:
    direct, sorted, or count / radix (the sorted route with that sort, see
    ``sort_method``)."""
    forced = update_switch()
    if forced == "direct":
        if direct_config(k, d, dtype, vec) is None:
            raise ValueError(f"k={k} is too large for the direct centroid update")
        return forced
    if forced in ("sorted", "count", "radix"):
        return "sorted"
    cfg = direct_config(k, d, dtype, vec)
    full = cfg is not None and cfg[0] == 16 // x_itemsize(dtype) and cfg[1] == 8
    return "direct" if full else "sorted"


PACKED_KP = (8, 16, 32)  # centres the packed kernel takes: its instantiations
PACKED_KMAX = 16  # by default the packed route takes k <= this


def packed_config(k: int, d: int, xdtype, sums: bool = True):
    """(VEC, W, LPR, KP, shared bytes) of kmeans_assign_sums_packed for rows of
    `xdtype` read in 16-byte vectors, or None where it does not apply: float64 rows,
    k > 32, or rows longer than one slice (d > 32 * VEC). The warps and lanes of the
    direct update (`direct_config`, `direct_lanes`), whose sums it takes with the
    labels; `sums` False: the centres' shared memory only.

    >>> packed_config(8, 32, "float32"), packed_config(16, 200, "bfloat16", sums=False)
    ((4, 8, 8, 8, 34816), (8, 4, 32, 16, 16384))
    >>> packed_config(8, 129, "float32"), packed_config(33, 8, "float32"), packed_config(8, 8, "float64")
    (None, None, None)
    """
    t = x_type(xdtype)
    if t == "float64" or k > PACKED_KP[-1] or k < 1:
        return None
    vec = 16 // x_itemsize(t)
    cfg = direct_config(k, d, t, vec)
    if cfg is None or cfg[0] != vec:
        return None
    v, w, smem = cfg
    lpr = direct_lanes(d, v)
    if d > lpr * v:
        return None
    kp = next(p for p in PACKED_KP if p >= k)
    cs = kp * lpr * v * 4
    return v, w, lpr, kp, (-(-smem // 16) * 16 + cs if sums else cs)


def packed_name(cfg: tuple, xdtype) -> str:
    v, w, lpr, kp = cfg[:4]
    return f"kmeans_assign_sums_packed<{x_ctype(xdtype)}, {v}, {w}, {lpr}, {kp}>"


# By default the packed route takes rows of at most this d (and k <= PACKED_KMAX;
# 16-bit rows k <= 8): measured on the H200 (2026-11-28, whole iterations against the
# default routes without it): float32 1.1-2.3x at d <= 64, tf32 1.07-1.75x at
# d <= 48 (0.93x at (5e6, 64, 16)), 16-bit rows 1.4-1.5x at d <= 32, k = 8 (1.0x at
# k = 16, 0.5-0.7x at d >= 48, where the tensor cores' products cost less).
PACKED_MAX_D = {"float32": 64, "tf32": 48, "bfloat16": 32, "float16": 32}


def use_packed(k: int, d: int, precision: str, switch) -> bool:
    """Whether the assignment takes the packed route (kmeans_assign_sums_packed: a
    fit's assignment and centroid sums in one pass over X) where `switch`
    (TSM_KMEANS_PACKED: True, False or None) allows: any precision but float64,
    rows of one slice (d <= 128 for float32 rows, 256 for 16-bit ones; k <= 32 for
    float32 rows, 16 for 16-bit ones) with the switch on; by default k <=
    PACKED_KMAX (8 for 16-bit rows) and d <= PACKED_MAX_D[precision].

    >>> use_packed(8, 32, "tf32", None), use_packed(8, 32, "float64", None), use_packed(8, 200, "bfloat16", True)
    (True, False, True)
    >>> use_packed(32, 32, "float32", None), use_packed(32, 32, "float32", True), use_packed(8, 32, "float32", False)
    (False, True, False)
    >>> use_packed(16, 64, "float32", None), use_packed(16, 64, "tf32", None), use_packed(16, 32, "float16", None)
    (True, False, False)
    """
    if switch is False or precision == "float64":
        return False
    if switch is None:
        half = precision in ("bfloat16", "float16")
        if k > (8 if half else PACKED_KMAX) or d > PACKED_MAX_D[precision]:
            return False
    return packed_config(k, d, storage_dtype(precision)) is not None


def update_switch():
    forced = (config.text("TSM_KMEANS_UPDATE") or "").lower()
    return forced if forced in ("direct", "sorted", "count", "radix") else None


def sort_method(k: int) -> str:
    """The stable sort by label of the sorted route: 'count' (per-warp histograms in
    shared memory, SORT_WB*k ints per block; k <= SORT_KMAX) or 'radix'
    (``cupy.argsort``, a stable radix sort, for any k). Both are stable, so they
    give the same order and bit-identical sums. ``TSM_KMEANS_UPDATE=count|radix``
    forces one (count only where k <= SORT_KMAX).

    Examples
    --------
    >>> from tsm_core.kmeans import configs
    >>> configs.sort_method(1024), configs.sort_method(65536)
    ('count', 'radix')
    """
    forced = update_switch()
    if forced == "radix" or k > SORT_KMAX:
        return "radix"
    return "count"


def sort_rows_per_warp(k: int) -> int:
    """Rows per warp of the counting sort: at least SORT_RW and at least k (rounded
    up to 32), so that its counts, k per block of SORT_WB warps (k * ceil(n / (RW *
    SORT_WB)) ints, written, scanned and read twice), stay below n / SORT_WB + k."""
    return max(SORT_RW, -(-k // 32) * 32)


def partials_config(d: int, dtype, vec: int) -> tuple:
    """(VEC, LPR, nslices) of kmeans_partials: lanes per row LPR, the smallest of
    PARTIALS_LPR that covers d with VEC-wide loads (the rest of the warp's lanes take
    other rows: 32 / LPR rows per step), and d-slices of LPR*VEC columns.

    Examples
    --------
    >>> from tsm_core.kmeans import configs
    >>> configs.partials_config(64, "float32", 4), configs.partials_config(4096, "bfloat16", 8)
    ((4, 16, 1), (8, 32, 16))
    """
    need = -(-d // vec)
    lpr = next((p for p in PARTIALS_LPR if p >= need), PARTIALS_LPR[-1])
    return vec, lpr, -(-d // (lpr * vec))


def partials_name(dtype, vec: int, lpr: int = 32) -> str:
    return f"kmeans_partials<{x_ctype(dtype)}, {vec}, {lpr}, {PIECE}>"


def update_names(dtype) -> list:
    """Every centroid-update instantiation for X of type `dtype` (any of X_TYPES)."""
    c = x_ctype(dtype)
    acc = "double" if x_type(dtype) == "float64" else "float"
    vecs = [v for v in (8, 4, 2, 1) if v * x_itemsize(dtype) <= 16]
    names = {f"kmeans_row_sqnorm<{c}>", f"kmeans_finalize<{acc}>"}
    for vec in vecs:
        for lpr in PARTIALS_LPR:
            names.add(partials_name(dtype, vec, lpr))
        for k in (1, 16, 64, 200):
            cfg = direct_config(k, 4096, dtype, vec)
            if cfg is not None:
                names |= {f"kmeans_sums_direct<{c}, {cfg[0]}, {cfg[1]}, {lpr}>" for lpr in PARTIALS_LPR}
    if x_type(dtype) != "float64":
        for lpr in PARTIALS_LPR:
            for k in range(1, PACKED_KP[-1] + 1):
                cfg = packed_config(k, lpr * 16 // x_itemsize(dtype), dtype)
                if cfg is not None:
                    names.add(packed_name(cfg, dtype))
    names |= {f"kmeans_offsets<{PIECE}>", f"kmeans_pieces<{PIECE}>", "kmeans_bounds", "kmeans_reduce<double>",
              "kmeans_reduce_rb<double>", f"kmeans_hist<{SORT_WB}>", f"kmeans_scatter<{SORT_WB}>",
              "kmeans_status<256>"}
    return sorted(names)

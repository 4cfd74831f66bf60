"""Planning of the tiled GEMM and of Strassen's algorithm: pure functions of shapes,
layouts and the SM count (no launch, no GPU).

- ``plan_plain``: which plain kernel (gemm_tiled 128 x 128, its wide 128 x 256 form,
  or gemm_async 64 x 64) by a wave model;
- ``plan_peel``: the last partial tile row and column left to TSM2R strips;
- ``plan_tail_split``: the split-K tail of a partial last wave;
- Strassen: the seven products (``products``, two levels as their Kronecker
  product), their rounds of disjoint destinations (``schedule``), the descriptors
  the fused kernels read (``plan_strassen``, ``plan_strassen1_scratch``,
  ``_hybrid2_plan``), and the same schedule executed with numpy (``_strassen_cpu``).
"""

from __future__ import annotations

import functools

from tsm_core.tiled import configs


def plan_tail_split(tiles, slots, k, bk):
    """(t1, S): tiles [0, t1) run whole; the others (those of the last, partial
    wave) each run as S blocks over k-ranges, whose sums a second kernel adds.

    A last wave of r tiles on `slots` block slots takes a whole wave's time for r /
    slots of the work; split S ways it takes ceil(S r / slots) / S of a wave, plus the
    partial sums' traffic (SPLIT_REDUCE_COST). S is
    the one of 2 .. SPLIT_MAX that makes this smallest, used where it saves at least
    SPLIT_MIN_GAIN of the whole time (N = 3072, gemm_tiled: 576 tiles on 264 slots,
    the 48 of the third wave split 4 ways: 2.25 waves instead of 3, measured 0.71 ->
    0.90 of cuBLAS; the planner now takes the wide tile split 5 ways there, 0.96). A problem of at most half a wave is split whole (N = 1024:
    64 tiles as 256 blocks of a quarter of k)."""
    full, rem = divmod(tiles, slots)
    if rem == 0 or (full == 0 and 2 * rem > slots):
        return tiles, 1
    best, best_s = 1.0, 1
    for S in range(2, configs.SPLIT_MAX + 1):
        if k < configs.SPLIT_MIN_KTILES * bk * S:
            break
        c = -(-S * rem // slots) / S + configs.SPLIT_REDUCE_COST * S * rem / slots
        if c < best - 0.005:  # ties go to fewer ranges (less memory)
            best, best_s = c, S
    if best_s == 1 or (1 - best) / (full + 1) < configs.SPLIT_MIN_GAIN:
        return tiles, 1
    return full * slots, best_s


def plan_plain(m, n, item, sms=132, k=None):
    """("tiled", None), ("wide", None) or ("async", AsyncConfig): the plain GEMM
    kernel for (m, n).

    Each tile is costed on the part of C it will cover after ``plan_peel`` (the
    peeled strips cost about the same for both), and, given k, with the split-K
    tail ``plan_tail_split`` would give gemm_tiled's tiles."""
    if item != 4:
        return "tiled", None

    def cost(bm, bn, eff, occ=None, bk=8):
        pm, pn = plan_peel(m, n, item, (bm, bn))
        blocks = -(-(m - pm) // bm) * -(-(n - pn) // bn)
        per_sm = -(-blocks // sms)
        if occ and k:
            t1, S = plan_tail_split(blocks, sms * occ, k, bk)
            if S > 1:
                per_sm = t1 // sms + -(-S * (blocks - t1) // sms) / S
        return per_sm * bm * bn / eff

    c = configs.SMALL_TILE
    wide_bk = 16 if k and k >= configs.WIDE_BK16_MIN_K else 8
    costs = [(cost(*configs.TILE[item], configs.TILE_EFF["tiled"], configs.PLAIN_OCC), ("tiled", None)),
             (cost(*configs.WIDE_TILE, configs.TILE_EFF["wide"], configs.WIDE_OCC, wide_bk), ("wide", None)),
             (cost(c.bm, c.bn, configs.TILE_EFF["async64"]), ("async", c))]
    return min(costs, key=lambda x: x[0])[1]


def plan_peel(m, n, item, tile=None):
    """(pm, pn): rows and columns of C that the tile kernel (``tile`` = (BM, BN),
    gemm_tiled's by default) leaves to TSM2R strips.

    A last partial tile row with r <= BM / 8 rows costs a whole tile row of FFMAs
    for r rows of results, and on a GPU with S tile slots it can add a wave: N = 2049
    is 17 x 17 = 289 tiles on 264 slots (two waves, the second 9% full) where 2048
    is 256 (one wave). Those r rows are a tall-and-skinny product instead, C[m - r:]^T
    = B^T A[m - r:]^T, which TSM2R runs at memory speed (it reads B once), as it does
    the r last columns, A B[:, n - r:]. Cost: about one read of A and of B.
    """
    bm, bn = tile or configs.TILE[item]
    rm, rn = m % bm, n % bn
    pm = rm if m > bm and rm <= bm // configs.PEEL_FRACTION else 0
    pn = rn if n > bn and rn <= bn // configs.PEEL_FRACTION else 0
    return pm, pn


def _tile_of(kind, cfg, item):
    return {"tiled": configs.TILE[item], "wide": configs.WIDE_TILE}.get(kind) or (cfg.bm, cfg.bn)


def pipe_fused_ok(item, a_k, b_k, sig):
    """True if gemm_pipe runs a fused product of signature (NA, NB, NC) on operands
    of this layout: float32, at most two terms per operand, and B contiguous along n
    (with B contiguous along k, the register stage of its two terms makes ptxas spill
    8-48 bytes; those products stay on gemm_tiled)."""
    return item == 4 and configs.USE_PIPE and not b_k and max(sig[:2]) <= 2


# Strassen's seven products (the paper's Eq. 1): (A terms, B terms, C terms), each a
# list of (coefficient, (row block, column block)).
_S1 = (
    ([(1, (0, 0)), (1, (1, 1))], [(1, (0, 0)), (1, (1, 1))], [(1, (0, 0)), (1, (1, 1))]),
    ([(1, (1, 0)), (1, (1, 1))], [(1, (0, 0))], [(1, (1, 0)), (-1, (1, 1))]),
    ([(1, (0, 0))], [(1, (0, 1)), (-1, (1, 1))], [(1, (0, 1)), (1, (1, 1))]),
    ([(1, (1, 1))], [(1, (1, 0)), (-1, (0, 0))], [(1, (0, 0)), (1, (1, 0))]),
    ([(1, (0, 0)), (1, (0, 1))], [(1, (1, 1))], [(-1, (0, 0)), (1, (0, 1))]),
    ([(1, (1, 0)), (-1, (0, 0))], [(1, (0, 0)), (1, (0, 1))], [(1, (1, 1))]),
    ([(1, (0, 1)), (-1, (1, 1))], [(1, (1, 0)), (1, (1, 1))], [(1, (0, 0))]),
)


def _kron(outer, inner):
    """Terms of a two-level product: block (2i + i', 2j + j'), coefficient c * c'."""
    return [(c * d, (2 * i + p, 2 * j + q)) for c, (i, j) in outer for d, (p, q) in inner]


@functools.lru_cache(maxsize=None)
def products(levels: int):
    """The 7**levels products, each (A terms, B terms, C terms) over a
    2**levels x 2**levels grid of blocks."""
    if levels == 1:
        return _S1
    prev = products(levels - 1)
    return tuple(tuple(_kron(o, i) for o, i in zip(po, pi)) for po in prev for pi in _S1)


@functools.lru_cache(maxsize=None)
def schedule(levels: int):
    """Rounds of products whose C blocks are disjoint, in execution order, and for
    each product the mask of its C terms that are the first write of their block.

    Returns a tuple of rounds; a round is a tuple of (product index, first mask).
    """
    rounds: list[list[int]] = []
    used: list[set] = []
    for p, (_, _, cs) in enumerate(products(levels)):
        dest = {blk for _, blk in cs}
        for r, u in enumerate(used):
            if not (u & dest):
                rounds[r].append(p)
                u |= dest
                break
        else:
            rounds.append([p])
            used.append(set(dest))
    written: set = set()
    out = []
    for rnd in rounds:
        items = []
        for p in rnd:
            cs = products(levels)[p][2]
            mask = 0
            for t, (_, blk) in enumerate(cs):
                if blk not in written:
                    mask |= 1 << t
            items.append((p, mask))
        for p in rnd:
            written |= {blk for _, blk in products(levels)[p][2]}
        out.append(tuple(items))
    return tuple(out)


def _descriptor(prod, mask, sa, sb, sc, bs):
    """One product's descriptor (tiled/gemm.cu DESC_LEN layout): element offsets
    of its blocks in A, B, C given element strides sa, sb, sc and block sizes
    bs = (ms, ks, ns)."""
    ms, ks, ns = bs
    at, bt, ct = prod
    d = [0] * configs.DESC_LEN
    for t, (c, (i, j)) in enumerate(at):
        d[t] = i * ms * sa[0] + j * ks * sa[1]
        d[12 + t] = c
    for t, (c, (i, j)) in enumerate(bt):
        d[4 + t] = i * ks * sb[0] + j * ns * sb[1]
        d[16 + t] = c
    for t, (c, (i, j)) in enumerate(ct):
        d[8 + t] = i * ms * sc[0] + j * ns * sc[1]
        d[20 + t] = c
    d[24] = mask
    return d


def plan_strassen(levels, bs, sa, sb, sc, vec):
    """The launches of a fused Strassen: a list of (signature, descriptors, vec ok),
    signature = (NA, NB, NC), in execution order."""
    launches = []
    for rnd in schedule(levels):
        groups: dict = {}
        for p, mask in rnd:
            prod = products(levels)[p]
            sig = tuple(len(x) for x in prod)
            groups.setdefault(sig, []).append(_descriptor(prod, mask, sa, sb, sc, bs))
        for sig, descs in groups.items():
            va = all(o % vec == 0 for d in descs for o in d[0:sig[0]])
            vb = all(o % vec == 0 for d in descs for o in d[4:4 + sig[1]])
            launches.append((sig, descs, va, vb))
    return launches


@functools.lru_cache(maxsize=None)
def plan_strassen1_scratch(bs, sa, sb, sc, vec):
    """One level with C as scratch (SCRATCH1_ROUNDS): (sums, launches). sums: (B
    terms, C block) to form first, into the block's first ks rows; launches: (signature,
    descriptors, vec ok A, vec ok B, B read from C) in execution order, descriptors as
    `_descriptor`'s, with the B offset of a product in SCRATCH1_B an offset into C."""
    ms, ks, ns = bs
    written: set = set()
    sums, launches = [], []
    for rnd in configs.SCRATCH1_ROUNDS:
        groups: dict = {}
        for p in rnd:
            at, bt, ct = products(1)[p]
            mask = 0
            for t, (_, blk) in enumerate(ct):
                if blk not in written:
                    mask |= 1 << t
            in_c = p in configs.SCRATCH1_B
            if in_c:
                i, j = configs.SCRATCH1_B[p]
                sums.append((bt, (i, j)))
                d = _descriptor((at, [(1, (0, 0))], ct), mask, sa, sb, sc, bs)
                d[4] = i * ms * sc[0] + j * ns * sc[1]
                sig = (len(at), 1, len(ct))
            else:
                d = _descriptor((at, bt, ct), mask, sa, sb, sc, bs)
                sig = (len(at), len(bt), len(ct))
            groups.setdefault((sig, in_c), []).append(d)
        for p in rnd:
            written |= {blk for _, blk in products(1)[p][2]}
        for (sig, in_c), descs in groups.items():
            va = all(o % vec == 0 for d in descs for o in d[0:sig[0]])
            vb = all(o % vec == 0 for d in descs for o in d[4:4 + sig[1]])
            launches.append((sig, tuple(tuple(d) for d in descs), va, vb, in_c))
    return tuple(sums), tuple(launches)


def _strassen_cpu(A, B, C, levels):
    """The fused schedule executed with numpy (same products, order and first-write
    rule as the GPU), for C[:m', :n'] with every dimension a multiple of 2**levels."""
    m, k = A.shape
    n = B.shape[1]
    f = 1 << levels
    ms, ks, ns = m // f, k // f, n // f

    def blk(X, i, j, r, c):
        return X[i * r:(i + 1) * r, j * c:(j + 1) * c]

    for rnd in schedule(levels):
        for p, mask in rnd:
            at, bt, ct = products(levels)[p]
            X = sum(c * blk(A, i, j, ms, ks) for c, (i, j) in at)
            Y = sum(c * blk(B, i, j, ks, ns) for c, (i, j) in bt)
            Mp = X @ Y
            for t, (c, (i, j)) in enumerate(ct):
                D = blk(C, i, j, ms, ns)
                if (mask >> t) & 1:
                    D[...] = c * Mp
                else:
                    D += c * Mp


@functools.lru_cache(maxsize=None)
def _hybrid2_plan(bs, sc):
    """(NC, descriptor) of each of the 49 bottom-level products, in execution order
    (top-level product i, then its bottom-level product j): the C blocks of
    products(2)[7 i + j], their coefficients and first-write mask, as element offsets
    for block size bs = (ms, ks, ns) and C strides sc."""
    written: set = set()
    out = []
    for prod in products(2):
        cs = prod[2]
        mask = 0
        for t, (_, blk) in enumerate(cs):
            if blk not in written:
                mask |= 1 << t
        written |= {blk for _, blk in cs}
        d = _descriptor(([(1, (0, 0))], [(1, (0, 0))], cs), mask, (0, 0), (0, 0), sc, bs)
        out.append((len(cs), d))
    return tuple(out)


# ------------------------------------------------------------------ strassen(levels="auto")
#
# The default number of Strassen levels: a model fitted to measurements, never a
# level they show losing. Measured on the H100 (sm_90, 132 SMs) on 2026-11-24 by
# ``python -m tsm_core.bench strassen`` (benchmarks/results/h100/strassen.json,
# commit c449710): square float32 products, C-ordered, TF32 off; each number is
# cuBLAS's time over ``strassen(levels=L)``'s (CUDA-event medians, same run).
# The same run at N = 8191 (leading dimensions not 16-byte aligned, so no vector
# loads) gave 0.65x / 0.50x: unaligned operands are never given Strassen.
STRASSEN_MEASURED = {
    1: ((1024, 0.183), (2048, 0.513), (4096, 1.037), (6144, 1.065), (8192, 1.076),
        (12288, 1.122), (16384, 1.054)),
    2: ((1024, 0.055), (2048, 0.148), (4096, 0.518), (6144, 0.496), (8192, 1.172),
        (12288, 1.212), (16384, 1.203)),
}
# A level is taken only where its predicted speedup is at least this: cuBLAS moves
# about 2% between runs, one level at 16384 measured 1.054x and at 4096 1.037x
# (left to cuBLAS). Two levels are taken over one where predicted at least as fast.
STRASSEN_MIN_GAIN = 1.05
# Peeled strips (sizes not multiples of 2**levels * 4) run on the plain kernels at
# thin shapes: charged at this many times cuBLAS's time for their FLOPs.
STRASSEN_PEEL_COST = 4.0
# The measurements hold for the products on gemm_ws (compute capability 9.0 only)
# with these switches as they were measured (configs: WS_STRASSEN, SCRATCH1, HYBRID2).
STRASSEN_CC = 90


def _measured_speedup(levels, s):
    """cuBLAS time / Strassen time at effective size s, from STRASSEN_MEASURED:
    the measured value at a measured size, the smaller of the two neighbours between
    two (no interpolation across the cliffs at 4096-8192), the last one above the
    largest, 0 below the smallest (not measured; smaller sizes lose more)."""
    pts = STRASSEN_MEASURED[levels]
    if s < pts[0][0]:
        return 0.0
    for (s0, r0), (s1, r1) in zip(pts, pts[1:]):
        if s == s0:
            return r0
        if s0 < s < s1:
            return min(r0, r1)
    return pts[-1][1]


def strassen_speedup(levels, m, k, n):
    """Predicted speedup over cuBLAS of ``strassen(levels=levels)`` on an aligned,
    row-major float32 (m, k) x (k, n) product on the H100.

    The core of the product (each size rounded down to a multiple of 2**levels * 4)
    is predicted as a square product of its smallest side (``_measured_speedup``):
    a conservative stand-in, since a longer m or n only adds tiles to each of the 7**L
    products (fuller waves) and makes the operand sums a smaller share
    ((mk + kn) / mkn), while the shortest side bounds the k-blocks and the C
    epilogue's share exactly as in the square. The peeled rest is charged at
    STRASSEN_PEEL_COST times cuBLAS's time for its FLOPs (or the core's rate where
    that is lower).

    >>> round(strassen_speedup(2, 16384, 16384, 16384), 3), strassen_speedup(1, 1000, 4096, 4096)
    (1.203, 0.0)
    """
    f = (1 << levels) * configs.VEC[4]
    m2, k2, n2 = m - m % f, k - k % f, n - n % f
    if min(m2, k2, n2) == 0:
        return 0.0
    r = _measured_speedup(levels, min(m2, k2, n2))
    if r <= 0.0:
        return 0.0
    core = (m2 * k2 * n2) / (m * k * n)
    return 1.0 / (core / r + (1.0 - core) * max(STRASSEN_PEEL_COST, 1.0 / r))


def strassen_levels(m, k, n, itemsize, *, cc=STRASSEN_CC, aligned=True):
    """Levels of Strassen that ``strassen(levels="auto")`` runs: 0 (cuBLAS), 1 or 2.

    0 unless the product is float32 (float64 products run on the FP64 SIMT units,
    cuBLAS's DGEMM on the FP64 tensor cores: several times faster), on compute
    capability 9.0, with row-major, 16-byte aligned operands (``aligned``: what was
    measured) and the measured switches on, and a level is predicted at least
    STRASSEN_MIN_GAIN faster than cuBLAS (``strassen_speedup``); then the faster
    predicted level, two where they tie.

    Parameters
    ----------
    m, k, n : int
        A is (m, k), B (k, n).
    itemsize : int
        4 (float32) or 8 (float64).
    cc : int
        The device's compute capability as 10 * major + minor.
    aligned : bool
        A, B (and out) row-major with 16-byte aligned rows and base pointers.

    Returns
    -------
    int
        0, 1 or 2.

    Examples
    --------
    >>> from tsm_core.tiled.plan import strassen_levels
    >>> [strassen_levels(N, N, N, 4) for N in (1024, 4096, 6144, 8192, 16384)]
    [0, 0, 1, 2, 2]
    >>> strassen_levels(16384, 16384, 16384, 8), strassen_levels(8191, 8191, 8191, 4, aligned=False)
    (0, 0)
    """
    if itemsize != 4 or cc != STRASSEN_CC or not aligned or not configs.WS_STRASSEN:
        return 0
    best, best_r = 0, STRASSEN_MIN_GAIN
    for levels, on in ((1, configs.SCRATCH1), (2, configs.HYBRID2)):
        r = strassen_speedup(levels, m, k, n) if on else 0.0
        if r >= best_r:
            best, best_r = levels, r
    return best

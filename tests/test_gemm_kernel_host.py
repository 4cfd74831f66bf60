"""gemm.cu's kernels themselves, run on the CPU: the CUDA source compiled as C++ with
a small shim (one std::thread per CUDA thread, __syncthreads as a std::barrier,
__shared__ arrays as per-instantiation statics, blocks one after another), loaded
with ctypes. This checks gemm_tiled's index arithmetic where no GPU is at hand: tile
edges (rows and columns past the matrix read from its last one, vectors that end
in a leading dimension's padding, the guarded path of operands without vectors),
every operand layout, both tile widths, the split-K tail and its reduction, one
level of fused Strassen products (operand sums, signs, first writes), the cp.async
kernel and the realigned copy. Needs g++ (C++20).
"""

import ctypes
import shutil

import _host_build
import numpy as np
import pytest

from tsm_core.runtime import compile as _compile


from tsm_core.tiled import configs as _configs, kernels as _kernels, plan as _plan

if shutil.which("g++") is None:
    pytest.skip("g++ not found", allow_module_level=True)

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#define TSM_HOST_BUILD 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  /* one object per instantiation; blocks run one at a time */
#define __restrict__
#define __host__
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(8) float2 { float x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
template <typename T> inline T __ldg(const T* p) { return *p; }
// What common.cuh's helpers use (the copies, the 3xTF32 split): on the host,
// cp_async is a synchronous copy and the shared-memory address is never taken.
template <typename T> inline T __ldcs(const T* p) { return *p; }
inline unsigned long long __cvta_generic_to_shared(const void*) { return 0; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
alignas(16) static unsigned char g_dyn[256 * 1024];
inline unsigned char* tsm_host_dyn_smem() { return g_dyn; }
using std::fma;
using std::max;
using std::min;
"""

# (dtype, A_K, B_K, VA, VB, wn, split): the gemm_tiled variants run here. wn = 4 is
# the 128 x 256 float tile; split the split-K tail's variant.
TILED = [
    (np.float32, True, False, True, True, 2, False),
    (np.float32, True, False, True, True, 4, False),
    (np.float32, False, True, True, True, 2, False),
    (np.float32, False, False, True, True, 4, False),
    (np.float32, True, True, False, False, 2, False),
    (np.float32, True, False, True, False, 2, False),  # one operand without vectors
    (np.float32, True, False, True, True, 2, True),
    (np.float64, True, False, True, True, 2, False),
    (np.float64, False, False, False, False, 2, False),
]
ASYNC = [(np.float32, True, False, True, True), (np.float32, False, True, False, False)]
# gemm_pipe variants (A_K, B_K, BK, STAGES): every layout, both k-depths.
PIPE = [(True, False, 16, 3, False), (False, True, 16, 3, False), (False, False, 8, 4, False),
        (True, True, 16, 2, False), (True, False, 16, 4, True), (False, True, 16, 3, True),
        (False, False, 8, 3, True)]
# gemm_pipe's fused products (A_K, B_K, NA, NB, NC): C-ordered (A along k, B along n)
# and F-ordered operands (A along m, B along k), so that each operand's two terms go
# once through the register path and once through the cp.async one.
FUSED_PIPE = [(a_k, not a_k, na, nb, nc) for a_k in (True, False)
              for na, nb, nc in ((1, 2, 2), (2, 1, 2), (2, 2, 1), (2, 2, 2))]
# ... in both schedules (barrier at the end of a k-tile, or half-way: MIDBAR).
PIPE_CFGS = {"end": _configs.PipeConfig(), "mid": _configs.PipeConfig(stages=4, midbar=True)}
# The fused Strassen products of one level, C-ordered float32: (NA, NB, NC, VA, VB).
FUSED = [(na, nb, nc, v, v) for v in (True, False)
         for na, nb, nc in ((1, 2, 2), (2, 1, 2), (2, 2, 1), (2, 2, 2))]


def _ct(dtype):
    return "float" if dtype == np.float32 else "double"


def _tiled_name(v):
    dtype, a_k, b_k, va, vb, wn, split = v
    return _kernels.gemm_name(dtype, a_k, b_k, va, vb, wn=wn, split=split)


def _async_name(v):
    dtype, a_k, b_k, va, vb = v
    return _kernels.async_name(dtype, a_k, b_k, va, vb, _configs.SMALL_TILE)


def _driver() -> str:
    """extern "C" runners: tiled_<i>, async_<i>, fused_<i> launch a grid of 256-thread
    blocks (_host_build.RUN_BLOCKS); reduce_<t> and realign_<t> run their grid-stride kernels as
    one thread."""
    out = []
    for i, v in enumerate(TILED):
        T = _ct(v[0])
        out.append(f"""
extern "C" void tiled_{i}(const {T}* A, const {T}* B, {T}* C, int M, int N, int K, long long lda,
                          long long ldb, long long rsc, long long csc, {T} alpha, {T} beta,
                          int tile0, int ksplit, int kchunk, {T}* W, int grid) {{
    run_blocks(grid, 1, 256, [=] {{
        {_tiled_name(v)}(A, B, C, M, N, K, lda, ldb, rsc, csc, alpha, beta, nullptr, tile0,
                         ksplit, kchunk, W);
    }});
}}""")
    for i, v in enumerate(ASYNC):
        T = _ct(v[0])
        out.append(f"""
extern "C" void async_{i}(const {T}* A, const {T}* B, {T}* C, int M, int N, int K, long long lda,
                          long long ldb, long long rsc, long long csc, {T} alpha, {T} beta,
                          int grid) {{
    run_blocks(grid, 1, 256, [=] {{
        {_async_name(v)}(A, B, C, M, N, K, lda, ldb, rsc, csc, alpha, beta);
    }});
}}""")
    for i, (a_k, b_k, bk, st, mid) in enumerate(PIPE):
        name = _kernels.pipe_name(a_k, b_k, _configs.PipeConfig(bk, st, midbar=mid))
        out.append(f"""
extern "C" void pipe_{i}(const float* A, const float* B, float* C, int M, int N, int K,
                         long long lda, long long ldb, long long rsc, long long csc, float alpha,
                         float beta, int grid) {{
    run_blocks(grid, 1, 256, [=] {{
        {name}(A, B, C, M, N, K, lda, ldb, rsc, csc, alpha, beta, nullptr);
    }});
}}""")
    for i, ((a_k, b_k, na, nb, nc), cfg) in enumerate(
            (f, c) for c in PIPE_CFGS.values() for f in FUSED_PIPE):
        name = _kernels.pipe_name(a_k, b_k, cfg, na, nb, nc, fused=True)
        out.append(f"""
extern "C" void fusedpipe_{i}(const float* A, const float* B, float* C, int M, int N, int K,
                              long long lda, long long ldb, long long rsc, long long csc,
                              const long long* desc, int grid, int nz) {{
    run_blocks(grid, nz, 256, [=] {{
        {name}(A, B, C, M, N, K, lda, ldb, rsc, csc, 1.0f, 0.0f, desc);
    }});
}}""")
    for i, (na, nb, nc, va, vb) in enumerate(FUSED):
        name = _kernels.gemm_name(np.float32, True, False, va, vb, None, na, nb, nc, fused=True)
        out.append(f"""
extern "C" void fused_{i}(const float* A, const float* B, float* C, int M, int N, int K,
                          long long lda, long long ldb, long long rsc, long long csc,
                          const long long* desc, int grid, int nz) {{
    run_blocks(grid, nz, 256, [=] {{
        {name}(A, B, C, M, N, K, lda, ldb, rsc, csc, 1.0f, 0.0f, desc, 0, 1, K, nullptr);
    }});
}}""")
    for T in ("float", "double"):
        bm, bn = _configs.TILE[4 if T == "float" else 8]
        out.append(f"""
extern "C" void reduce_{T}(const {T}* W, int S, int tile0, int ntiles, {T}* C, int M, int N,
                           long long rsc, long long csc, {T} alpha, {T} beta) {{
    threadIdx.x = 0; blockIdx.x = 0; blockDim.x = 1; gridDim.x = 1;
    gemm_splitk_reduce<{T}, {bm}, {bn}>(W, S, tile0, ntiles, C, M, N, rsc, csc, alpha, beta);
}}
extern "C" void realign_{T}(const {T}* X, long long ldx, {T}* Y, long long ldy, int rows,
                            int cols) {{
    blockDim.x = 1; gridDim.x = 1; gridDim.y = 1; blockIdx.y = 0;
    for (long long g = 0; g * {16 // (4 if T == "float" else 8)} < ldy; ++g) {{
        blockIdx.x = (unsigned)g; threadIdx.x = 0;
        realign_copy<{T}>(X, ldx, Y, ldy, rows, cols);
    }}
}}""")
    return "\n".join(out)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = _host_build.build(tmp_path_factory.mktemp("gemmhost"), "gemm_host",
                           SHIM + _host_build.RUN_BLOCKS, _compile.source("gemm") + _driver())
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    for name, variants, kind in (("tiled", TILED, "tiled"), ("async", ASYNC, "async")):
        for n, v in enumerate(variants):
            T = _ctype(v[0])
            head = [p, p, p, i, i, i, ll, ll, ll, ll, T, T]
            getattr(so, f"{name}_{n}").argtypes = (
                head + [i, i, i, p, i] if kind == "tiled" else head + [i])
    for n in range(len(PIPE)):
        getattr(so, f"pipe_{n}").argtypes = [p, p, p, i, i, i, ll, ll, ll, ll, ctypes.c_float,
                                             ctypes.c_float, i]
    for n in range(len(FUSED)):
        getattr(so, f"fused_{n}").argtypes = [p, p, p, i, i, i, ll, ll, ll, ll, p, i, i]
    for n in range(len(FUSED_PIPE) * len(PIPE_CFGS)):
        getattr(so, f"fusedpipe_{n}").argtypes = [p, p, p, i, i, i, ll, ll, ll, ll, p, i, i]
    for dtype in (np.float32, np.float64):
        T = _ctype(dtype)
        getattr(so, f"reduce_{_ct(dtype)}").argtypes = [p, i, i, i, p, i, i, ll, ll, T, T]
        getattr(so, f"realign_{_ct(dtype)}").argtypes = [p, ll, p, ll, i, i]
    return so


def _ctype(dtype):
    return ctypes.c_float if dtype == np.float32 else ctypes.c_double


def _ptr(a):
    return ctypes.c_void_p(a.ctypes.data)


def _operand(rng, rows, cols, contiguous_rows, ld, dtype, fill=np.nan):
    """A (rows, cols) operand inside a NaN-filled parent: contiguous along its rows
    (row-major, ld >= cols) or along its columns (ld >= rows). Returns (view, parent)."""
    if contiguous_rows:
        parent = np.full((rows, ld), fill, dtype=dtype)
        view = parent[:, :cols]
    else:
        parent = np.full((cols, ld), fill, dtype=dtype).T
        view = parent[:rows, :]
    view[...] = rng.standard_normal((rows, cols)).astype(dtype)
    return view, parent


def _bound(A, B, dtype):
    k = A.shape[1]
    u = np.finfo(dtype).eps / 2
    return ((k + 3) * u / (1 - (k + 3) * u)) * (np.abs(A) @ np.abs(B)) * (1 + 1e-6) + 1e-300


def _ld(n, v, aligned):
    """A leading dimension of at least n: a multiple of v plus v (aligned), or odd."""
    return -(-n // v) * v + v if aligned else n + (2 if n % 2 else 1)


@pytest.mark.parametrize("shape", [(131, 45, 257), (1, 37, 5), (200, 19, 3), (64, 16, 64)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("vi", range(len(TILED)),
                         ids=lambda i: "{}-A{}B{}-v{}{}-wn{}{}".format(
                             _ct(TILED[i][0]), "k" if TILED[i][1] else "m",
                             "k" if TILED[i][2] else "n", int(TILED[i][3]), int(TILED[i][4]),
                             TILED[i][5], "-split" if TILED[i][6] else ""))
def test_tiled_on_host(lib, rng, vi, shape):
    """gemm_tiled on operands inside NaN-filled parents: a value read from past the
    matrix along k, or a row or column past it that reaches a stored result, shows
    as NaN. beta = 0 with C poisoned (never read), then alpha and beta on a C that
    is itself a view with an odd row stride."""
    dtype, a_k, b_k, va, vb, wn, split = TILED[vi]
    m, k, n = shape
    v = 16 // np.dtype(dtype).itemsize
    T = _ctype(dtype)
    # A contiguous along k is row-major (rows of k); else column-major (columns of m).
    A, pa = _operand(rng, m, k, a_k, _ld(k if a_k else m, v, va), dtype)
    # B contiguous along k is column-major (columns of k); else row-major (rows of n).
    B, pb = _operand(rng, k, n, not b_k, _ld(k if b_k else n, v, vb), dtype)
    lda = pa.shape[1] if a_k else pa.shape[0]
    ldb = pb.shape[0] if b_k else pb.shape[1]
    bm, bn = _configs.TILE[np.dtype(dtype).itemsize]
    bn = bn * wn // 2
    tiles = -(-m // bm) * -(-n // bn)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    bnd = _bound(A.astype(np.float64), B.astype(np.float64), dtype)
    fn = getattr(lib, f"tiled_{vi}")

    # ldc = n + 4 with n % 4 == 0: the epilogue's whole-tile path, reading C (beta)
    for alpha, beta, ldc in ((1.0, 0.0, n), (1.5, -0.5, n + 1), (0.75, 2.0, n + 4)):
        C0 = rng.standard_normal((m, ldc)).astype(dtype)
        C = C0.copy()
        if beta == 0:
            C[:] = np.nan
        if split:  # tiles [0, tiles - 1) whole, the last as 3 k-ranges, then the sums
            S, t1 = 3, tiles - 1
            kchunk = -(-(-(-k // S)) // 8) * 8
            S = -(-k // kchunk)
            if t1:  # the whole tiles: the same layout's unsplit variant
                whole = getattr(lib, f"tiled_{TILED.index(TILED[vi][:-1] + (False,))}")
                whole(_ptr(A), _ptr(B), _ptr(C), m, n, k, lda, ldb, ldc, 1, T(alpha), T(beta),
                      0, 1, k, None, t1)
            W = np.full(S * bm * bn, np.nan, dtype=dtype)
            fn(_ptr(A), _ptr(B), _ptr(C), m, n, k, lda, ldb, ldc, 1, T(alpha), T(beta),
               t1, S, kchunk, _ptr(W), S)
            getattr(lib, f"reduce_{_ct(dtype)}")(_ptr(W), S, t1, 1, _ptr(C), m, n, ldc, 1,
                                                  T(alpha), T(beta))
        else:
            fn(_ptr(A), _ptr(B), _ptr(C), m, n, k, lda, ldb, ldc, 1, T(alpha), T(beta), 0, 1, k,
               None, tiles)
        want = alpha * ref + (beta * C0[:, :n].astype(np.float64) if beta else 0.0)
        lim = abs(alpha) * bnd + (abs(beta) * np.abs(C0[:, :n]) * 4 * np.finfo(dtype).eps
                                  if beta else 0.0)
        err = np.abs(C[:, :n].astype(np.float64) - want)
        bad = ~(err <= lim)
        assert not bad.any(), f"alpha={alpha} beta={beta}: {int(bad.sum())} of {bad.size} off"
        if ldc > n:  # the padding column of C is never written
            assert np.array_equal(C[:, n:], C0[:, n:]) or beta == 0 and np.isnan(C[:, n:]).all()


@pytest.mark.parametrize("vi", range(len(ASYNC)))
def test_async_on_host(lib, rng, vi):
    """gemm_async (the 64 x 64 cp.async tile) with edge blocks and a partial k-tile."""
    dtype, a_k, b_k, va, vb = ASYNC[vi]
    m, k, n = 70, 37, 131
    v = 4
    A, pa = _operand(rng, m, k, a_k, _ld(k if a_k else m, v, va), dtype, fill=0.0)
    B, pb = _operand(rng, k, n, not b_k, _ld(k if b_k else n, v, vb), dtype, fill=0.0)
    lda = pa.shape[1] if a_k else pa.shape[0]
    ldb = pb.shape[0] if b_k else pb.shape[1]
    C = np.full((m, n), np.nan, dtype=dtype)
    grid = -(-m // 64) * -(-n // 64)
    getattr(lib, f"async_{vi}")(_ptr(A), _ptr(B), _ptr(C), m, n, k, lda, ldb, n, 1,
                                ctypes.c_float(1.0), ctypes.c_float(0.0), grid)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    assert (np.abs(C - ref) <= _bound(A.astype(np.float64), B.astype(np.float64), dtype)).all()


@pytest.mark.parametrize("shape", [(131, 45, 257), (1, 37, 5), (130, 16, 259), (136, 40, 264)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("vi", range(len(PIPE)), ids=lambda i: "A{}B{}-bk{}-s{}{}".format(
    "k" if PIPE[i][0] else "m", "k" if PIPE[i][1] else "n", PIPE[i][2], PIPE[i][3],
    "-midbar" if PIPE[i][4] else ""))
def test_pipe_on_host(lib, rng, vi, shape):
    """gemm_pipe (cp.async stages for the operands contiguous along m / n, registers for
    those along k) on operands inside NaN-filled parents, edge blocks, a partial last
    k-tile and k-tiles fewer than the stages; beta = 0 on a poisoned C, then alpha and
    beta on a C with an odd row stride."""
    a_k, b_k, bk, st, _ = PIPE[vi]
    m, k, n = shape
    A, pa = _operand(rng, m, k, a_k, _ld(k if a_k else m, 4, True), np.float32)
    B, pb = _operand(rng, k, n, not b_k, _ld(k if b_k else n, 4, True), np.float32)
    lda = pa.shape[1] if a_k else pa.shape[0]
    ldb = pb.shape[0] if b_k else pb.shape[1]
    bm, bn = _configs.PIPE_TILE
    ref = A.astype(np.float64) @ B.astype(np.float64)
    bnd = _bound(A.astype(np.float64), B.astype(np.float64), np.float32)
    # ldc = n + 4 with n % 4 == 0: the epilogue's whole-tile path, reading C (beta)
    for alpha, beta, ldc in ((1.0, 0.0, n), (1.5, -0.5, n + 1), (0.75, 2.0, n + 4)):
        C0 = rng.standard_normal((m, ldc)).astype(np.float32)
        C = C0.copy()
        if beta == 0:
            C[:] = np.nan
        getattr(lib, f"pipe_{vi}")(_ptr(A), _ptr(B), _ptr(C), m, n, k, lda, ldb, ldc, 1,
                                   ctypes.c_float(alpha), ctypes.c_float(beta),
                                   -(-m // bm) * -(-n // bn))
        want = alpha * ref + (beta * C0[:, :n].astype(np.float64) if beta else 0.0)
        lim = abs(alpha) * bnd + (abs(beta) * np.abs(C0[:, :n]) * 4 * np.finfo(np.float32).eps
                                  if beta else 0.0)
        bad = ~(np.abs(C[:, :n].astype(np.float64) - want) <= lim)
        assert not bad.any(), f"alpha={alpha} beta={beta}: {int(bad.sum())} of {bad.size} off"
        if ldc > n:
            assert np.array_equal(C[:, n:], C0[:, n:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_realign_copy_on_host(lib, rng, dtype):
    """realign_copy: the values, and zeros in the padding of every row."""
    rows, cols, ldx = 5, 13, 17
    v = 16 // np.dtype(dtype).itemsize
    X = rng.standard_normal((rows, ldx)).astype(dtype)
    ldy = -(-cols // v) * v
    Y = np.full((rows, ldy), np.nan, dtype=dtype)
    getattr(lib, f"realign_{_ct(dtype)}")(_ptr(X), ldx, _ptr(Y), ldy, rows, cols)
    assert np.array_equal(Y[:, :cols], X[:, :cols]) and (Y[:, cols:] == 0).all()


def _assert_strassen_close(A, B, C):
    """C against the float64 product, within Strassen's error: a few times plain
    GEMM's bound (its sums of blocks), here 8x."""
    ref = A.astype(np.float64) @ B.astype(np.float64)
    bnd = 8 * _bound(A.astype(np.float64), B.astype(np.float64), np.float32)
    err = np.abs(C.astype(np.float64) - ref)
    assert (err <= bnd).all(), f"{int((~(err <= bnd)).sum())} of {err.size} off"


@pytest.mark.parametrize("blocks", [(132, 44, 140), (67, 23, 131)], ids=["aligned", "odd"])
def test_fused_strassen_on_host(lib, rng, blocks):
    """One level of fused Strassen (`_plan.plan_strassen`'s launches, descriptors and
    first-write masks) on C-ordered float32 operands inside NaN-filled parents: block
    sizes that are not multiples of the tile, with vectors (offsets aligned) and
    without. C starts NaN: every block's first write must store, not add."""
    ms, ks, ns = blocks
    m, k, n = 2 * ms, 2 * ks, 2 * ns
    v = 4
    A, pa = _operand(rng, m, k, True, _ld(k, v, True), np.float32)
    B, pb = _operand(rng, k, n, True, _ld(n, v, True), np.float32)
    lda, ldb = pa.shape[1], pb.shape[1]
    C = np.full((m, n), np.nan, dtype=np.float32)
    for sig, descs, va, vb in _plan.plan_strassen(1, blocks, (lda, 1), (ldb, 1), (n, 1), v):
        i = FUSED.index(sig + (va and vb,) * 2)
        d = np.ascontiguousarray(np.asarray(descs, dtype=np.int64).ravel())
        grid = -(-ms // 128) * -(-ns // 128)
        getattr(lib, f"fused_{i}")(_ptr(A), _ptr(B), _ptr(C), ms, ns, ks, lda, ldb, n, 1,
                                   _ptr(d), grid, len(descs))
    _assert_strassen_close(A, B, C)


@pytest.mark.parametrize("sched", list(PIPE_CFGS))
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("blocks", [(132, 44, 260), (64, 20, 36)], ids=["edges", "partial-k"])
def test_fused_pipe_on_host(lib, rng, blocks, order, sched):
    """One level of fused Strassen on gemm_pipe's fused products: the launches,
    descriptors and first-write masks of `_plan.plan_strassen`, operands inside
    NaN-filled parents (C- or F-ordered: each operand's second term once through
    registers, once through cp.async), edge blocks and a partial last k-tile, C
    starting NaN."""
    ms, ks, ns = blocks
    m, k, n = 2 * ms, 2 * ks, 2 * ns
    c_ord = order == "C"
    A, pa = _operand(rng, m, k, c_ord, _ld(k if c_ord else m, 4, True), np.float32)
    B, pb = _operand(rng, k, n, c_ord, _ld(n if c_ord else k, 4, True), np.float32)
    lda = pa.shape[1] if c_ord else pa.shape[0]
    ldb = pb.shape[1] if c_ord else pb.shape[0]
    sa, sb = ((lda, 1), (ldb, 1)) if c_ord else ((1, lda), (1, ldb))
    C = np.full((m, n), np.nan, dtype=np.float32)
    for sig, descs, va, vb in _plan.plan_strassen(1, blocks, sa, sb, (n, 1), 4):
        assert va and vb
        i = FUSED_PIPE.index((c_ord, not c_ord) + sig) + len(FUSED_PIPE) * list(PIPE_CFGS).index(sched)
        d = np.ascontiguousarray(np.asarray(descs, dtype=np.int64).ravel())
        grid = -(-ms // 128) * -(-ns // 256)
        getattr(lib, f"fusedpipe_{i}")(_ptr(A), _ptr(B), _ptr(C), ms, ns, ks, lda, ldb, n, 1,
                                       _ptr(d), grid, len(descs))
    _assert_strassen_close(A, B, C)

"""batched.cu's kernel itself, run on the CPU: the CUDA source compiled as C++ with a
small shim (one std::thread per CUDA thread, __syncthreads as a std::barrier from
which a retired thread drops out, __shared__ arrays as per-instantiation statics,
blocks one after another), loaded with ctypes and driven by the planner's own tile
list. This checks every tile type's index arithmetic, edge masks, both kernel
versions, both operand orders and the alpha/beta epilogue against a float64
reference where no GPU is at hand. Needs g++ (C++20).
"""

import ctypes
import shutil

import _host_build
import numpy as np
import pytest

from tsm_core.batched import api as tb
from tsm_core.batched import plan as bp
from tsm_core.runtime import compile as _compile

if shutil.which("g++") is None:
    pytest.skip("g++ not found", allow_module_level=True)

SHIM = r"""
#include <atomic>
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstring>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__  /* inlined or not: the same code on the host */
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  /* one object per instantiation; blocks run one at a time */
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) int4 { int x, y, z, w; };
static std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
// __syncthreads_or: three rotating flags; after barrier p every thread clears flag
// p + 2, last read before barrier p and next written after barrier p + 1.
static std::atomic<int> g_or[3];
thread_local int g_or_phase = 0;
inline int __syncthreads_or(int p) {
    const int ph = g_or_phase;
    g_or_phase = (ph + 1) % 3;
    if (p) g_or[ph].fetch_or(1);
    g_bar->arrive_and_wait();
    const int r = g_or[ph].load();
    g_or[(ph + 2) % 3].store(0);
    return r;
}
using std::fma;
using ::fmaf;
using ::fabsf;
// What common.cuh mentions (cp.async wrappers, vector helpers); unused here.
#define __host__
struct alignas(16) double2 { double x, y; };
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
using std::min;
inline unsigned long long __cvta_generic_to_shared(const void*) { return 0; }
inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
"""

# __any_sync for version 5's non-finite vote: per warp, three rotating flags (as
# __syncthreads_or above), over the warp barrier of the MMA shim.
ANY_SHIM = r"""
static std::atomic<int> g_anyf[8][3];
thread_local int g_anyph = 0;
inline int __any_sync(unsigned, int p) {
    const int w = threadIdx.x >> 5;
    const int ph = g_anyph;
    g_anyph = (ph + 1) % 3;
    if (p) g_anyf[w][ph].fetch_or(1);
    g_warps[w].bar->arrive_and_wait();
    const int r = g_anyf[w][ph].load();
    g_anyf[w][(ph + 2) % 3].store(0);
    return r;
}
"""

DRIVER = r"""
// Every thread of the block runs the kernel and then leaves the barrier: a thread of
// a 128-thread tile type that retired at once has left before the first barrier, so
// the barrier counts the tile's threads only (bar.sync with a count, on the GPU).
template <typename T, int V>
static void run(const long long* meta, const int4* tiles, T alpha, T beta, int grid) {
    for (int b = 0; b < grid; ++b) {
        std::barrier<> bar(256);
        g_bar = &bar;
        HostWarps warps(8);
        for (auto& f : g_or) f.store(0);
        for (auto& w : g_anyf)
            for (auto& f : w) f.store(0);
        std::vector<std::thread> ts;
        for (int t = 0; t < 256; ++t)
            ts.emplace_back([=] {
                threadIdx.x = t;
                blockIdx.x = b;
                tsm_batched_gemm<T, V>(meta, tiles, alpha, beta);
                g_bar->arrive_and_drop();
            });
        for (auto& th : ts) th.join();
    }
}
extern "C" {
void run_f0(const long long* m, const int4* t, float a, float b, int g) { run<float, 0>(m, t, a, b, g); }
void run_f1(const long long* m, const int4* t, float a, float b, int g) { run<float, 1>(m, t, a, b, g); }
void run_d0(const long long* m, const int4* t, double a, double b, int g) { run<double, 0>(m, t, a, b, g); }
void run_d1(const long long* m, const int4* t, double a, double b, int g) { run<double, 1>(m, t, a, b, g); }
void run_f2(const long long* m, const int4* t, float a, float b, int g) { run<float, 2>(m, t, a, b, g); }
void run_d2(const long long* m, const int4* t, double a, double b, int g) { run<double, 2>(m, t, a, b, g); }
void run_f3(const long long* m, const int4* t, float a, float b, int g) { run<float, 3>(m, t, a, b, g); }
void run_f4(const long long* m, const int4* t, float a, float b, int g) { run<float, 4>(m, t, a, b, g); }
void run_f5(const long long* m, const int4* t, float a, float b, int g) { run<float, 5>(m, t, a, b, g); }
}
"""

BAR_SYNC = 'asm volatile("bar.sync 1, %0;" ::"r"(NT) : "memory");'
BAR_RED_OR = 'asm volatile(TSM_BATCHED_BAR_RED_OR : "=r"(r) : "r"(pred), "r"(NT) : "memory");'


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    src = _compile.source(bp.FAMILY)
    assert BAR_SYNC in src and BAR_RED_OR in src, "the partial barriers the shim replaces have changed"
    src = src.replace(BAR_SYNC, "__syncthreads();").replace(BAR_RED_OR, "r = __syncthreads_or(pred);")
    return _host_build.build(tmp_path_factory.mktemp("batchedhost"), "batched_host",
                             SHIM + _host_build.MMA_SHIM + ANY_SHIM, src + DRIVER)


def host_batched(lib, As, Bs, Cs, alpha, beta, version, tile_type=None, splits=None,
                 counters=None):
    """Cs[i] = alpha As[i] @ Bs[i] + beta Cs[i] through the C++ build, numpy operands of
    any strides (the kernel's metadata: pointers, sizes, element strides). The tile
    list is the planner's, or every problem in `tile_type` (0-4; 5 in versions 3
    and 4, 6 in version 4) if given, its K cut into `splits` chunks (per problem)
    if given; split-K's workspace and counters as the launcher lays them out
    (`counters`, a list, receives the counter array)."""
    dtype = As[0].dtype
    item = dtype.itemsize
    shapes = [(a.shape[0], b.shape[1], a.shape[1]) for a, b in zip(As, Bs)]
    s = np.array(shapes, np.int64)
    if tile_type is None:
        plan = tb.plan_batched(shapes, dtype, version=version)
    else:
        types = np.full(len(shapes), tile_type)
        S = np.ones(len(shapes), np.int64) if splits is None else bp.settle_splits(s[:, 2], splits)
        tiles, tsplit = bp.build_tiles(s, types, S, with_split=True)
        plan = tb.BatchedPlan(shapes=s, dtype=np.dtype(dtype), types=types, tiles=tiles,
                              residency=None, threshold=0, splits=S, tile_split=tsplit)
    meta = np.zeros((len(As), bp.META_STRIDE), np.int64)
    for i, (a, b, c) in enumerate(zip(As, Bs, Cs)):
        meta[i, :3] = a.ctypes.data, b.ctypes.data, c.ctypes.data
        meta[i, 3:6] = shapes[i]
        meta[i, 6:8] = np.array(a.strides) // item
        meta[i, 8:10] = np.array(b.strides) // item
        meta[i, 10:12] = np.array(c.strides) // item
    woff, coff, nw, nc, on = plan.workspace()
    ws = np.full(max(1, nw), np.nan, dtype)  # poisoned: every element read was written
    cnt = np.zeros(max(1, nc), np.int32)
    meta[:, 12] = np.where(on, ws.ctypes.data + woff * item, 0)
    meta[:, 13] = np.where(on, cnt.ctypes.data + coff * 4, 0)
    if counters is not None:
        counters.append(cnt)
    tiles = plan.device_tiles()
    scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    fn = getattr(lib, f"run_{'f' if dtype == np.float32 else 'd'}{version}")
    fn(ctypes.c_void_p(meta.ctypes.data), ctypes.c_void_p(tiles.ctypes.data), scalar(alpha),
       scalar(beta), ctypes.c_int(len(tiles)))
    return tiles


def _operand(rng, shape, dtype, order):
    x = rng.standard_normal(shape).astype(dtype)
    if order == "F":
        return np.asfortranarray(x)
    if order == "T":  # a transposed view: unit stride along the first axis
        return np.ascontiguousarray(x.T).T
    return x


@pytest.mark.parametrize("tile_type", [0, 1, 2, 3, 4, None], ids=lambda t: f"type{t}")
@pytest.mark.parametrize("version", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["C", "F", "T"])
def test_batched_kernel_on_host(lib, version, dtype, order, tile_type, rng):
    # Each tile type forced over every problem (None: the planner's tiling), on sizes
    # with every edge: 1 x 1 x 1, K = 1, primes, one past a tile, several tiles.
    shapes = [(1, 1, 1), (17, 5, 1), (33, 31, 19), (65, 66, 17), (130, 70, 33), (16, 16, 16),
              (7, 129, 40)]
    As = [_operand(rng, (m, k), dtype, order) for m, n, k in shapes]
    Bs = [_operand(rng, (k, n), dtype, "C" if order == "T" else order) for m, n, k in shapes]
    Cs = [rng.standard_normal((m, n)).astype(dtype) for m, n, k in shapes]
    C0 = [c.copy() for c in Cs]
    alpha, beta = 0.75, -0.5
    host_batched(lib, As, Bs, Cs, alpha, beta, version, tile_type)
    tol = 2e-6 if dtype == np.float32 else 1e-13
    for a, b, c, c0 in zip(As, Bs, Cs, C0):
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0
        assert np.abs(c - ref).max() <= tol * max(1.0, np.abs(ref).max()) * a.shape[1] ** 0.5


@pytest.mark.parametrize("version,tile_type", [(3, 4), (3, 5), (3, None), (4, 5), (4, 6), (4, None),
                                               (5, 3), (5, 4), (5, 5), (5, 6), (5, None)],
                         ids=lambda x: f"{x}")
@pytest.mark.parametrize("order", ["C", "F", "T"])
def test_batched_kernel_wide_on_host(lib, order, version, tile_type, rng):
    # Versions 3 and 4's types, 128 x 64 (8 x 4 outputs a thread) and 128 x 128 (8 x 8),
    # both in two runs of rows and of columns, k steps of 8: one tile, edges in M and N
    # past it, a partial last k step, K = 1, and small problems beside them in one
    # launch. (The planner shrinks a batch this small to the small types: None checks
    # that mix, 5 and 6 the wide tiles themselves.) Version 5 (types 3 to 6 by
    # cp.async rings; K < 128 here, so 128 x 128 by FMAs): whole tiles with several
    # full slabs and a partial one, more slabs than a ring holds.
    shapes = [(128, 128, 8), (130, 70, 33), (257, 129, 17), (129, 200, 1), (1, 1, 1),
              (33, 31, 19), (140, 135, 9), (192, 128, 48), (96, 64, 100)]
    As = [_operand(rng, (m, k), np.float32, order) for m, n, k in shapes]
    Bs = [_operand(rng, (k, n), np.float32, "C" if order == "T" else order) for m, n, k in shapes]
    Cs = [rng.standard_normal((m, n)).astype(np.float32) for m, n, k in shapes]
    C0 = [c.copy() for c in Cs]
    alpha, beta = 0.75, -0.5
    host_batched(lib, As, Bs, Cs, alpha, beta, version, tile_type)
    for a, b, c, c0 in zip(As, Bs, Cs, C0):
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0
        assert (np.abs(c - ref) <= _bound(a, b, c0, alpha, beta)).all()


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_batched_kernel_beta_zero_ignores_poison(lib, version, rng):
    shapes = [(40, 24, 9), (3, 70, 5), (150, 131, 12)]
    As = [rng.standard_normal((m, k)).astype(np.float32) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(np.float32) for m, n, k in shapes]
    Cs = [np.full((m, n), np.nan, np.float32) for m, n, k in shapes]
    host_batched(lib, As, Bs, Cs, 1.0, 0.0, version)
    for a, b, c in zip(As, Bs, Cs):
        assert not np.isnan(c).any()
        assert np.abs(c - a.astype(np.float64) @ b).max() <= 1e-5 * np.abs(a @ b).max()


def _bound(a, b, c0, alpha, beta):
    """The float32 rounding bound tests/test_batched.py holds every kernel to:
    (gamma(K + 3) in float32 and float64) times |alpha| |A| |B| + |beta| |C0|."""
    k = a.shape[1]
    g = sum((k + 3) * u / (1 - (k + 3) * u) for u in (2.0**-24, 2.0**-53))
    scale = abs(alpha) * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)))
    return g * (scale + abs(beta) * np.abs(c0.astype(np.float64))) * (1 + 1e-6)


@pytest.mark.parametrize("tile_type", [2, 3, 4, None], ids=lambda t: f"type{t}")
@pytest.mark.parametrize("order", ["C", "F", "T"])
def test_batched_kernel_tensor_cores_on_host(lib, order, tile_type, rng):
    # Version 2's tensor-core path (float32 tiles of 32 rows or more, K >= TC_MIN_K), the
    # MMA emulated: edges in M, N and a partial last slab, K at the threshold and past
    # it, beside problems of smaller K that stay on the FMA path in the same launch;
    # every element within the float32 bound.
    shapes = [(65, 66, bp.TC_MIN_K), (130, 70, 131), (64, 64, 200), (7, 129, 160),
              (1, 1, 129), (70, 65, bp.TC_MIN_K - 1), (33, 31, 19)]
    As = [_operand(rng, (m, k), np.float32, order) for m, n, k in shapes]
    Bs = [_operand(rng, (k, n), np.float32, "C" if order == "T" else order) for m, n, k in shapes]
    Cs = [rng.standard_normal((m, n)).astype(np.float32) for m, n, k in shapes]
    C0 = [c.copy() for c in Cs]
    alpha, beta = 0.75, -0.5
    host_batched(lib, As, Bs, Cs, alpha, beta, 2, tile_type)
    for a, b, c, c0 in zip(As, Bs, Cs, C0):
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0
        assert (np.abs(c - ref) <= _bound(a, b, c0, alpha, beta)).all()


def _nonfinite_like_fma(lib, rng, shapes, versions, tile_type):
    """Inf in A[0] (row 5 of C[0]: +-Inf where B's row 20 is nonzero) and NaN in B[1]
    (column 7 of C[1], in the last, partial slab), both `versions` run on the same
    tiles: the tensor-core version (second) gives the FMA version's (first) Inf, NaN
    and finite pattern, its finite values within the float32 bound."""
    As = [rng.standard_normal((m, k)).astype(np.float32) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(np.float32) for m, n, k in shapes]
    As[0][5, 20] = np.inf
    Bs[1][130, 7] = np.nan
    outs = []
    for version in versions:
        Cs = [np.full((m, n), 7.0, np.float32) for m, n, k in shapes]
        host_batched(lib, As, Bs, Cs, 1.0, 0.0, version, tile_type)
        outs.append(Cs)
    for c1, c2, a, b in zip(*outs, As, Bs):
        assert np.array_equal(np.isnan(c1), np.isnan(c2)) and np.isnan(c1).any() == (a is As[1])
        assert np.array_equal(np.isinf(c1), np.isinf(c2))
        assert np.array_equal(np.sign(c1[np.isinf(c1)]), np.sign(c2[np.isinf(c2)]))
        fin = np.isfinite(c1)
        with np.errstate(invalid="ignore"):
            ref = a.astype(np.float64) @ b.astype(np.float64)
        bound = _bound(np.where(np.isfinite(a), a, 0), np.where(np.isfinite(b), b, 0),
                       np.zeros_like(c1), 1.0, 0.0)
        assert (np.abs(c2[fin] - ref[fin]) <= bound[fin]).all()
    assert np.isinf(outs[1][0][5]).all()


@pytest.mark.parametrize("tile_type", [2, 3, 4])
def test_batched_kernel_tensor_cores_nonfinite_on_host(lib, tile_type, rng):
    # Version 2: a slab holding Inf or NaN is multiplied with FMAs (block vote).
    _nonfinite_like_fma(lib, rng, [(64, 64, 160), (70, 66, 140)], (1, 2), tile_type)


@pytest.mark.parametrize("tile_type", [6, None], ids=lambda t: f"type{t}")
@pytest.mark.parametrize("order", ["C", "F", "T"])
def test_batched_kernel_tc3_on_host(lib, order, tile_type, rng):
    # Version 5's 128 x 128 tensor-core tiles (3xTF32, fragments as ldmatrix would
    # read them, the MMA emulated): K at the threshold and past it with a partial last
    # slab, edges in M and N, whole tiles with more slabs than the ring holds, and a
    # problem under the threshold on the FMA path in the same launch.
    shapes = [(128, 128, bp.TC_MIN_K), (130, 140, 131), (257, 129, 200), (60, 250, 136),
              (140, 135, bp.TC_MIN_K - 1), (1, 1, 129)]
    As = [_operand(rng, (m, k), np.float32, order) for m, n, k in shapes]
    Bs = [_operand(rng, (k, n), np.float32, "C" if order == "T" else order) for m, n, k in shapes]
    Cs = [rng.standard_normal((m, n)).astype(np.float32) for m, n, k in shapes]
    C0 = [c.copy() for c in Cs]
    alpha, beta = 0.75, -0.5
    host_batched(lib, As, Bs, Cs, alpha, beta, 5, tile_type)
    for a, b, c, c0 in zip(As, Bs, Cs, C0):
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0
        assert (np.abs(c - ref) <= _bound(a, b, c0, alpha, beta)).all()


def test_batched_kernel_tc3_nonfinite_on_host(lib, rng):
    # Version 5: a warp whose slab holds Inf or NaN multiplies it with FMAs; against
    # version 4's FMA tiles of the same type.
    _nonfinite_like_fma(lib, rng, [(128, 128, 160), (130, 140, 140)], (4, 5), 6)


@pytest.mark.parametrize("version,tile_type", [(1, 0), (1, 2), (1, 4), (3, 5), (5, 3), (5, 4),
                                               (5, 5), (5, 6)], ids=lambda x: f"{x}")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_kernel_splitk_on_host(lib, version, tile_type, dtype, rng):
    # Split-K: each problem's K cut into S chunks of multiples of 16 (the last one
    # shorter, or S lowered where a chunk would be empty), partial tiles added through
    # the workspace by the last block, in split order; alpha / beta once. Edges in M
    # and N, K from 2 chunks of 17 to 5 chunks past the tensor-core threshold (type 6
    # in version 5: 3xTF32 chunks), a problem not split beside them; the counters are
    # back at zero after the launch.
    if version != 1 and dtype == np.float64:
        pytest.skip("versions 3 and 5 are float32 only")
    shapes = [(130, 70, 33), (65, 129, 300), (1, 1, 40), (140, 135, 161), (33, 31, 19),
              (128, 128, 257)]
    splits = np.array([2, 3, 2, 5, 1, 4])
    As = [_operand(rng, (m, k), dtype, "C") for m, n, k in shapes]
    Bs = [_operand(rng, (k, n), dtype, "F") for m, n, k in shapes]
    Cs = [rng.standard_normal((m, n)).astype(dtype) for m, n, k in shapes]
    C0 = [c.copy() for c in Cs]
    alpha, beta = 0.75, -0.5
    cnt = []
    tiles = host_batched(lib, As, Bs, Cs, alpha, beta, version, tile_type, splits, cnt)
    assert (tiles[:, 3] >> 12).max() >= 2, "no tile was split"
    assert not cnt[0].any(), "split-K counters not reset"
    for a, b, c, c0 in zip(As, Bs, Cs, C0):
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0
        if dtype == np.float32:
            assert (np.abs(c - ref) <= _bound(a, b, c0, alpha, beta)).all()
        else:
            assert np.abs(c - ref).max() <= 1e-13 * max(1.0, np.abs(ref).max()) * a.shape[1] ** 0.5

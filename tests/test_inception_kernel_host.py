"""conv.cu's kernel itself, run on the CPU: the CUDA source compiled as C++ with a
small shim (one std::thread per CUDA thread, __syncthreads as a std::barrier,
__shared__ arrays as per-instantiation statics, blocks one after another), loaded
with ctypes and driven by the launcher's own descriptor tables. This checks the
kernel's index arithmetic, tile edges, gathers, double buffering and epilogue
routing against the CPU reference where no GPU is at hand. Needs g++ (C++20).
"""

import ctypes
import shutil

import _host_build
import numpy as np
import pytest

from tsm_apps.inception import InceptionBlock, Table6Set
from tsm_core.runtime import compile as _compile

from tsm_core.conv import api as _conv

if shutil.which("g++") is None:
    pytest.skip("g++ not found", allow_module_level=True)

TOL = 1e-4

SHIM = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  /* one object per instantiation; blocks run one at a time */
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
// What common.cuh (cp.async wrappers, vector helpers) mentions; unused on the host.
#define __host__
struct alignas(8) float2 { float x, y; };
struct alignas(16) double2 { double x, y; };
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
static std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline float __int_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int i) { return (float)i; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __ldcg(const float* p) { return *p; }
inline unsigned long long __cvta_generic_to_shared(const void*) { return 0; }  // unused on the host
using std::min;
using std::max;
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
// The TC tiles' dynamic shared memory (conv.cu's TSM_CONV_DYN_SMEM): one buffer,
// blocks run one at a time.
#define TSM_HOST_BUILD
alignas(16) static unsigned char g_dyn[96 * 1024];
inline unsigned char* tsm_host_dyn_smem() { return g_dyn; }
"""

DRIVER = r"""
template <int BM, int BN, int BK, int TM, int TN, int MINB, int KW = 1>
static void run(const long long* desc, int nseg, float* s0, float* s1, float* s2, float* s3,
                float* s4, int n, int H, int W, int grid) {
    run_blocks(grid, 1, (BM / TM) * (BN / TN) * KW, [=] {
        conv_gemm_relu<BM, BN, BK, TM, TN, MINB, KW>(desc, nseg, s0, s1, s2, s3, s4, n, H, W);
    });
}

// The async kernel: cp.async is a plain copy here (common.cuh's host fallback), so
// the pipeline's stage indexing, zero fills and barriers are what this checks.
template <int BM, int BN, int BK, int STAGES, int MINB>
static void run_async(const long long* desc, int nseg, float* s0, float* s1, float* s2,
                      float* s3, float* s4, int n, int H, int W, int grid) {
    run_blocks(grid, 1, 256, [=] {
        conv_gemm_relu_async<BM, BN, BK, STAGES, MINB>(desc, nseg, s0, s1, s2, s3, s4, n, H, W);
    });
}

// The tensor-core kernel: the same, with a barrier per warp for the MMA exchange
// (reused block after block: each block's threads have all left it before the next
// block starts).
template <int BM, int BN, int BK, int STAGES, int MINB>
static void run_tc(const long long* desc, int nseg, float* s0, float* s1, float* s2,
                   float* s3, float* s4, int n, int H, int W, int grid) {
    HostWarps warps(8);
    run_blocks(grid, 1, 256, [=] {
        conv_gemm_relu_tc<BM, BN, BK, STAGES, MINB>(desc, nseg, s0, s1, s2, s3, s4, n, H, W);
    });
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    src = _compile.source(_conv.FAMILY) + _host_build.RUN_BLOCKS + DRIVER
    for i, c in enumerate(_conv.CONFIGS):
        call = (f"run_{'tc' if c.tc else 'async'}<{c.bm}, {c.bn}, {c.bk}, {c.stages}, {c.minb}>"
                if c.stages else
                f"run<{c.bm}, {c.bn}, {c.bk}, {c.tm}, {c.tn}, {c.minb}, {c.kw}>")
        src += (f'extern "C" void run{i}(const long long* d, int ns, float* a, float* b, float* c, '
                f'float* e, float* f, int n, int H, int W, int g) {{ '
                f'{call}(d, ns, a, b, c, e, f, n, H, W, g); }}\n')
    return _host_build.build(tmp_path_factory.mktemp("convhost"), "conv_host",
                             SHIM + _host_build.MMA_SHIM, src)


def host_launch(lib, group, bufs, cfg, splits=None):
    """group(bufs) through the C++ build of the kernel; bufs: slot -> numpy NCHW float32.
    `splits`: K chunks per segment (default: what the launcher would choose on an H100)."""
    n, _, H, W = bufs[group.slots[0]].shape
    if splits is None:
        splits = group.choose_splits(n, H, W, cfg, 132)
    ntile = -(-(n * H * W) // cfg.bn)
    keep, ptrs = [], []
    for seg, sp in zip(group.segments, splits):
        tab = _conv.segment_table(seg, cfg, H, W)
        if tab is None:
            tab = np.zeros((1, 4), np.int32)
        sp = _conv.split_k(seg.k, cfg.bk, sp)[0]
        tiles = -(-seg.m // cfg.bm) * ntile
        ws = np.full(tiles * sp * cfg.bm * cfg.bn, np.nan, np.float32)
        cnt = np.zeros(tiles, np.int32)
        wt = _conv.layout_weights(seg, _conv.ConvGroup.weight_layout(cfg))
        if cfg.tc:
            assert _conv.tc_smem_bytes(cfg) <= 96 * 1024  # the shim's g_dyn
        keep += [wt, seg.bias, tab, ws, cnt]
        ptrs.append((wt.ctypes.data, seg.bias.ctypes.data, tab.ctypes.data,
                     ws.ctypes.data if sp > 1 else 0, cnt.ctypes.data if sp > 1 else 0))
    desc = group.descriptors(n, H, W, cfg, ptrs, splits)
    grid = group.grid_size(desc, n, H, W, cfg)
    slots = [bufs[s] for s in group.slots]
    slots += [slots[0]] * (_conv.MAX_SLOTS - len(slots))
    for a in slots:
        assert a.dtype == np.float32 and a.flags.c_contiguous
    P = ctypes.c_void_p
    fn = getattr(lib, f"run{_conv.CONFIGS.index(cfg)}")
    fn(P(desc.ctypes.data), ctypes.c_int(len(desc)), *[P(a.ctypes.data) for a in slots],
       ctypes.c_int(n), ctypes.c_int(H), ctypes.c_int(W), ctypes.c_int(grid))
    for seg_keep in keep[4::5]:  # the split-K counters are left at zero for the next launch
        assert not seg_keep.any()


def relerr(a, b):
    return np.abs(a.astype(np.float64) - b).max() / np.abs(b).max()


@pytest.mark.parametrize("splits", [1, 3], ids=["k", "splitk3"])
@pytest.mark.parametrize("shape", [(3, 5, 6), (2, 11, 13), (1, 1, 1), (3, 4, 5)], ids=str)
@pytest.mark.parametrize("cfg", _conv.CONFIGS, ids=lambda c: c.tag)
def test_kernel_on_host_small_group(lib, cfg, shape, splits, rng):
    # Every kind and edge at once, small: a 1x1 pair fused (3 parts, two slots), a
    # pooled 1x1, a 3x3, a 5x5 and a stored max-pool (five slots), odd channel counts; batches of 90 columns (tiles
    # cross images), 286 (several column tiles), a single pixel, and 60 (H*W % 4 == 0:
    # the async kernel's 16-byte 1x1 copies).
    _small_group(lib, cfg, shape, splits, rng, 13)


@pytest.mark.parametrize("splits", [1, 3], ids=["k", "splitk3"])
@pytest.mark.parametrize("shape", [(3, 5, 6), (2, 11, 13), (1, 1, 1)], ids=str)
@pytest.mark.parametrize("cfg", [c for c in _conv.CONFIGS if c.tc], ids=lambda c: c.tag)
def test_kernel_on_host_tap_major(lib, cfg, shape, splits, rng):
    # The same group on 32 input channels: its 3x3 and 5x5 run with K tap-major on
    # the tensor-core tiles (KIND_RXRT), taps outside the image at every border.
    g = _small_group(lib, cfg, shape, splits, rng, 32)
    kinds = [_conv.segment_kind(s, cfg) for s in g.segments]
    assert kinds.count(_conv.KIND_RXRT) == 2


def _small_group(lib, cfg, shape, splits, rng, cin):
    from tsm_core.conv.api import ConvSpec

    n, H, W = shape

    def wb(co, ci, r):
        return (rng.standard_normal((co, ci, r, r)).astype(np.float32),
                rng.standard_normal(co).astype(np.float32))

    specs = [ConvSpec(*wb(37, cin, 1), "x", [("y", 0, 20), ("t", 3, 17)]),
             ConvSpec(*wb(5, cin, 1), "x", ("y", 20)),
             ConvSpec(*wb(9, cin, 1), "x", ("y", 25), pool=True),
             ConvSpec(*wb(7, cin, 3), "x", ("y", 34)),
             ConvSpec(*wb(3, cin, 5), "x", ("t", 20)),
             _conv.MaxPoolSpec(cin, "x", ("p", 2))]
    g = _conv.ConvGroup(specs, channels={"t": 24, "p": cin + 3})
    x = rng.standard_normal((n, cin, H, W)).astype(np.float32)
    bufs = {"x": x, "y": np.full((n, 41, H, W), np.nan, np.float32),
            "t": np.full((n, 24, H, W), np.nan, np.float32),
            "p": np.full((n, cin + 3, H, W), np.nan, np.float32)}
    host_launch(lib, g, bufs, cfg, [splits] * len(g.segments))
    from tsm_apps.inception._block import _conv as conv_ref, _maxpool3

    x64 = x.astype(np.float64)
    ref = {s: np.full(b.shape, np.nan) for s, b in bufs.items() if s != "x"}
    for sp in specs:
        if isinstance(sp, _conv.MaxPoolSpec):
            out = _maxpool3(x64)
        else:
            inp = _maxpool3(x64) if sp.pool else x64
            out = np.maximum(conv_ref(inp, sp.weight.astype(np.float64), sp.bias.astype(np.float64)), 0)
        row = 0
        for slot, off, rows in sp.dst:
            ref[slot][:, off:off + rows] = out[:, row:row + rows]
            row += rows
    for s in ("y", "t", "p"):
        written = ~np.isnan(ref[s])
        assert np.array_equal(np.isnan(bufs[s]), ~written), f"slot {s}: wrong elements written"
        assert relerr(bufs[s][written], ref[s][written]) <= TOL
    return g


@pytest.mark.parametrize("module,cfg", [(5, _conv.CONFIGS[0]), (9, _conv.CONFIGS[1]),
                                        (1, _conv.CONFIGS[2]), (7, _conv.CONFIGS[3]),
                                        (2, _conv.CONFIGS[5]), (8, _conv.CONFIGS[6]),
                                        (2, _conv.CONFIGS[8]), (4, _conv.CONFIGS[9]),
                                        (6, _conv.CONFIGS[10])],
                         ids=["4c-128x128", "5b-128x64", "3a-64x64", "4e-32x32",
                              "3b-a128x128", "5a-a64x128", "3b-t128x128", "4b-t64x128",
                              "4d-t64x128b3"])
def test_kernel_on_host_block(lib, module, cfg, rng):
    blk = InceptionBlock(module, seed=module)
    n, H, W = 2, 3, 4
    x = rng.standard_normal((n, blk.in_channels, H, W)).astype(np.float32)
    b1 = blk.params["b2_reduce"][0].shape[0]
    c1 = blk.params["b3_reduce"][0].shape[0]
    bufs = {"x": x, "y": np.full((n, blk.out_channels, H, W), np.nan, np.float32),
            "t3": np.full((n, b1, H, W), np.nan, np.float32),
            "t5": np.full((n, c1, H, W), np.nan, np.float32),
            "xp": np.full(x.shape, np.nan, np.float32)}
    g1, g2 = blk.groups()
    # Tiny batch: split-K in use, except in the async kernel (one chunk always).
    assert (max(g2.choose_splits(n, H, W, cfg, 132)) > 1) == (not cfg.stages)
    host_launch(lib, g1, bufs, cfg)
    host_launch(lib, g2, bufs, cfg)
    assert not np.isnan(bufs["y"]).any()
    assert relerr(bufs["y"], blk.forward_cpu(x).astype(np.float64)) <= TOL


def test_kernel_on_host_table6(lib, rng):
    s = Table6Set(8, seed=2)
    x = rng.standard_normal((1, 192, 7, 7)).astype(np.float32)
    y = np.full((1, s.out_channels, 7, 7), np.nan, np.float32)
    host_launch(lib, s.group(), {"x": x, "y": y}, _conv.CONFIGS[3])
    assert relerr(y, s.forward_cpu(x).astype(np.float64)) <= TOL

"""Build a CUDA kernel file as a host shared library for the CPU kernel tests
(test_inception_kernel_host.py, test_batched_kernel_host.py): the test's C++20 shim
(threads for CUDA threads, a std::barrier for __syncthreads) prepended to the source."""

import ctypes
import subprocess

import pytest


def build(directory, name: str, shim: str, source: str) -> ctypes.CDLL:
    """Compile ``shim + source`` into ``directory/name.so`` with g++ and load it.

    Skips the test if g++ has no C++20 <barrier>; fails it if the shim or the kernel
    source does not build (a shim mistake must not pass as a skip)."""
    probe_src = directory / "probe.cpp"
    probe_src.write_text("#include <barrier>\nint main() { std::barrier<> b(1); return 0; }\n")
    probe = subprocess.run(["g++", "-std=c++20", "-pthread", "-w", "-o", str(directory / "probe"),
                            str(probe_src)], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip("g++ has no C++20 <barrier>: " + probe.stderr[-300:])
    cpp, so = directory / f"{name}.cpp", directory / f"{name}.so"
    cpp.write_text(shim + source)
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w",
                        "-o", str(so), str(cpp)], capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"{name}: the kernel does not build as C++ with the shim:\n" + r.stderr[-4000:])
    return ctypes.CDLL(str(so))


# A kernel launch on the host, for the shims that declare threadIdx and blockIdx
# (thread_local dim3) and g_bar (the block's barrier, which __syncthreads waits on):
# nz x grid blocks of nt threads, one block after another; kernel() is one thread's
# call of the kernel.
RUN_BLOCKS = r"""
template <typename F>
static void run_blocks(int grid, int nz, int nt, F kernel) {
    for (int z = 0; z < nz; ++z)
        for (int b = 0; b < grid; ++b) {
            std::barrier<> bar(nt);
            g_bar = &bar;
            std::vector<std::thread> ts;
            for (int t = 0; t < nt; ++t)
                ts.emplace_back([=] {
                    threadIdx.x = t;
                    blockIdx.x = b;
                    blockIdx.z = z;
                    kernel();
                });
            for (auto& th : ts) th.join();
        }
}
"""


# mma.m16n8k8.tf32 on the host, for kernels built with TSM_HOST_MMA (common.cuh):
# the 32 threads of a warp post their fragments, meet at the warp's barrier, and
# each computes its own C elements from the whole A (16 x 8) and B (8 x 8), operands
# truncated to TF32 as the MMA reads them; a second barrier keeps the posts until
# every lane has read them. Needs threadIdx (thread_local) and __uint_as_float from
# the including shim; a driver gives each block a HostWarps and points g_warps at it.
MMA_SHIM = r"""
#include <memory>
#define TSM_HOST_MMA 1
struct HostWarp {
    std::barrier<>* bar;
    unsigned a[32][4], b[32][2];
};
static HostWarp* g_warps;
struct HostWarps {  // one barrier of 32 per warp of a block
    std::vector<std::unique_ptr<std::barrier<>>> bars;
    std::vector<HostWarp> warps;
    explicit HostWarps(int n) : warps(n) {
        for (int i = 0; i < n; ++i) {
            bars.push_back(std::make_unique<std::barrier<>>(32));
            warps[i].bar = bars[i].get();
        }
        g_warps = warps.data();
    }
};
inline float tf32_trunc(unsigned x) { return __uint_as_float(x & 0xffffe000u); }
inline void tsm_host_mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int lane = threadIdx.x & 31;
    HostWarp& w = g_warps[threadIdx.x >> 5];
    for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
    w.b[lane][0] = b0;
    w.b[lane][1] = b1;
    w.bar->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = d[i];
        for (int k = 0; k < 8; ++k) {
            // A fragment: lane (row % 8) * 4 + k % 4, register (row >= 8) + 2 (k >= 4);
            // B fragment: lane col * 4 + k % 4, register k >= 4.
            const unsigned av = w.a[(row % 8) * 4 + k % 4][(row >= 8) + 2 * (k >= 4)];
            const unsigned bv = w.b[col * 4 + k % 4][k >= 4];
            s += tf32_trunc(av) * tf32_trunc(bv);
        }
        d[i] = s;
    }
    w.bar->arrive_and_wait();
}
// mma.m8n8k4.f64: A (8 x 4) row l/4, k l%4 from lane l; B (4 x 8) k l%4, column l/4.
struct HostWarpD {
    double a[32], b[32];
};
static HostWarpD g_warps_d[32];
inline void tsm_host_dmma(double (&d)[2], double a, double b) {
    const int lane = threadIdx.x & 31;
    HostWarp& w = g_warps[threadIdx.x >> 5];
    HostWarpD& x = g_warps_d[threadIdx.x >> 5];
    x.a[lane] = a;
    x.b[lane] = b;
    w.bar->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int c = 0; c < 2; ++c) {
        const int col = 2 * t + c;
        double s = d[c];
        for (int k = 0; k < 4; ++k) s = std::fma(x.a[g * 4 + k], x.b[col * 4 + k], s);
        d[c] = s;
    }
    w.bar->arrive_and_wait();
}
"""

// Shared device helpers for the tsm kernels: 64-bit index type, vector loads of
// VEC elements (16 bytes at most) into register arrays, cp.async wrappers, and a
// warp reduce-scatter.
//
// Everything here is header-only and included textually by tsm_core/runtime/compile.py
// (the `#include "common.cuh"` line is replaced by this file), so the compiled
// module is a single translation unit whose hash covers the helpers too.
#pragma once

typedef long long i64;

// ---------------------------------------------------------------- vector types

template <typename T, int V> struct VecT;
template <> struct VecT<float, 1> { typedef float type; };
template <> struct VecT<float, 2> { typedef float2 type; };
template <> struct VecT<float, 4> { typedef float4 type; };
template <> struct VecT<double, 1> { typedef double type; };
template <> struct VecT<double, 2> { typedef double2 type; };

// Unpack a vector into a register array. Only compile-time indices are used so
// the array stays in registers (a run-time index would send it to local memory).
template <typename T, int V>
__device__ __forceinline__ void unpack(T (&d)[V], typename VecT<T, V>::type x);

template <> __device__ __forceinline__ void unpack<float, 1>(float (&d)[1], float x) { d[0] = x; }
template <> __device__ __forceinline__ void unpack<float, 2>(float (&d)[2], float2 x) { d[0] = x.x; d[1] = x.y; }
template <> __device__ __forceinline__ void unpack<float, 4>(float (&d)[4], float4 x) {
    d[0] = x.x; d[1] = x.y; d[2] = x.z; d[3] = x.w;
}
template <> __device__ __forceinline__ void unpack<double, 1>(double (&d)[1], double x) { d[0] = x; }
template <> __device__ __forceinline__ void unpack<double, 2>(double (&d)[2], double2 x) { d[0] = x.x; d[1] = x.y; }

// Load V consecutive elements starting at p (p must be aligned to V*sizeof(T)).
template <typename T, int V>
__device__ __forceinline__ void load_vec(T (&d)[V], const T* p) {
    typedef typename VecT<T, V>::type vt;
    unpack<T, V>(d, *reinterpret_cast<const vt*>(p));
}

// Same, but marked "streaming" (evict-first): for operands read exactly once,
// so that they do not push reusable data (B, split-K partials) out of L2.
template <typename T, int V>
__device__ __forceinline__ void load_vec_stream(T (&d)[V], const T* p) {
    typedef typename VecT<T, V>::type vt;
    unpack<T, V>(d, __ldcs(reinterpret_cast<const vt*>(p)));
}

// Store V consecutive elements at p (aligned to V*sizeof(T)).
template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const T (&d)[V]) {
    if constexpr (V == 1) {
        p[0] = d[0];
    } else if constexpr (V == 2) {
        typedef typename VecT<T, 2>::type vt;
        vt x;
        x.x = d[0];
        x.y = d[1];
        *reinterpret_cast<vt*>(p) = x;
    } else {
        static_assert(V == 4, "16-byte vectors of float");
        float4 x = make_float4(d[0], d[1], d[2], d[3]);
        *reinterpret_cast<float4*>(p) = x;
    }
}

// Load up to V consecutive elements, zero-filling past `valid` (0 <= valid <= V).
template <typename T, int V>
__device__ __forceinline__ void load_vec_partial(T (&d)[V], const T* p, int valid) {
    if (valid >= V) {
        load_vec_stream<T, V>(d, p);
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) d[v] = (v < valid) ? p[v] : T(0);
    }
}

// ---------------------------------------------------------------- cp.async
// Asynchronous global -> shared copies (sm_80+). `src_bytes` < the copy size
// zero-fills the rest of the destination, which is how tiles past the edge of a
// matrix become zeros without a branch around the copy. On older GPUs the copy
// is done synchronously with the same zero-fill semantics.

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes) {
#if __CUDA_ARCH__ >= 800
    if constexpr (BYTES == 16) {
        // .cg: bypass L1, the tile is consumed from shared memory only.
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
                     "l"(src), "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_u32(dst)),
                     "l"(src), "n"(BYTES), "r"(src_bytes));
    }
#else
    const unsigned char* s = static_cast<const unsigned char*>(src);
    unsigned char* d = static_cast<unsigned char*>(dst);
    for (int i = 0; i < BYTES; ++i) d[i] = (i < src_bytes) ? s[i] : 0;
#endif
}

// The same with a flag: the whole copy where `ok`, else a zero fill (source size 0).
// The size is chosen inside the asm operands, after the shared address: gemm.cu's
// kernels were tuned with the copies written this way.
template <int BYTES>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool ok) {
#if __CUDA_ARCH__ >= 800
    if constexpr (BYTES == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
                     "l"(src), "r"(ok ? 16 : 0));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_u32(dst)),
                     "l"(src), "n"(BYTES), "r"(ok ? BYTES : 0));
    }
#else
    const unsigned char* s = static_cast<const unsigned char*>(src);
    unsigned char* d = static_cast<unsigned char*>(dst);
    for (int i = 0; i < BYTES; ++i) d[i] = ok ? s[i] : 0;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// ---------------------------------------------------------------- 3xTF32
// float32 products on the TF32 tensor cores (sm_80+): x = hi + lo, the MMA reading
// x itself as its truncated high part (it ignores the low 13 bits), and C gets
// hi*hi + hi*lo + lo*hi. Used by tsm2r_v3x and the batched and conv kernels' tensor-core
// tiles (the conv kernel through tf32x3.cuh's fragment load and three passes).

// The split of a finite x: the MMA reads x itself as hi (it ignores the low 13
// bits, i.e. truncates), so only lo costs instructions (LOP3, FADD, IADD).
__device__ __forceinline__ unsigned tf32_low(float x) {
    const float h = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
    return __float_as_uint(x - h) + 0x1000u;
}

__device__ __forceinline__ void mma_tf32_16x8x8(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                                unsigned b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(TSM_HOST_MMA)
    // The CPU kernel tests' C++ build (tests/test_inception_kernel_host.py): the
    // shim emulates the warp's fragment exchange.
    tsm_host_mma_tf32(d, a, b0, b1);
#else
    // Never launched below sm_80 (the launchers pick FMA kernels there).
    d[0] += __uint_as_float(a[0]) * __uint_as_float(b0);
#endif
}

// float64 on the FP64 tensor cores (DMMA, mma.m8n8k4.f64): A fragment, lane l holds
// row l/4 at k-index l%4; B fragment, k-index l%4 of column l/4; C fragment, row
// l/4, columns 2(l%4) + {0,1}. Used by tsm2r_v3d and batched version 2 (float64).
__device__ __forceinline__ void dmma_8x8x4(double (&d)[2], double a, double b) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(d[0]), "+d"(d[1]) : "d"(a), "d"(b));
#elif defined(TSM_HOST_MMA)
    tsm_host_dmma(d, a, b);  // the CPU kernel tests' warp exchange
#else
    // Never launched below sm_80 (the launchers pick FMA kernels there); keeps the
    // file compiling for any architecture.
    d[0] += a * b;
#endif
}

// Widest vector (elements) of T, at most 16 bytes, that divides N.
template <typename T>
__host__ __device__ constexpr int vec_width_for(int N) {
    return (N % (16 / (int)sizeof(T)) == 0) ? 16 / (int)sizeof(T)
         : (sizeof(T) == 4 && N % 2 == 0) ? 2 : 1;
}

// acc[j] += a * b[0..N) where b is read from shared memory as wide vectors.
// All threads of a warp read the same address (a broadcast): no bank conflicts.
template <typename T, int N>
__device__ __forceinline__ void fma_row_from_smem(T (&acc)[N], T a, const T* brow) {
    constexpr int BV = vec_width_for<T>(N);
#pragma unroll
    for (int j = 0; j < N; j += BV) {
        T b[BV];
        load_vec<T, BV>(b, brow + j);
#pragma unroll
        for (int q = 0; q < BV; ++q) acc[j + q] = fma(a, b[q], acc[j + q]);
    }
}

// acc[r][j] += a[r] * b[0..N) for R rows: each vector of b is read from shared
// memory once and used for all R rows (the reason for several rows per thread).
template <typename T, int R, int N>
__device__ __forceinline__ void fma_rows_from_smem(T (&acc)[R][N], const T (&a)[R], const T* brow) {
    constexpr int BV = vec_width_for<T>(N);
#pragma unroll
    for (int j = 0; j < N; j += BV) {
        T b[BV];
        load_vec<T, BV>(b, brow + j);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int q = 0; q < BV; ++q) acc[r][j + q] = fma(a[r], b[q], acc[r][j + q]);
    }
}

// ---------------------------------------------------------------- warp reductions

// Butterfly reduce-scatter of v[0..V) over the lanes that differ from this one in
// the bits OFF, OFF/2, ..., 1 (OFF = 16: the whole warp). Each round halves the
// live values: a lane keeps one half, sends the other to its partner (lane ^ OFF)
// and adds what it receives, so V values cost about V shuffles in all instead of
// V per round. Once one value is left, the remaining rounds all-reduce it.
// Afterwards lane l holds the sums of the original indices given by
// scattered_index (sum over halving rounds r of ((l & OFF_r) ? H_r : 0), plus i).
template <typename T, int V, int LIVE, int OFF>
__device__ __forceinline__ void warp_reduce_scatter(T (&v)[V], int lane) {
    if constexpr (OFF > 0) {
        if constexpr (LIVE >= 2) {
            constexpr int H = LIVE / 2;
            const bool upper = (lane & OFF) != 0;
#pragma unroll
            for (int i = 0; i < H; ++i) {
                const T send = upper ? v[i] : v[i + H];
                const T keep = upper ? v[i + H] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
            }
            warp_reduce_scatter<T, V, H, OFF / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);
            warp_reduce_scatter<T, V, 1, OFF / 2>(v, lane);
        }
    }
}

// Original index of v[i] after warp_reduce_scatter<T, V, V, OFF0>.
template <int V, int OFF0>
__device__ __forceinline__ int scattered_index(int i, int lane) {
    int idx = i, live = V;
#pragma unroll
    for (int off = OFF0; off > 0; off >>= 1) {
        if (live >= 2) {
            live >>= 1;
            if (lane & off) idx += live;
        }
    }
    return idx;
}

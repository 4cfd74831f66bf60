// The sm_90a warpgroup MMA's plumbing (wgmma.mma_async), shared by the kernels that
// use it (batched version 6, kmeans_assign_wg): the shared-memory matrix descriptor,
// the fence / commit / wait of its asynchronous groups, and the proxy fence that
// makes shared-memory writes visible to it. TSM_WGMMA is defined only where the
// module is built for sm_90a (runtime/compile.py's ARCH_SPECIFIC); elsewhere these
// are empty and the kernels that use them are never launched. The MMA instructions
// themselves stay with each kernel (their shapes differ).
#pragma once

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TSM_WGMMA 1
#endif

// A shared-memory matrix descriptor, no swizzle: start address, the byte distance
// between core matrices (8 rows x 16 bytes) next to each other along k (LBO) and
// along m / n (SBO), each in units of 16 bytes.
__device__ __forceinline__ unsigned long long wg_desc(unsigned saddr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((saddr & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32);
}

__device__ __forceinline__ void wg_fence() {
#if defined(TSM_WGMMA)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wg_commit() {
#if defined(TSM_WGMMA)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void wg_wait() {
#if defined(TSM_WGMMA)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Shared memory written by this thread's ordinary stores (and its completed
// cp.async copies) made visible to the tensor cores' reads (the async proxy); a
// barrier after it publishes them to the other threads' wgmma.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(TSM_WGMMA)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

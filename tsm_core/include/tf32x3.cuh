// 3xTF32 fragments for mma.sync.m16n8k8 (sm_80+): float32 products on the TF32
// tensor cores. Each operand is split as x = hi + lo, where hi is x itself (the MMA
// reads only its top 19 bits, i.e. truncates) and lo = tf32_low(x) (common.cuh); a
// product is then hi*hi + hi*lo + lo*hi, the dropped lo*lo below 2^-20 of it.
//
// Fragment layout of mma.m16n8k8 (lane l = 4 g + t): A (16 x 8) holds rows g, g + 8
// at k = t, t + 4; B (8 x 8) column g at k = t, t + 4; C rows g, g + 8 and columns
// 2t, 2t + 1. Used by the conv kernel's tensor-core tiles (conv.cu). batched.cu's
// version 1 tiles write the same steps out: through these helpers NVVM compiled its
// float32 version 2 differently (and not deterministically), so they stay as they were.
#pragma once

#include "common.cuh"

// B's fragments of NT8 blocks of 8 columns, read from a k-major shared tile Bs (rows
// LDB floats apart) at k = k8 + t, k8 + t + 4 and columns n0 + 8 nt + g, each value
// split into its hi and lo parts as it is read. With LDB a multiple of 32 plus 8 the
// lanes (g, t) hit 32 distinct banks.
template <int NT8, int LDB>
__device__ __forceinline__ void tf32x3_load_b(unsigned (&bh)[NT8][2], unsigned (&bl)[NT8][2],
                                              const float* Bs, int k8, int n0, int gq, int tq) {
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt) {
        const float* b = Bs + (k8 + tq) * LDB + n0 + nt * 8 + gq;
        const float x0 = b[0], x1 = b[4 * LDB];
        bh[nt][0] = __float_as_uint(x0);
        bh[nt][1] = __float_as_uint(x1);
        bl[nt][0] = tf32_low(x0);
        bl[nt][1] = tf32_low(x1);
    }
}

// d += a b in 3xTF32, the small terms first: lo(a) hi(b), hi(a) lo(b), hi(a) hi(b).
// static (internal linkage): with external linkage, NVVM scheduled the FMA tiles of
// the same module differently (conv_gemm_relu_async's PTX changed); static keeps
// every kernel's PTX as it was with the passes written out at each use.
static __device__ __forceinline__ void mma_3xtf32_16x8x8(float (&d)[4],
                                                         const unsigned (&ah)[4],
                                                         const unsigned (&al)[4],
                                                         const unsigned (&bh)[2],
                                                         const unsigned (&bl)[2]) {
    mma_tf32_16x8x8(d, al, bh[0], bh[1]);
    mma_tf32_16x8x8(d, ah, bl[0], bl[1]);
    mma_tf32_16x8x8(d, ah, bh[0], bh[1]);
}

// ABFT row checksums: one pass over a row-major X (m x p) that returns, per row i,
//     Y[i, q] = sum_j X[i, j] * V[j, q]          q < NC   (the checksums)
//     Z[i, q] = sum_j X[i, j]^2 * V[j, q]^2      q < NZ   (what the round-off bound needs)
// accumulated in double whatever T is. Used by apps/abft's ft_matmul for its three
// verification passes (B @ W, A @ (B W), C @ W): each is one read of a large matrix,
// memory-bound, so the sums of squares that the threshold needs come for free with
// the checksums instead of costing three more passes.
//
// MODE 0: V is read from memory (p x NC, row-major, double); NZ = 1 and Z is the
//         plain sum of squares (row norms squared).
// MODE 1: V is the checksum weight matrix, generated from the column index
//         (no memory traffic): V[j, 0] = 1, V[j, q] = V[j, q-1] * x_j with
//         x_j = (j + 1) / p. apps/abft.weights builds exactly the same numbers
//         (IEEE division and products in the same order). NZ = 1 as in mode 0.
// MODE 2: V generated as in mode 1; NZ = NC and Z[i, q] = sum_j X[i,j]^2 V[j,q]^2.
//
// Mapping: a block of 256 threads owns R consecutive rows; thread t reads columns
// t, t + 256, ... of each of them, so every load instruction of a warp reads 32
// consecutive elements of one row (coalesced), and each V value (mode 0) is loaded
// once per R rows rather than once per row. U column steps are loaded before any is
// used, so R * U independent loads per thread are in flight: enough bytes per SM to
// cover DRAM latency at full bandwidth. The block reduces its partial sums in a
// fixed order (warp shuffles, then warp 0 over the warps): deterministic results.
#include "common.cuh"

namespace abft {

constexpr int NT = 256;  // threads per block
constexpr int U = 4;     // column steps loaded ahead per thread

template <int NC>
__device__ __forceinline__ void gen_weights(double (&w)[NC], i64 j, i64 p) {
    w[0] = 1.0;
    if (NC > 1) {
        // Division, not a product with 1/p: the host computes (j + 1) / p.
        const double x = (double)(j + 1) / (double)p;
#pragma unroll
        for (int q = 1; q < NC; ++q) w[q] = w[q - 1] * x;
    }
}

__device__ __forceinline__ double shfl_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

}  // namespace abft

template <typename T, int NC, int MODE, int R>
__global__ void __launch_bounds__(abft::NT) abft_rows(const T* __restrict__ X, i64 m, i64 p, i64 ld,
                                                      const double* __restrict__ V,
                                                      double* __restrict__ Y, double* __restrict__ Z) {
    using namespace abft;
    constexpr int NZ = (MODE == 2) ? NC : 1;
    constexpr int NS = NC + NZ;  // sums per row
    const i64 r0 = (i64)blockIdx.x * R;
    const int nrows = (int)((m - r0) < R ? (m - r0) : R);

    double acc[R][NC], sq[R][NZ];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int q = 0; q < NC; ++q) acc[r][q] = 0.0;
#pragma unroll
        for (int q = 0; q < NZ; ++q) sq[r][q] = 0.0;
    }

    const T* Xr = X + r0 * ld;
    for (i64 j0 = threadIdx.x; j0 < p; j0 += (i64)NT * U) {
        // Issue every load of this step first (independent loads in flight), then use them.
        T x[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 j = j0 + (i64)u * NT;
#pragma unroll
            for (int r = 0; r < R; ++r) x[u][r] = (j < p && r < nrows) ? __ldg(Xr + r * ld + j) : T(0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 j = j0 + (i64)u * NT;
            if (j >= p) continue;  // (not break: keeps the loop fully unrolled, x[] in registers)
            double w[NC];
            if (MODE == 0) {
#pragma unroll
                for (int q = 0; q < NC; ++q) w[q] = __ldg(V + j * NC + q);
            } else {
                gen_weights<NC>(w, j, p);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const double xd = (double)x[u][r];
#pragma unroll
                for (int q = 0; q < NC; ++q) acc[r][q] = fma(xd, w[q], acc[r][q]);
                const double x2 = xd * xd;
                if (MODE == 2) {
#pragma unroll
                    for (int q = 0; q < NZ; ++q) sq[r][q] = fma(x2, w[q] * w[q], sq[r][q]);
                } else {
                    sq[r][0] += x2;
                }
            }
        }
    }

    // Block reduction in a fixed order: deterministic, whatever the scheduling.
    __shared__ double part[NT / 32][R * NS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int q = 0; q < NC; ++q) {
            const double v = shfl_sum(acc[r][q]);
            if (lane == 0) part[warp][r * NS + q] = v;
        }
#pragma unroll
        for (int q = 0; q < NZ; ++q) {
            const double v = shfl_sum(sq[r][q]);
            if (lane == 0) part[warp][r * NS + NC + q] = v;
        }
    }
    __syncthreads();
    for (int s = threadIdx.x; s < R * NS; s += NT) {
        const int r = s / NS, q = s % NS;
        if (r >= nrows) continue;
        double v = 0.0;
#pragma unroll
        for (int w = 0; w < NT / 32; ++w) v += part[w][s];
        if (q < NC) Y[(r0 + r) * NC + q] = v;
        else Z[(r0 + r) * NZ + (q - NC)] = v;
    }
}

// k-means|| initialisation (Bahmani et al. 2012, "Scalable K-Means++"): the
// kernels of its last step, the recluster of the weighted candidate pool.
//
//   kmeans_pool_sqdist   Dmat (m, m) float32 = max(||p||^2 - 2 p.q + ||q||^2, 0),
//                        diagonal 0, from the Gram matrix G = P P^T (cuBLAS).
//   kmeans_recluster     scikit-learn's greedy k-means++ over the m pool points
//                        with weights w, ALL n_clusters steps in one block of
//                        THREADS threads: no host round trip per centre. The
//                        uniforms are drawn on the host (scikit-learn's order) and
//                        passed in; the pool is small (m <= 8192), so one block
//                        keeps D (the distance of every pool point to its nearest
//                        chosen centre) and w in shared memory and reads the rows
//                        of Dmat from L2.
//
// Determinism: every sum is taken in a fixed order (per-thread segments in index
// order, then warp shuffles and the warps in order), so a given input gives the
// same output bit for bit.
#include "common.cuh"

template <typename T>
__global__ void kmeans_pool_sqdist(const T* __restrict__ G, const T* __restrict__ pn, int m,
                                   float* __restrict__ D) {
    const i64 total = (i64)m * m;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const int i = (int)(e / m);
        const int j = (int)(e - (i64)i * m);
        const T v = pn[i] - 2 * G[e] + pn[j];
        D[e] = i == j ? 0.0f : (float)(v > 0 ? v : 0);
    }
}

// Template parameters:
//   THREADS  threads of the one block (a multiple of 32, at most 1024)
//   MAXT     local trials per centre at most (2 + int(log k) <= MAXT: k < e^14)
// Arguments:
//   Dmat (m, m) float32, row-major; w (m,) float64 pool weights;
//   u ((k - 1) * trials,) float64 uniforms in [0, 1), step c's in u[(c-1)*trials ...];
//   first: the first centre (a pool index); out (k,) int: the chosen pool indices.
// Dynamic shared memory: m doubles (w) then m floats (D).
// One block per GPU: the launch bound's "1 block per SM" lets ptxas use 64 registers
// a thread (left to aim at two blocks per SM, it caps at 32 and spills).
//
// Step c, as sklearn.cluster.kmeans_plusplus:
//   pot = sum_i w_i D_i, cum_i its prefix sums (float64);
//   cand_t = the first i with cum_i >= u_t * pot (np.searchsorted), clipped to m-1;
//   pot_t = sum_i w_i min(D_i, Dmat[cand_t, i]);
//   best = the trial of the smallest pot_t (the smaller trial on ties);
//   D = min(D, Dmat[cand_best]).
template <int THREADS, int MAXT>
__global__ void __launch_bounds__(THREADS, 1)
kmeans_recluster(const float* __restrict__ Dmat, int m, const double* __restrict__ w,
                 const double* __restrict__ u, int k, int trials, int first, int* __restrict__ out) {
    constexpr int WARPS = THREADS / 32;
    constexpr int TG = 4;  // trials whose potentials are summed together
    static_assert(THREADS % 32 == 0 && WARPS <= 32, "whole warps, one warp scans the warp totals");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    double* ws = reinterpret_cast<double*>(smem_raw);
    float* D = reinterpret_cast<float*>(ws + m);
    __shared__ double warp_tot[WARPS];   // per-warp segment totals, then their exclusive prefixes
    __shared__ double s_pot;             // the potential of the current centres
    __shared__ double red[MAXT][WARPS];  // per-warp partial trial potentials
    __shared__ int redi[MAXT][WARPS];    // per-warp first index reaching each trial's target
    __shared__ int cand[MAXT];
    __shared__ double pots[MAXT];

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    // The scan works on contiguous segments (prefix sums need index order); the
    // potentials and the update stride by THREADS (coalesced reads of Dmat rows).
    const int seg = (m + THREADS - 1) / THREADS;
    const int s0 = min(m, tid * seg);
    const int s1 = min(m, s0 + seg);

    const float* row0 = Dmat + (i64)first * m;
    for (int i = tid; i < m; i += THREADS) {
        ws[i] = w[i];
        D[i] = row0[i];
    }
    if (tid == 0) out[0] = first;
    __syncthreads();

    for (int c = 1; c < k; ++c) {
        // ---- potential and the exclusive prefix of this thread's segment
        double local = 0.0;
        for (int i = s0; i < s1; ++i) local += ws[i] * (double)D[i];
        double incl = local;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const double y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        double excl = __shfl_up_sync(0xffffffffu, incl, 1);
        if (lane == 0) excl = 0.0;
        if (lane == 31) warp_tot[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            const double t = lane < WARPS ? warp_tot[lane] : 0.0;
            double s = t;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const double y = __shfl_up_sync(0xffffffffu, s, off);
                if (lane >= off) s += y;
            }
            double e = __shfl_up_sync(0xffffffffu, s, 1);
            if (lane == 0) e = 0.0;
            if (lane == 31) s_pot = s;
            __syncwarp();
            if (lane < WARPS) warp_tot[lane] = e;
        }
        __syncthreads();
        const double pot = s_pot;
        const double base = warp_tot[warp] + excl;

        // ---- candidates: the first index whose prefix sum reaches u * pot
        for (int t = 0; t < trials; ++t) {
            const double target = u[(i64)(c - 1) * trials + t] * pot;
            double acc = base;
            int found = 0x7fffffff;
            for (int i = s0; i < s1; ++i) {
                acc += ws[i] * (double)D[i];
                if (acc >= target) {
                    found = i;
                    break;
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) found = min(found, __shfl_xor_sync(0xffffffffu, found, off));
            if (lane == 0) redi[t][warp] = found;
        }
        __syncthreads();
        if (tid < trials) {
            int f = redi[tid][0];
            for (int q = 1; q < WARPS; ++q) f = min(f, redi[tid][q]);
            cand[tid] = min(f, m - 1);  // none reached (rounding): the last point, as np.clip
        }
        __syncthreads();

        // ---- the potential after adding each candidate: TG trials at a time, so that
        // TG rows of Dmat are in flight per element (the loop is latency-bound: one
        // block, reads from L2)
        for (int t0 = 0; t0 < trials; t0 += TG) {
            const float* rows[TG];
#pragma unroll
            for (int j = 0; j < TG; ++j) rows[j] = Dmat + (i64)cand[min(t0 + j, trials - 1)] * m;
            double s[TG];
#pragma unroll
            for (int j = 0; j < TG; ++j) s[j] = 0.0;
            for (int i = tid; i < m; i += THREADS) {
                const double wi = ws[i];
                const float di = D[i];
#pragma unroll
                for (int j = 0; j < TG; ++j) s[j] += wi * (double)fminf(di, __ldg(rows[j] + i));
            }
#pragma unroll
            for (int j = 0; j < TG; ++j) {
                double v = s[j];
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
                if (lane == 0 && t0 + j < trials) red[t0 + j][warp] = v;
            }
        }
        __syncthreads();
        if (tid < trials) {
            double s = red[tid][0];
            for (int q = 1; q < WARPS; ++q) s += red[tid][q];
            pots[tid] = s;
        }
        __syncthreads();

        // ---- keep the best trial (every thread finds the same one) and update D
        int best = 0;
        for (int t = 1; t < trials; ++t)
            if (pots[t] < pots[best]) best = t;
        const int cb = cand[best];
        const float* row = Dmat + (i64)cb * m;
        for (int i = tid; i < m; i += THREADS) D[i] = fminf(D[i], __ldg(row + i));
        if (tid == 0) out[c] = cb;
        __syncthreads();  // D is read in segments by the next step's scan
    }
}

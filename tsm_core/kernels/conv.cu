// Grouped "same" convolutions (stride 1, odd kernel R x R, pad R/2) with bias and
// ReLU fused, as implicit GEMMs over NCHW float32 tensors: one launch runs several
// convolutions ("segments"), each writing its output channels straight into a
// channel slice of a destination tensor (the Inception concatenation, for free).
//
// Per segment the GEMM is  Out[m, j] = relu(bias[m] + sum_k Wt[k, m] * B[k, j])
//   m : output channel (M rows), j = n * H * W + pixel (all images, N*H*W columns),
//   k : input element (K = Cin * R * R), B[k, j] gathered on the fly from the input:
//   - kind 0 (1x1):      B[k, j] = in[n, k, pixel]
//   - kind 1 (pool):     B[k, j] = max of the 3x3 window (stride 1, pad 1) of channel k
//                        around the pixel (the Inception pool branch, its max-pool never
//                        written to memory)
//   - kind 2 (R x R):    B[k, j] = in[n, ci, y + dy, x + dx] or 0 outside the image,
//                        with (ci, dy, dx) and the flat offset ci*H*W + dy*W + dx read
//                        from a per-k table (no integer division by R*R in the loop,
//                        and no im2col buffer in global memory).
// Wt is the segment's weights transposed to (K, M), row-major, so that a tile of A
// is read with consecutive threads on consecutive m (coalesced). A segment may be
// the concatenation of several convolutions on the same input (rows split into up
// to MAX_PARTS parts, each with its own destination slot, channel count and offset).
//
// Split-K (small batches, where a block's time is the latency of its K steps, not
// its FMAs): a segment may cut K into `splits` chunks of KCHUNK (a multiple of BK),
// one block each. Each block stores its partial tile in a workspace; the last block
// of a tile to finish (counted with an atomic, after a __threadfence: the pattern of
// CUDA's threadFenceReduction sample) adds the partials in chunk order (the result
// does not depend on the blocks' timing), applies bias and ReLU, stores the tile and
// resets the counter for the next launch. One launch, no separate reduction pass.
//
// Segment descriptors are int64 rows of NF fields in device memory (built once per
// block, batch size and image size by tsm_core/_conv.py); the tensors they read and
// write are named by slot (0..3), bound to pointers at launch, so that new inputs
// and outputs need no descriptor upload.

namespace tsm_conv {
enum Field {
    F_KIND = 0, F_SRC, F_CIN, F_K, F_M, F_W, F_BIAS, F_TAB, F_TILE0, F_MTILES, F_NPARTS,
    F_SPLITS, F_KCHUNK, F_WS, F_CNT,  // split-K: chunks, chunk length, workspace, counters
    F_PART0  // then per part: first row, slot, destination channels, channel offset
};
constexpr int MAX_PARTS = 6;
constexpr int NF = F_PART0 + 4 * MAX_PARTS;  // 39 fields per segment
}  // namespace tsm_conv

__device__ __forceinline__ float* tsm_conv_slot(long long s, float* s0, float* s1, float* s2,
                                                float* s3) {
    return s == 0 ? s0 : s == 1 ? s1 : s == 2 ? s2 : s3;
}

// BM x BN output tile per block, BK deep K steps, TM x TN outputs per thread, at
// least MINB resident blocks per SM (caps the registers: latency hiding by occupancy).
// Register blocking: each thread keeps TM*TN accumulators; per k it reads TM + TN
// values from shared memory as float4 (TM, TN multiples of 4) for TM*TN FMAs.
// Thread (ty, tx) owns rows ty*TM .. ty*TM+TM-1 and columns c*(BN/CH) + tx*4 + q
// (CH = TN/4 chunks of 4): the float4 reads of Bs by a quarter warp cover 128
// contiguous bytes (no bank conflicts), and those of As are broadcasts.
template <int BM, int BN, int BK, int TM, int TN, int MINB>
__global__ void __launch_bounds__((BM / TM) * (BN / TN), MINB)
conv_gemm_relu(const long long* __restrict__ desc, int nseg, float* s0, float* s1, float* s2,
               float* s3, int nimg, int H, int W) {
    using namespace tsm_conv;
    constexpr int TX = BN / TN;
    constexpr int NT = (BM / TM) * TX;
    constexpr int CH = TN / 4;
    constexpr int AL = BK * BM / NT;  // A elements each thread loads per K step
    constexpr int BL = BK * BN / NT;  // B elements each thread loads per K step
    constexpr int BROW = NT / BN;     // rows between a thread's B elements
    static_assert(TM % 4 == 0 && TN % 4 == 0, "float4 fragments");
    static_assert((BK * BM) % NT == 0 && (BK * BN) % NT == 0 && NT % BN == 0, "tile shape");

    // Double-buffered tiles: one barrier per K step (see the main loop).
    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];
    __shared__ int last_split;

    // The flat grid: segment s owns blocks [tile0(s), tile0(s+1)); m-tiles vary
    // fastest, so blocks running together share their B columns in L2.
    int s = 0;
    while (s + 1 < nseg && (long long)blockIdx.x >= desc[(s + 1) * NF + F_TILE0]) ++s;
    const long long* d = desc + s * NF;
    const int kind = (int)d[F_KIND];
    const int cin = (int)d[F_CIN];
    const int K = (int)d[F_K];
    const int M = (int)d[F_M];
    const float* __restrict__ wt = reinterpret_cast<const float*>(d[F_W]);
    const float* __restrict__ bias = reinterpret_cast<const float*>(d[F_BIAS]);
    const int4* __restrict__ tab = reinterpret_cast<const int4*>(d[F_TAB]);
    const int mtiles = (int)d[F_MTILES];
    const int HW = H * W;
    const long long ncols = (long long)nimg * HW;
    const int ntiles = (int)((ncols + BN - 1) / BN);
    const int splits = (int)d[F_SPLITS];
    const int local = (int)(blockIdx.x - d[F_TILE0]);
    const int tile = local % (mtiles * ntiles);  // (m-tile, n-tile) of this block
    const int z = local / (mtiles * ntiles);     // its K chunk
    const int m0 = (tile % mtiles) * BM;
    const int n0 = (tile / mtiles) * BN;
    const int kbeg = z * (int)d[F_KCHUNK];
    const int kend = min(K, kbeg + (int)d[F_KCHUNK]);
    const float* __restrict__ src = tsm_conv_slot(d[F_SRC], s0, s1, s2, s3);

    const int tid = threadIdx.x;
    // This thread's B column is the same for every K step: decompose it once.
    const int bj = tid % BN;
    const long long jg = (long long)n0 + bj;
    const bool colok = jg < ncols;
    // 32-bit offsets (the launcher checks every tensor has < 2**31 elements):
    // 64-bit address arithmetic per load would cost registers the tile needs.
    int pix = 0, oy = 0, ox = 0, cbase = 0;
    if (colok) {
        const int img = (int)(jg / HW);
        pix = (int)(jg - (long long)img * HW);
        oy = pix / W;
        ox = pix - oy * W;
        cbase = img * cin * HW + pix;
    }

    float ra[AL], rb[BL];
    auto load = [&](int k0) {
#pragma unroll
        for (int r = 0; r < AL; ++r) {
            const int e = tid + r * NT;
            const int k = k0 + e / BM, m = m0 + e % BM;
            ra[r] = (k < K && m < M) ? wt[k * M + m] : 0.f;
        }
#pragma unroll
        for (int r = 0; r < BL; ++r) {
            const int k = k0 + tid / BN + r * BROW;
            float v = 0.f;
            if (colok && k < K) {
                if (kind == 0) {
                    v = src[cbase + k * HW];
                } else if (kind == 1) {
                    // Max-pool 3x3, stride 1, pad 1 (padding never wins: -inf);
                    // the centre is always inside, so v is finite for finite input.
                    const float* p = src + (cbase - pix + k * HW);
                    v = __int_as_float(0xff800000);  // -inf
#pragma unroll
                    for (int dy = -1; dy <= 1; ++dy) {
                        const int y = oy + dy;
                        if ((unsigned)y >= (unsigned)H) continue;
#pragma unroll
                        for (int dx = -1; dx <= 1; ++dx) {
                            const int x = ox + dx;
                            if ((unsigned)x < (unsigned)W) v = fmaxf(v, p[y * W + x]);
                        }
                    }
                } else {
                    const int4 t = tab[k];  // {ci*HW + dy*W + dx, dy, dx, 0}
                    const int y = oy + t.y, x = ox + t.z;
                    if ((unsigned)y < (unsigned)H && (unsigned)x < (unsigned)W)
                        v = src[cbase + t.x];
                }
            }
            rb[r] = v;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int r = 0; r < AL; ++r) {
            const int e = tid + r * NT;
            As[buf][e / BM][e % BM] = ra[r];
        }
#pragma unroll
        for (int r = 0; r < BL; ++r) Bs[buf][tid / BN + r * BROW][bj] = rb[r];
    };

    const int ty = tid / TX, tx = tid % TX;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    // Chunks end on multiples of BK (the last at K), so the loads' k < K guard
    // also keeps a chunk inside its own range.
    load(kbeg);
    store(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += BK) {
        const bool more = k0 + BK < kend;
        // The next tile's global loads are issued before this tile's FMAs so that
        // their latency hides behind the arithmetic.
        if (more) load(k0 + BK);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM / 4; ++i) {
                const float4 t = *reinterpret_cast<const float4*>(&As[buf][kk][ty * TM + 4 * i]);
                a[4 * i] = t.x; a[4 * i + 1] = t.y; a[4 * i + 2] = t.z; a[4 * i + 3] = t.w;
            }
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                const float4 t = *reinterpret_cast<const float4*>(&Bs[buf][kk][c * (BN / CH) + tx * 4]);
                b[4 * c] = t.x; b[4 * c + 1] = t.y; b[4 * c + 2] = t.z; b[4 * c + 3] = t.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        // Writing the other buffer is safe: the barrier that ended the previous
        // step saw every thread finish reading it. This step's barrier then makes
        // the new tile visible before anyone reads it.
        if (more) store(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }

    if (splits > 1) {
        // Partial tile -> workspace (each thread its own elements, so the reducing
        // block's threads read back exactly what the same threads wrote).
        float* ws = reinterpret_cast<float*>(d[F_WS]) +
                    ((long long)tile * splits) * (BM * BN);
        int* cnt = reinterpret_cast<int*>(d[F_CNT]) + tile;
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j)
                ws[(long long)z * (BM * BN) + (ty * TM + i) * BN + (j / 4) * (BN / CH) + tx * 4 + (j % 4)] =
                    acc[i][j];
        __threadfence();  // partials visible device-wide before the count says so
        __syncthreads();
        if (tid == 0) {
            const int prev = atomicAdd(cnt, 1);
            last_split = prev == splits - 1;
            if (last_split) *cnt = 0;  // every chunk has arrived: ready for the next launch
        }
        __syncthreads();
        if (!last_split) return;
        __threadfence();
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const float* w = ws + (ty * TM + i) * BN + (j / 4) * (BN / CH) + tx * 4 + (j % 4);
                float v = 0.f;
                for (int zz = 0; zz < splits; ++zz) v += __ldcg(w + (long long)zz * (BM * BN));  // L2, not a stale L1
                acc[i][j] = v;
            }
    }

    // Epilogue: bias, ReLU, and the store into the part's channel slice.
    const int nparts = (int)d[F_NPARTS];
    long long colbase[TN];
    int colpix[TN];
    bool colin[TN];
#pragma unroll
    for (int c = 0; c < CH; ++c)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const long long j = (long long)n0 + c * (BN / CH) + tx * 4 + q;
            const long long img = j / HW;
            colin[4 * c + q] = j < ncols;
            colpix[4 * c + q] = (int)(j - img * HW);
            colbase[4 * c + q] = img;
        }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + ty * TM + i;
        if (m >= M) continue;
        int p = 0;
        while (p + 1 < nparts && m >= (int)d[F_PART0 + 4 * (p + 1)]) ++p;
        const long long* pd = d + F_PART0 + 4 * p;
        float* dst = tsm_conv_slot(pd[1], s0, s1, s2, s3);
        const long long ctot = pd[2];
        const long long ch = pd[3] + (m - pd[0]);
        const float bm = bias[m];
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            if (!colin[j]) continue;
            dst[(colbase[j] * ctot + ch) * HW + colpix[j]] = fmaxf(acc[i][j] + bm, 0.f);
        }
    }
}

// Load-balanced batched irregular GEMM: C_i = alpha * A_i @ B_i + beta * C_i for a
// batch of problems of different (M_i, N_i, K_i), all in ONE launch.
//
// After Zhang et al., "A load-balanced acceleration method for small and irregular
// batch matrix multiplication on GPU" (J. Syst. Archit. 160, 2025), section 4.1:
// five tile types, each block computes one tile of one problem, and the number of
// threads per tile grows with the tile (Table 3) so that every thread computes a
// similar number of outputs (W_CP) and loads a similar number of elements (W_DL):
//
//   type  tile (Tm x Tn)  threads  outputs/thread (TM x TN)
//   0     16 x 16         128      2 (2 x 1)
//   1     16 x 32         128      4 (2 x 2)
//   2     32 x 32         128      8 (4 x 2)
//   3     32 x 64         256      8 (4 x 2)
//   4     64 x 64         256      16 (4 x 4)
//   5     128 x 64        256      32 (8 x 4)   versions 3 to 5 (not in the paper)
//   6     128 x 128       256      64 (8 x 8)   versions 4 and 5 (not in the paper; in
//                                                5 on the tensor cores where K >= 128)
//
// The grid is the flat tile list built on the host (tsm_core/_batched.py, the
// paper's Algorithm 1 decides each problem's tile type); every block is launched
// with 256 threads and the 128-thread types retire their spare warps at once
// (the paper's "screening operation"), so one kernel serves all five types.
//
// Unlike the authors' code, no size has to be a multiple of a tile: loads outside
// the problem read zeros and stores outside it are skipped. Every operand has its
// own element strides (row, column), so C- and F-ordered and strided views mix
// freely within one batch.
//
// Metadata, one row of META_STRIDE int64 per problem:
//   [ptrA, ptrB, ptrC, M, N, K, sA_m, sA_k, sB_k, sB_n, sC_m, sC_n]
// Tile list, one int4 per block: (problem, m0, n0, type), sorted on the host by
// decreasing work so that the longest tiles start first (LPT order: the blocks
// that finish last are the short ones, which shortens the tail of the launch).

#include "common.cuh"
#include "wgmma.cuh"

#define TSM_BATCHED_META_STRIDE 14
// Split-K: a tile word (the int4's w) holds the tile type in bits 0-3, the split
// index s in bits 4-11 and the number of splits S in bits 12-19 (0: not split).
#define TSM_BATCHED_SPLIT_ALIGN 16
#define TSM_BATCHED_BK 16
// Versions 3 and 4's wide types step k by 8: at 16, their accumulators and the
// prefetched slab do not fit the registers of three (128 x 64) or two (128 x 128)
// blocks per SM.
#define TSM_BATCHED_XBK 8
// Version 5: the depth of the cp.async ring of its FMA tiles (slabs of TSM_BATCHED_BK),
#define TSM_BATCHED_STAGES 3
// of its 128 x 128 FMA tiles (slabs of TSM_BATCHED_XBK),
#define TSM_BATCHED_XSTAGES 4
// and of its tensor-core tiles: slabs of this depth (two k8 steps a barrier), ring depth.
#define TSM_BATCHED_TC3_BK 16
#define TSM_BATCHED_TC3_STAGES 3
#define TSM_BATCHED_BAR_RED_OR \
    "{ .reg .pred p, q; setp.ne.s32 p, %1, 0; bar.red.or.pred q, 1, %2, p; selp.s32 %0, 1, 0, q; }"

// Blocked accumulation of the FMA tiles and the float64 tensor-core tiles with up to
// TSM_BATCHED_BLOCKED_MAX sums a thread (more spill: the 64 x 64 type's 16, the
// 128 x 64 and 128 x 128 types'; checked by tests/test_batched_compile.py): a tile's running sums
// cover TSM_BATCHED_BLOCK_K k at a time and are then added into a second set of sums,
// so each output is the in-order sum of 64-k partial sums, the order cuBLAS's kernels
// give their outputs where they split K, instead of one running sum over all of K
// (whose error grows like sqrt(K) on signed data). One FADD an output per 64 k.
#define TSM_BATCHED_BLOCK_K 64
#define TSM_BATCHED_BLOCKED_MAX 8
#define TSM_BATCHED_BLOCKED_CP 1  // in the cp.async-ring FMA tiles (version 5) too
// The cp.async-ring tiles' own limit, 16: their 64 x 64 type too (8 more bytes of
// spill in version 5 and 16 in version 6, NVRTC sm_90; device time within 1% of 8).
#define TSM_BATCHED_BLOCKED_MAX_CP 16

namespace tsm_batched {

// tot += acc, then acc = 0 (N sums; the arrays stay in registers: fully unrolled).
template <typename T, int N>
__device__ __forceinline__ void block_flush(T* tot, T* acc) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
        tot[e] += acc[e];
        acc[e] = T(0);
    }
}

// acc += tot: the last block's sums join the total, which acc then holds.
template <typename T, int N>
__device__ __forceinline__ void block_join(T* acc, const T* tot) {
#pragma unroll
    for (int e = 0; e < N; ++e) acc[e] += tot[e];
}

// A barrier for the first `nthreads` threads of the block only. The 128-thread
// tile types have already retired warps 4..7; __syncthreads() would count on all
// eight. bar.sync with an explicit count (a multiple of 32) is what PTX offers.
template <int NT>
__device__ __forceinline__ void sync_tile() {
    if (NT == 256) {
        __syncthreads();
    } else {
        asm volatile("bar.sync 1, %0;" ::"r"(NT) : "memory");
    }
}

// The same barrier, returning whether any of the tile's threads passed a nonzero
// `pred` (__syncthreads_or for the first NT threads: bar.red.or with a count).
template <int NT>
__device__ __forceinline__ int sync_tile_or(int pred) {
    if (NT == 256) return __syncthreads_or(pred);
    int r;
    asm volatile(TSM_BATCHED_BAR_RED_OR : "=r"(r) : "r"(pred), "r"(NT) : "memory");
    return r;
}

// Split-K (versions 1, 3 and 5; the planner's `splits`). The S tiles of one output
// tile each multiply a chunk of k (multiples of SPLIT_ALIGN, the last one shorter)
// and meet in the pattern of conv.cu: each writes its partial accumulators to the
// problem's workspace (meta column 12; thread-major, so the writes coalesce and the
// reducing block's threads read back exactly what the same threads wrote), counts
// itself on the tile's counter (column 13) after a fence, and the last to arrive
// resets the counter for the next launch, adds the S partials in split order (the
// sum does not depend on which block came last: results are the same run to run)
// and runs the epilogue. Sizes: the host's `split_chunk` is this one.
struct KSplit {
    int kb, kl, s, S;  // first k, k of this chunk, split index, splits (1: none)
};

__device__ __forceinline__ int split_chunk(int K, int S) {
    return ((K + S - 1) / S + TSM_BATCHED_SPLIT_ALIGN - 1) / TSM_BATCHED_SPLIT_ALIGN *
           TSM_BATCHED_SPLIT_ALIGN;
}

__device__ __forceinline__ KSplit k_split(int w, int K) {
    KSplit r;
    r.S = (w >> 12) & 0xff;
    r.s = (w >> 4) & 0xff;
    if (r.S <= 1) {
        r.S = 1;
        r.s = 0;
        r.kb = 0;
        r.kl = K;
    } else {
        const int c = split_chunk(K, r.S);
        r.kb = r.s * c;
        r.kl = min(c, K - r.kb);
    }
    return r;
}

// Called by the NT threads of a split tile after their k loop, with their NACC
// accumulators; true for the block that goes on to store the tile (its acc then
// holds the sum of every split), false for the others. The flag that says which
// lives in the tile's shared memory (`smem`, whose operand slabs every thread has
// finished reading at the first barrier here): no static shared memory per
// instantiation.
template <typename T, int NT, int NACC, int BM, int BN>
__device__ __forceinline__ bool split_combine(T* acc, const long long* p, int m0, int n0,
                                              const KSplit& ks, T* smem) {
    int& last = *reinterpret_cast<int*>(smem);
    constexpr int AREA = NT * NACC;
    const int tid = threadIdx.x;
    const int gn = ((int)p[4] + BN - 1) / BN;
    const long long tile = (long long)(m0 / BM) * gn + n0 / BN;
    T* ws = reinterpret_cast<T*>(p[12]) + tile * ks.S * AREA + tid;
    int* cnt = reinterpret_cast<int*>(p[13]) + tile;
#pragma unroll
    for (int e = 0; e < NACC; ++e) ws[(long long)ks.s * AREA + e * NT] = acc[e];
    __threadfence();  // partials visible device-wide before the count says so
    sync_tile<NT>();
    if (tid == 0) {
        const int prev = atomicAdd(cnt, 1);
        last = prev == ks.S - 1;
        if (last) *cnt = 0;  // every split has arrived: ready for the next launch
    }
    sync_tile<NT>();
    if (!last) return false;
    __threadfence();
    // Every partial from L2 (__ldcg: another SM's L1 may hold none of it, this one's a
    // stale line), this block's own too, added in split order.
#pragma unroll
    for (int e = 0; e < NACC; ++e) acc[e] = __ldcg(ws + e * NT);
    for (int z = 1; z < ks.S; ++z) {
        const T* w = ws + (long long)z * AREA;
#pragma unroll
        for (int e = 0; e < NACC; ++e) acc[e] += __ldcg(w + e * NT);
    }
    return true;
}

// Load N consecutive values from shared memory, 16 bytes at a time where the
// caller guarantees alignment (the row pitch and the thread's offset are multiples
// of 16 bytes), so that a 4x4 micro-tile costs 2 LDS.128 per k step, not 8 LDS.32:
// with scalar loads the shared-memory pipe, not the FMA units, would be the limit.
template <typename T, int N>
__device__ __forceinline__ void lds_vec(T (&dst)[N], const T* src) {
    constexpr int BYTES = N * (int)sizeof(T);
    if constexpr (BYTES % 16 == 0) {
        constexpr int PER = 16 / (int)sizeof(T);
#pragma unroll
        for (int v = 0; v < N / PER; ++v) {
            const float4 q = reinterpret_cast<const float4*>(src)[v];
            const T* s = reinterpret_cast<const T*>(&q);
#pragma unroll
            for (int j = 0; j < PER; ++j) dst[v * PER + j] = s[j];
        }
    } else if constexpr (BYTES % 8 == 0) {
        constexpr int PER = 8 / (int)sizeof(T);
#pragma unroll
        for (int v = 0; v < N / PER; ++v) {
            const float2 q = reinterpret_cast<const float2*>(src)[v];
            const T* s = reinterpret_cast<const T*>(&q);
#pragma unroll
            for (int j = 0; j < PER; ++j) dst[v * PER + j] = s[j];
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) dst[j] = src[j];
    }
}

// One BM x BN tile of C = alpha * A @ B + beta * C, computed by NT threads, each
// owning a TM x TN block of outputs. Shared memory holds one BK-deep slab of A
// (k-major: As[kk][m]) and of B (Bs[kk][n]); the next slab is fetched into
// registers while the current one is multiplied, so global latency overlaps the
// FMAs even at one or two resident blocks per SM.
template <typename T, int BM, int BN, int NT, int TM, int TN>
__device__ __forceinline__ void tile_gemm(const long long* __restrict__ meta, int prob, int m0,
                                          int n0, T alpha, T beta, T* smem) {
    static_assert((BM / TM) * (BN / TN) == NT, "thread grid must cover the tile");
    constexpr int BK = TSM_BATCHED_BK;
    // Row pitch of the slabs: a multiple of 16 bytes (vector loads) plus 16 bytes,
    // so that the transposing store of a k-contiguous operand (consecutive threads
    // walk kk) spreads over banks instead of hitting one bank 16 times.
    constexpr int PAD = 16 / (int)sizeof(T);
    constexpr int LDA = BM + PAD;
    constexpr int LDB = BN + PAD;
    constexpr int LA = BM * BK / NT;  // A elements each thread fetches per slab
    constexpr int LB = BK * BN / NT;
    static_assert(LA * NT == BM * BK && LB * NT == BK * BN, "loads must split evenly");

    const int tid = threadIdx.x;
    if (tid >= NT) return;  // spare warps of the 128-thread types retire here

    const long long* p = meta + (long long)prob * TSM_BATCHED_META_STRIDE;
    const T* __restrict__ A = reinterpret_cast<const T*>(p[0]);
    const T* __restrict__ B = reinterpret_cast<const T*>(p[1]);
    T* __restrict__ C = reinterpret_cast<T*>(p[2]);
    const int M = (int)p[3], N = (int)p[4], K = (int)p[5];
    const long long sAm = p[6], sAk = p[7], sBk = p[8], sBn = p[9], sCm = p[10], sCn = p[11];

    T* As = smem;
    T* Bs = smem + BK * LDA;

    // Which index walks with the thread id when fetching: the unit-stride one, so
    // that a warp's loads coalesce whichever order the operand is stored in.
    const bool a_m_fast = (sAm == 1);
    const bool b_n_fast = (sBn == 1) || (sBk != 1);

    T ra[LA], rb[LB];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int l = 0; l < LA; ++l) {
            const int e = tid + l * NT;
            const int mm = a_m_fast ? (e % BM) : (e / BK);
            const int kk = a_m_fast ? (e / BM) : (e % BK);
            const int gm = m0 + mm, gk = k0 + kk;
            ra[l] = (gm < M && gk < K) ? A[gm * sAm + gk * sAk] : T(0);
        }
#pragma unroll
        for (int l = 0; l < LB; ++l) {
            const int e = tid + l * NT;
            const int nn = b_n_fast ? (e % BN) : (e / BK);
            const int kk = b_n_fast ? (e / BN) : (e % BK);
            const int gn = n0 + nn, gk = k0 + kk;
            rb[l] = (gn < N && gk < K) ? B[gk * sBk + gn * sBn] : T(0);
        }
    };
    auto stash = [&]() {
#pragma unroll
        for (int l = 0; l < LA; ++l) {
            const int e = tid + l * NT;
            const int mm = a_m_fast ? (e % BM) : (e / BK);
            const int kk = a_m_fast ? (e / BM) : (e % BK);
            As[kk * LDA + mm] = ra[l];
        }
#pragma unroll
        for (int l = 0; l < LB; ++l) {
            const int e = tid + l * NT;
            const int nn = b_n_fast ? (e % BN) : (e / BK);
            const int kk = b_n_fast ? (e / BN) : (e % BK);
            Bs[kk * LDB + nn] = rb[l];
        }
    };

    // Thread (ty, tx) owns rows ty*TM .. +TM-1 and columns tx*TN .. +TN-1: contiguous
    // runs, so its fragments are vector loads; a warp spans few ty, so its A reads
    // are broadcasts.
    constexpr int GX = BN / TN;
    const int tx = tid % GX, ty = tid / GX;

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

    const int nk = (K + BK - 1) / BK;
    if (nk > 0) fetch(0);
    for (int s = 0; s < nk; ++s) {
        stash();
        sync_tile<NT>();
        if (s + 1 < nk) fetch((s + 1) * BK);  // in flight during the FMAs below
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            T a[TM], b[TN];
            lds_vec<T, TM>(a, As + kk * LDA + ty * TM);
            lds_vec<T, TN>(b, Bs + kk * LDB + tx * TN);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        // The slab is overwritten by the next stash(): everyone must be done reading.
        sync_tile<NT>();
    }

    // Epilogue. beta == 0 must not read C (C may hold NaN or garbage: BLAS rule).
    const bool read_c = (beta != T(0));
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int gm = m0 + ty * TM + i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int gn = n0 + tx * TN + j;
            if (gn >= N) continue;
            T* c = C + gm * sCm + gn * sCn;
            const T v = alpha * acc[i][j];
            *c = read_c ? fma(beta, *c, v) : v;
        }
    }
}


// One BK-deep slab of a thread's TM x TN outputs from shared memory (versions 1, 3, 4
// and 5's FMA tiles): per k, its rows' and columns' fragments as vectors (SPLIT: rows
// in two runs of TM / 2, BM / 2 apart, and columns likewise), then TM * TN FMAs.
template <typename T, int BM, int BN, int TM, int TN, int BK, int LDA, int LDB, bool SPLIT>
__device__ __forceinline__ void fma_slab(T (&acc)[TM][TN], const T* As, const T* Bs, int ty,
                                         int tx) {
    constexpr bool SPLIT_M = SPLIT, SPLIT_N = SPLIT;
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
        T a[TM], b[TN];
        if constexpr (SPLIT_M) {
            T a0[TM / 2], a1[TM / 2];
            lds_vec<T, TM / 2>(a0, As + kk * LDA + ty * (TM / 2));
            lds_vec<T, TM / 2>(a1, As + kk * LDA + BM / 2 + ty * (TM / 2));
#pragma unroll
            for (int i = 0; i < TM / 2; ++i) {
                a[i] = a0[i];
                a[TM / 2 + i] = a1[i];
            }
        } else {
            lds_vec<T, TM>(a, As + kk * LDA + ty * TM);
        }
        if constexpr (SPLIT_N) {
            T b0[TN / 2], b1[TN / 2];
            lds_vec<T, TN / 2>(b0, Bs + kk * LDB + tx * (TN / 2));
            lds_vec<T, TN / 2>(b1, Bs + kk * LDB + BN / 2 + tx * (TN / 2));
#pragma unroll
            for (int j = 0; j < TN / 2; ++j) {
                b[j] = b0[j];
                b[TN / 2 + j] = b1[j];
            }
        } else {
            lds_vec<T, TN>(b, Bs + kk * LDB + tx * TN);
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
}

// The vector type of 16 or 8 bytes (the epilogues' stores).
template <int BYTES> struct VecOf;
template <> struct VecOf<16> { using type = float4; };
template <> struct VecOf<8> { using type = float2; };

// N consecutive outputs of one row, C[0..N) = alpha * a + beta * C, as 16- or
// 8-byte vectors (the caller checks the alignment and that all N lie inside C).
template <typename T, int N>
__device__ __forceinline__ void epi_run(T* C, const T* a, T alpha, T beta, bool read_c) {
    constexpr int BYTES = N * (int)sizeof(T);
    static_assert(BYTES % 8 == 0, "runs of whole 8-byte vectors");
    constexpr int VB = BYTES % 16 == 0 ? 16 : 8;
    constexpr int PER = VB / (int)sizeof(T);
    using V = typename VecOf<VB>::type;
#pragma unroll
    for (int v = 0; v < N / PER; ++v) {
        V q;
        T* e = reinterpret_cast<T*>(&q);
        if (read_c) q = reinterpret_cast<const V*>(C)[v];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const T x = alpha * a[v * PER + j];
            e[j] = read_c ? fma(beta, e[j], x) : x;
        }
        reinterpret_cast<V*>(C)[v] = q;
    }
}

// The epilogue of those tiles: C = alpha * acc + beta * C for the outputs inside the
// problem (Mt, Nt: rows and columns left from the tile's origin C). beta == 0 does
// not read C (it may hold NaN or garbage: the BLAS rule). A thread's outputs in a
// row come in runs of RUN consecutive columns (two runs, BN / 2 apart, in the SPLIT
// layout); where C's rows are contiguous, a run lies inside C and its address is
// aligned, it is stored as vectors: a warp's store then fills whole sectors (the
// scalar stores of a run of 4 touch 4 sectors each, a quarter of each).
template <typename T, int BM, int BN, int TM, int TN, bool SPLIT>
__device__ __forceinline__ void store_tile(const T (&acc)[TM][TN], T* C, long long sCm,
                                           long long sCn, int Mt, int Nt, int ty, int tx, T alpha,
                                           T beta) {
    constexpr bool SPLIT_M = SPLIT, SPLIT_N = SPLIT;
    constexpr int RUN = SPLIT_N ? TN / 2 : TN;
    constexpr int RB = RUN * (int)sizeof(T);
    // Vector bytes, 0: none. Not for double (version 1's spills at 128 registers).
    constexpr int VB = sizeof(T) != 4 ? 0 : RB % 16 == 0 ? 16 : RB % 8 == 0 ? 8 : 0;
    const bool read_c = (beta != T(0));
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = SPLIT_M ? (i / (TM / 2)) * (BM / 2) + ty * (TM / 2) + i % (TM / 2) : ty * TM + i;
        if (r >= Mt) continue;
#pragma unroll
        for (int u = 0; u < TN / RUN; ++u) {
            const int c0 = SPLIT_N ? u * (BN / 2) + tx * RUN : tx * TN + u * RUN;
            T* cp0 = C + r * sCm + c0 * sCn;
            if constexpr (VB > 0) {
                if (sCn == 1 && c0 + RUN <= Nt &&
                    (reinterpret_cast<unsigned long long>(cp0) & (VB - 1)) == 0) {
                    epi_run<T, RUN>(cp0, &acc[i][u * RUN], alpha, beta, read_c);
                    continue;
                }
            }
#pragma unroll
            for (int j = 0; j < RUN; ++j) {
                if (c0 + j >= Nt) continue;
                T* cp = cp0 + j * sCn;
                const T v = alpha * acc[i][u * RUN + j];
                *cp = read_c ? fma(beta, *cp, v) : v;
            }
        }
    }
}

// Version 2: version 1 with the float tiles of 32 rows or more (32 x 32, 32 x 64 and
// 64 x 64) of problems with K >= 128 on the tensor cores, in 3xTF32 (mma.m16n8k8; common.cuh): x = hi + lo, C += hi*hi +
// hi*lo + lo*hi, as tsm2r_v3x; each 16-deep slab summed in a fresh fragment and
// added to the accumulators by FADD, as v3x does (the MMA's own sums truncate).
// Accuracy. The split costs at most 2^-19 |a b| per product (lo's rounding, 2^-21
// on each side, and the dropped lo*lo, 2^-20), that is 32 units of float32's
// rounding u. The tests hold every kernel to gamma(K + 3) |A| |B|, about (K + 3) u.
// The MMA's rounding is not documented: if each of its sums errs by one ulp, a
// slab's six add 12 u and the FADDs K / 16 u, so the total fits from K >= 44; if
// each of its nine addends may lose an ulp, from K >= 150. The threshold, 128,
// lies between; the tests check the bound elementwise on random data, and tsm2r_v3x
// measured 4e-7 of |C| at K = 20480 this way (cuBLAS SGEMM: 1.2e-6).
// IEEE: a slab holding a non-finite element (block vote) is multiplied with FMAs
// instead, so Inf and NaN come out as they would from the FMA kernel. The bound
// above is relative to |A| |B|; operands below about 2^-116, whose low part falls
// among float32's subnormals, keep less of it (TF32 has float32's exponent range).
// The warps form a 2 x (NT / 64) grid of (BM / 2) x 16 warp tiles (1 or 2 x 2
// fragments); lane (g, t) reads A's rows g, g + 8 at k = t, t + 4 and B's column g
// at k = t, t + 4.
#define TSM_BATCHED_TC_MIN_K 128

template <int BM, int BN, int NT, int BK, int LDA, int LDB, typename Fetch, typename Stash, int LA,
          int LB>
__device__ __forceinline__ void tile_tc_loop(Fetch& fetch, Stash& stash, const float* A,
                                             const float* B, float* C, long long stepA,
                                             long long stepB, int nk, int K, int Mt, int Nt,
                                             long long sCm, long long sCn, const float (&ra)[LA],
                                             const float (&rb)[LB], float alpha, float beta,
                                             float* smem, int SLAB) {
    // Warps in a 2 x WGN grid of (BM / 2) x (BN / WGN) warp tiles, MT x NT8 fragments.
    constexpr int WGN = NT / 64, MT = BM / 32, NT8 = BN / (8 * WGN);
    static_assert(MT >= 1 && NT8 >= 1 && BM % 32 == 0 && BN % (8 * WGN) == 0, "warp tiles");
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int wm0 = (warp & 1) * (BM / 2), wn0 = (warp >> 1) * (BN / WGN);
    float acc[MT][NT8][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
    auto nonfinite = [&]() {
        bool ok = true;
#pragma unroll
        for (int l = 0; l < LA; ++l) ok = ok && fabsf(ra[l]) < __int_as_float(0x7f800000);
#pragma unroll
        for (int l = 0; l < LB; ++l) ok = ok && fabsf(rb[l]) < __int_as_float(0x7f800000);
        return ok ? 0 : 1;
    };
    int bad = 0;
    if (nk > 0) {
        fetch(A, B, K);
        bad = nonfinite();
        stash(smem);
        bad = sync_tile_or<NT>(bad);
    }
    for (int s = 0; s < nk; ++s) {
        const bool more = (s + 1 < nk);
        if (more) {
            A += stepA;
            B += stepB;
            fetch(A, B, K - (s + 1) * BK);
        }
        const float* As = smem + (s & 1) * SLAB;
        const float* Bs = As + BK * LDA;
        if (!bad) {
            // The slab's products in a fresh fragment, added to acc by an IEEE FADD:
            // the MMA's own sums truncate, so it only ever sums 16-deep pieces.
            float part[MT][NT8][4];
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT8; ++j)
#pragma unroll
                    for (int c = 0; c < 4; ++c) part[i][j][c] = 0.f;
#pragma unroll
            for (int k8 = 0; k8 < BK; k8 += 8) {
                unsigned bh[NT8][2], bl[NT8][2];
#pragma unroll
                for (int nt = 0; nt < NT8; ++nt) {
                    const float* b = Bs + (k8 + tq) * LDB + wn0 + nt * 8 + gq;
                    const float x0 = b[0], x1 = b[4 * LDB];
                    bh[nt][0] = __float_as_uint(x0);
                    bh[nt][1] = __float_as_uint(x1);
                    bl[nt][0] = tf32_low(x0);
                    bl[nt][1] = tf32_low(x1);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const float* a = As + (k8 + tq) * LDA + wm0 + mt * 16 + gq;
                    const float x[4] = {a[0], a[8], a[4 * LDA], a[4 * LDA + 8]};
                    unsigned ah[4], al[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        ah[q] = __float_as_uint(x[q]);
                        al[q] = tf32_low(x[q]);
                    }
#pragma unroll
                    for (int nt = 0; nt < NT8; ++nt) {
                        mma_tf32_16x8x8(part[mt][nt], al, bh[nt][0], bh[nt][1]);
                        mma_tf32_16x8x8(part[mt][nt], ah, bl[nt][0], bl[nt][1]);
                        mma_tf32_16x8x8(part[mt][nt], ah, bh[nt][0], bh[nt][1]);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT8; ++j)
#pragma unroll
                    for (int c = 0; c < 4; ++c) acc[i][j][c] += part[i][j][c];
        } else {
            // A non-finite element in this slab (anywhere in the tile): FMAs. (The
            // element loop is unrolled so that acc keeps static indices: registers.)
#pragma unroll
            for (int e = 0; e < MT * NT8 * 4; ++e) {
                const int mt = e / (NT8 * 4), nt = (e / 4) % NT8, c = e & 3;
                const int r = wm0 + mt * 16 + gq + 8 * (c >> 1);
                const int col = wn0 + nt * 8 + 2 * tq + (c & 1);
                float v = 0.f;
#pragma unroll 1
                for (int kk = 0; kk < BK; ++kk) v = fmaf(As[kk * LDA + r], Bs[kk * LDB + col], v);
                acc[mt][nt][c] += v;
            }
        }
        int nbad = 0;
        if (more) {  // the other buffer was last read in step s - 1
            nbad = nonfinite();
            stash(smem + ((s + 1) & 1) * SLAB);
        }
        bad = sync_tile_or<NT>(nbad);
    }

    const bool read_c = (beta != 0.f);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = wm0 + mt * 16 + gq + 8 * (c >> 1);
                const int col = wn0 + nt * 8 + 2 * tq + (c & 1);
                if (r >= Mt || col >= Nt) continue;
                float* cp = C + (r * (int)sCm + col * (int)sCn);  // < 64 * 2^24: int
                const float v = alpha * acc[mt][nt][c];
                *cp = read_c ? fmaf(beta, *cp, v) : v;
            }
}

// Version 2, float64: the same tiles on the FP64 tensor cores (DMMA, mma.m8n8k4.f64;
// common.cuh), for every K: its products and sums are float64 operations as IEEE
// defines them, so there is no accuracy cost and Inf and NaN propagate as with FMAs.
// The warps form a 2 x (NT / 64) grid of (BM / 2) x 16 warp tiles of 8 x 8
// fragments; per 4-deep k-step lane (g, t) reads A's row g and B's column g at
// k = t. Rows are padded by 4 doubles, so that the 16 lanes of each half-warp's
// 8-byte reads (8t + 2g mod 32) hit distinct bank pairs.
template <int BM, int BN, int NT, int BK, int LDA, int LDB, typename Fetch, typename Stash>
__device__ __forceinline__ void tile_dmma_loop(Fetch& fetch, Stash& stash, const double* A,
                                               const double* B, double* C, long long stepA,
                                               long long stepB, int nk, int K, int Mt, int Nt,
                                               long long sCm, long long sCn, double alpha,
                                               double beta, double* smem, int SLAB) {
    constexpr int WGN = NT / 64, MT = BM / 16, NT8 = BN / (8 * WGN);
    static_assert(MT >= 1 && NT8 >= 1 && BM % 16 == 0 && BN % (8 * WGN) == 0, "warp tiles");
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int wm0 = (warp & 1) * (BM / 2), wn0 = (warp >> 1) * (BN / WGN);
    double acc[MT][NT8][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT8; ++j) acc[i][j][0] = acc[i][j][1] = 0.0;
    // Blocked accumulation where the second set of sums fits the registers (not the
    // 64 x 64 tiles' 16 doubles a thread: it spills).
    constexpr bool BLOCKED = MT * NT8 * 2 <= TSM_BATCHED_BLOCKED_MAX;
    constexpr int FLUSH = TSM_BATCHED_BLOCK_K / BK;  // slabs a block
    double tot[BLOCKED ? MT * NT8 * 2 : 1];
#pragma unroll
    for (int e = 0; e < (BLOCKED ? MT * NT8 * 2 : 1); ++e) tot[e] = 0.0;
    if (nk > 0) {
        fetch(A, B, K);
        stash(smem);
        sync_tile<NT>();
    }
    for (int s = 0; s < nk; ++s) {
        const bool more = (s + 1 < nk);
        if (more) {
            A += stepA;
            B += stepB;
            fetch(A, B, K - (s + 1) * BK);
        }
        const double* As = smem + (s & 1) * SLAB;
        const double* Bs = As + BK * LDA;
#pragma unroll
        for (int k4 = 0; k4 < BK; k4 += 4) {
            double b[NT8];
#pragma unroll
            for (int nt = 0; nt < NT8; ++nt) b[nt] = Bs[(k4 + tq) * LDB + wn0 + nt * 8 + gq];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const double a = As[(k4 + tq) * LDA + wm0 + mt * 8 + gq];
#pragma unroll
                for (int nt = 0; nt < NT8; ++nt) dmma_8x8x4(acc[mt][nt], a, b[nt]);
            }
        }
        if constexpr (BLOCKED) {
            if (s % FLUSH == FLUSH - 1) block_flush<double, MT * NT8 * 2>(tot, &acc[0][0][0]);
        }
        if (more) stash(smem + ((s + 1) & 1) * SLAB);  // last read in step s - 1
        sync_tile<NT>();
    }
    if constexpr (BLOCKED) block_join<double, MT * NT8 * 2>(&acc[0][0][0], tot);

    const bool read_c = (beta != 0.0);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int r = wm0 + mt * 8 + gq;
                const int col = wn0 + nt * 8 + 2 * tq + c;
                if (r >= Mt || col >= Nt) continue;
                double* cp = C + (r * (int)sCm + col * (int)sCn);  // < 64 * 2^24: int
                const double v = alpha * acc[mt][nt][c];
                *cp = read_c ? fma(beta, *cp, v) : v;
            }
}

// Version 1 (the default): the same tile, two changes where version 0 spent its time.
// (a) Two shared-memory slabs: the next slab is stored into the other buffer while
//     this one is read, so one barrier per 16-deep step instead of two (with three
//     blocks per SM, every barrier stalls a third of the SM's warps).
// (b) In-tile offsets in 32-bit arithmetic from a per-slab base pointer: version 0
//     formed a 64-bit address per element (two 64-bit multiply-adds and compares
//     for every load, as many instructions as the FMAs they feed on a 16x16 tile).
//     The launcher uses this version only when every |stride| < 2**24, so that an
//     offset (< 64 rows x 16 k) cannot overflow int.
//
// SPLIT (the wide types of versions 3 and 4, 8 x 4 and 8 x 8 outputs a thread): a
// thread's rows are two runs of TM / 2, BM / 2 apart, and its columns likewise, so
// that the 16 threads of a half-warp read consecutive vectors of a B row
// (conflict-free) where one run of 8 would put two of every eight threads on the
// same banks. Measured on the H100 for 128 x 64, splitting its runs of
// 4 columns too (two 8-byte reads) beat one 16-byte read, by the register
// allocation it leads to (36 against 48 bytes of spills at 80 registers).
template <typename T, int BM, int BN, int NT, int TM, int TN, bool TC = false, bool SPLIT = false,
          int BK = TSM_BATCHED_BK>
__device__ __forceinline__ void tile_gemm_v1(const long long* __restrict__ meta, int prob, int m0,
                                             int n0, T alpha, T beta, T* smem,
                                             const KSplit& ks = KSplit{0, 0, 0, 1}) {
    static_assert((BM / TM) * (BN / TN) == NT, "thread grid must cover the tile");
    static_assert(!TC || (BM % 32 == 0 && NT % 64 == 0),
                  "TC: warps in a 2 x (NT / 64) grid, 16 rows or more each");
    // TC: rows padded by 8 floats or 4 doubles (32 bytes), so that the tensor-core
    // fragment reads are free of bank conflicts.
    constexpr int PAD = TC ? 32 / (int)sizeof(T) : 16 / (int)sizeof(T);
    constexpr int LDA = BM + PAD;
    constexpr int LDB = BN + PAD;
    constexpr int SLAB = BK * LDA + BK * LDB;  // one A slab and one B slab
    constexpr int LA = BM * BK / NT;
    constexpr int LB = BK * BN / NT;
    static_assert(LA * NT == BM * BK && LB * NT == BK * BN, "loads must split evenly");

    const int tid = threadIdx.x;
    if (tid >= NT) return;  // spare warps of the 128-thread types retire here

    const long long* p = meta + (long long)prob * TSM_BATCHED_META_STRIDE;
    const int M = (int)p[3], N = (int)p[4], K = ks.S > 1 ? ks.kl : (int)p[5];
    const long long sAm = p[6], sAk = p[7], sBk = p[8], sBn = p[9], sCm = p[10], sCn = p[11];
    // Tile origins in 64-bit once; everything inside the tile in 32-bit.
    const T* __restrict__ A = reinterpret_cast<const T*>(p[0]) + m0 * sAm + ks.kb * sAk;
    const T* __restrict__ B = reinterpret_cast<const T*>(p[1]) + n0 * sBn + ks.kb * sBk;
    T* __restrict__ C = reinterpret_cast<T*>(p[2]) + m0 * sCm + n0 * sCn;
    const int am = (int)sAm, ak = (int)sAk, bk = (int)sBk, bn = (int)sBn;
    const int Mt = M - m0, Nt = N - n0;  // rows / columns of C left from the origin

    const bool a_m_fast = (sAm == 1);
    const bool b_n_fast = (sBn == 1) || (sBk != 1);

    T ra[LA], rb[LB];
    // Element l of this thread's share: (row or column, k) inside the slab. With NT
    // a multiple of BM, BN and BK (every type), both coordinates are linear in l:
    // LIN (32 outputs a thread or more) keeps just the first element and the steps
    // (its accumulators leave no room for a hoisted offset per element), the others
    // let the compiler hoist.
    static_assert(NT % BM == 0 && NT % BN == 0 && NT % BK == 0, "linear shares");
    constexpr bool LIN = TM * TN >= 32;
    const int a_m0 = a_m_fast ? tid % BM : tid / BK, a_k0 = a_m_fast ? tid / BM : tid % BK;
    const int a_dm = a_m_fast ? 0 : NT / BK, a_dk = a_m_fast ? NT / BM : 0;
    const int b_n0 = b_n_fast ? tid % BN : tid / BK, b_k0 = b_n_fast ? tid / BN : tid % BK;
    const int b_dn = b_n_fast ? 0 : NT / BK, b_dk = b_n_fast ? NT / BN : 0;
    auto a_mk = [&](int l, int& mm, int& kk) {
        if constexpr (LIN) {
            mm = a_m0 + l * a_dm;
            kk = a_k0 + l * a_dk;
        } else {
            const int e = tid + l * NT;
            mm = a_m_fast ? (e % BM) : (e / BK);
            kk = a_m_fast ? (e / BM) : (e % BK);
        }
    };
    auto b_nk = [&](int l, int& nn, int& kk) {
        if constexpr (LIN) {
            nn = b_n0 + l * b_dn;
            kk = b_k0 + l * b_dk;
        } else {
            const int e = tid + l * NT;
            nn = b_n_fast ? (e % BN) : (e / BK);
            kk = b_n_fast ? (e / BN) : (e % BK);
        }
    };
    auto fetch = [&](const T* __restrict__ a, const T* __restrict__ b, int Kt) {
#pragma unroll
        for (int l = 0; l < LA; ++l) {
            int mm, kk;
            a_mk(l, mm, kk);
            ra[l] = (mm < Mt && kk < Kt) ? a[mm * am + kk * ak] : T(0);
        }
#pragma unroll
        for (int l = 0; l < LB; ++l) {
            int nn, kk;
            b_nk(l, nn, kk);
            rb[l] = (nn < Nt && kk < Kt) ? b[kk * bk + nn * bn] : T(0);
        }
    };
    auto stash = [&](T* buf) {
        T* As = buf;
        T* Bs = buf + BK * LDA;
#pragma unroll
        for (int l = 0; l < LA; ++l) {
            int mm, kk;
            a_mk(l, mm, kk);
            As[kk * LDA + mm] = ra[l];
        }
#pragma unroll
        for (int l = 0; l < LB; ++l) {
            int nn, kk;
            b_nk(l, nn, kk);
            Bs[kk * LDB + nn] = rb[l];
        }
    };

    const int nk = (K + BK - 1) / BK;
    const long long stepA = (long long)BK * sAk, stepB = (long long)BK * sBk;
    if constexpr (TC && sizeof(T) == 8) {
        tile_dmma_loop<BM, BN, NT, BK, LDA, LDB>(fetch, stash, A, B, C, stepA, stepB, nk, K, Mt,
                                                 Nt, sCm, sCn, alpha, beta, smem, SLAB);
        return;
    } else if constexpr (TC) {
        if (K >= TSM_BATCHED_TC_MIN_K) {
            tile_tc_loop<BM, BN, NT, BK, LDA, LDB>(fetch, stash, A, B, C, stepA, stepB, nk, K, Mt, Nt,
                                       sCm, sCn, ra, rb, alpha, beta, smem, SLAB);
            return;
        }
    }

    constexpr int GX = BN / TN;
    const int tx = tid % GX, ty = tid / GX;

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
    constexpr bool BLOCKED = TM * TN <= TSM_BATCHED_BLOCKED_MAX;
    constexpr int FLUSH = TSM_BATCHED_BLOCK_K / BK;  // slabs a block
    T tot[BLOCKED ? TM * TN : 1];
#pragma unroll
    for (int e = 0; e < (BLOCKED ? TM * TN : 1); ++e) tot[e] = T(0);

    if (nk > 0) {
        fetch(A, B, K);
        stash(smem);
        sync_tile<NT>();
    }
    for (int s = 0; s < nk; ++s) {
        const bool more = (s + 1 < nk);
        if (more) {  // next slab's loads in flight during the FMAs below
            A += stepA;
            B += stepB;
            fetch(A, B, K - (s + 1) * BK);
        }
        const T* As = smem + (s & 1) * SLAB;
        const T* Bs = As + BK * LDA;
        fma_slab<T, BM, BN, TM, TN, BK, LDA, LDB, SPLIT>(acc, As, Bs, ty, tx);
        if constexpr (BLOCKED) {
            if (s % FLUSH == FLUSH - 1) block_flush<T, TM * TN>(tot, &acc[0][0]);
        }
        // The other buffer was last read in step s - 1, before the previous barrier.
        if (more) stash(smem + ((s + 1) & 1) * SLAB);
        sync_tile<NT>();
    }
    if constexpr (BLOCKED) block_join<T, TM * TN>(&acc[0][0], tot);

    if (ks.S > 1 && !split_combine<T, NT, TM * TN, BM, BN>(&acc[0][0], p, m0, n0, ks, smem)) return;
    store_tile<T, BM, BN, TM, TN, SPLIT>(acc, C, sCm, sCn, Mt, Nt, ty, tx, alpha, beta);
}

// One element, global -> shared, asynchronously: `dst` is the shared-memory address
// (32-bit, as cp.async takes it; a generic pointer costs registers in the k loop),
// !ok writes a zero (src-size 0) and reads nothing. Off the GPU (the host build of
// the tests, where smem_u32 is 0) a plain copy into smem at byte offset dst.
template <typename T>
__device__ __forceinline__ void cp_elem(T* smem, unsigned dst, const T* src, bool ok) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(sizeof(T)), "r"(ok ? (int)sizeof(T) : 0));
#else
    smem[dst / sizeof(T)] = ok ? *src : T(0);
#endif
}

// ldmatrix.x4 of four 8 x 4 float matrices from shared memory: lane l passes the
// word offset (from smem) of row l % 8 of matrix l / 8; r[i] gets matrix i's element
// (lane / 4, lane % 4). `origin` holds the four matrices' first words, which only
// the host build of the tests reads (it has no ldmatrix: it reads the elements).
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const float* smem, int lane_word,
                                        const int (&origin)[4], int lane, int LD) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(smem) + (unsigned)lane_word * 4u));
    (void)origin;
    (void)lane;
    (void)LD;
#else
    (void)lane_word;
    for (int i = 0; i < 4; ++i)
        r[i] = __float_as_uint(smem[origin[i] + (lane >> 2) * LD + (lane & 3)]);
#endif
}

// One operand's share of a slab, copied by this thread into the ring (versions 5's
// tile kernels): its l-th element (i = l % RP, j = l / RP) is row r0 + i dr, k k0 + i
// dk + j KJ of the slab, at global offset i gr + j gj from g and shared-memory word i
// sr + j SJ from byte address s0. full: every element inside the problem (a constant
// at each call: the inlined copy has no predicates); else rows from Rt and k from Kt
// on read zeros.
template <typename T, int L, int RP, int KJ, int SJ>
__device__ __forceinline__ void copy_share(T* smem, unsigned s0, const T* g, const T* any, int gr,
                                           int gj, int sr, int r0, int dr, int k0, int dk, int Rt,
                                           int Kt, bool full) {
#pragma unroll
    for (int l = 0; l < L; ++l) {
        const int i = l % RP, j = l / RP;
        const bool ok = full || (r0 + i * dr < Rt && k0 + i * dk + KJ * j < Kt);
        cp_elem(smem, s0 + (unsigned)(i * sr + j * SJ) * (unsigned)sizeof(T),
                ok ? g + (i * gr + j * gj) : any, ok);
    }
}

// The ring both tile kernels of version 5 run. fetch(full, slab, slot) copies a slab
// (full: no edge in it); slabs from nfull on have edges, none past nk exist.
// ring_fill puts slabs 0 .. STAGES - 2 in flight; ring_next, at step s, waits for
// slab s (this thread's copies, then everyone's at the barrier, which also ends every
// read of the slot step s - 1 used), refills that slot with slab s + STAGES - 1 and
// returns the slot to read. One commit group a slab, empty ones past the end.
template <typename Fetch>
__device__ __forceinline__ void ring_put(Fetch& fetch, int f, int slot, int nk, int nfull) {
    if (f < nfull) {
        fetch(true, f, slot);
    } else if (f < nk) {
        fetch(false, f, slot);
    }
    cp_async_commit();
}

template <int STAGES, typename Fetch>
__device__ __forceinline__ void ring_fill(Fetch& fetch, int nk, int nfull) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) ring_put(fetch, s, s, nk, nfull);
}

template <int STAGES, int NT, typename Fetch>
__device__ __forceinline__ int ring_next(Fetch& fetch, int s, int nk, int nfull, int& rd, int& wr) {
    cp_async_wait<STAGES - 2>();
    sync_tile<NT>();
    ring_put(fetch, s + STAGES - 1, wr, nk, nfull);
    const int slot = rd;
    rd = rd == STAGES - 1 ? 0 : rd + 1;
    wr = wr == STAGES - 1 ? 0 : wr + 1;
    return slot;
}

// Version 5's FMA tiles of 256 threads (32 x 64, 64 x 64, 128 x 64, and 128 x 128
// where K < TC_MIN_K) with their operands copied by 4-byte cp.async into a ring of
// STAGES slabs of BK k each (16; 128 x 128: XSTAGES of 8): no staging registers, no
// load-then-store pair per element, STAGES - 1 slabs in flight while one is
// multiplied, one barrier a slab. 4 bytes a copy because
// the batch's rows need not be 16-byte aligned (K, N of any size). The element map
// of a slab: along the operand's unit stride if it has one on the tile's long side
// (m for A, n for B: a warp copies 32 consecutive elements), else 8 consecutive k of
// 4 rows a warp (one 32-byte sector a row; with the row pitch = 4 mod 32 words the
// 32 writes of the transposing copy hit 32 banks). Either map is, in the thread's
// l-th element, base + (l % RP) * step_r + (l / RP) * step_k (RP = rows / 32), so
// the offsets are a few runtime steps, not a division per element. The k loop, the
// fragment reads and the epilogue are version 1's.
template <typename T, int BM, int BN, int NT, int TM, int TN, bool SPLIT = false,
          int BK = TSM_BATCHED_BK, int STAGES = TSM_BATCHED_STAGES>
__device__ __forceinline__ void tile_gemm_cp(const long long* __restrict__ meta, int prob, int m0,
                                             int n0, T alpha, T beta, T* smem,
                                             const KSplit& ks = KSplit{0, 0, 0, 1}) {
    static_assert((BM / TM) * (BN / TN) == NT, "thread grid must cover the tile");
    static_assert(NT == 256 && BM % 32 == 0 && BN % 32 == 0 && BK % 8 == 0,
                  "element maps: 32 rows x 8 k a pass");
    constexpr int PAD = 16 / (int)sizeof(T);
    constexpr int LDA = BM + PAD;
    constexpr int LDB = BN + PAD;
    constexpr int SLAB = BK * LDA + BK * LDB;
    constexpr int LA = BM * BK / NT;
    constexpr int LB = BK * BN / NT;
    constexpr int RPA = BM / 32, RPB = BN / 32;  // passes over the rows before k moves on
    static_assert(LA % RPA == 0 && LB % RPB == 0, "whole passes");

    const int tid = threadIdx.x;
    const long long* p = meta + (long long)prob * TSM_BATCHED_META_STRIDE;
    const int K = ks.S > 1 ? ks.kl : (int)p[5];
    const int am = (int)p[6], ak = (int)p[7], bk = (int)p[8], bn = (int)p[9];
    const int Mt = (int)p[3] - m0, Nt = (int)p[4] - n0;

    // The thread's first element (row, k) of a slab and the steps between its
    // elements, in rows and k (for the edge predicates), global elements and
    // shared-memory words; kept to a few registers beside the accumulators.
    const bool a_m_fast = (am == 1);
    const bool b_n_fast = (bn == 1) || (bk != 1);
    const int a_r0 = a_m_fast ? tid % BM : tid / 8, a_k0 = a_m_fast ? tid / BM : tid % 8;
    const int a_dr = a_m_fast ? 0 : 32, a_dk = a_m_fast ? NT / BM : 0;  // per l % RPA
    const int b_r0 = b_n_fast ? tid % BN : tid / 8, b_k0 = b_n_fast ? tid / BN : tid % 8;
    const int b_dr = b_n_fast ? 0 : 32, b_dk = b_n_fast ? NT / BN : 0;
    // l / RP moves k by RP * dk (unit-stride map: NT / 32 = 8) or by 8 (k map).
    const int a_gr = a_dr * am + a_dk * ak, b_gr = b_dr * bn + b_dk * bk;
    const int a_sr = a_dk * LDA + a_dr, b_sr = b_dk * LDB + b_dr;
    // Pointers to the thread's first element of slab 0; a slab is BK * ak further.
    const T* pa = reinterpret_cast<const T*>(p[0]) + ((long long)m0 * am + (long long)ks.kb * ak) +
                  (a_r0 * am + a_k0 * ak);
    const T* pb = reinterpret_cast<const T*>(p[1]) + ((long long)n0 * bn + (long long)ks.kb * bk) +
                  (b_r0 * bn + b_k0 * bk);
    const unsigned sa0 = smem_u32(smem) + (unsigned)(a_k0 * LDA + a_r0) * (unsigned)sizeof(T);
    const unsigned sb0 = smem_u32(smem) + (unsigned)(BK * LDA + b_k0 * LDB + b_r0) * (unsigned)sizeof(T);

    // Copy slab `s` into ring slot `buf`; full: every element of it lies inside the
    // problem (called with a constant: the inlined copy has no predicates).
    auto fetch = [&](bool full, int s, int buf) {
        const int Kt = K - s * BK;
        const unsigned slot = (unsigned)(buf * SLAB) * (unsigned)sizeof(T);
        copy_share<T, LA, RPA, 8, 8 * LDA>(smem, sa0 + slot, pa + s * (BK * ak), pa, a_gr, 8 * ak,
                                          a_sr, a_r0, a_dr, a_k0, a_dk, Mt, Kt, full);
        copy_share<T, LB, RPB, 8, 8 * LDB>(smem, sb0 + slot, pb + s * (BK * bk), pb, b_gr, 8 * bk,
                                          b_sr, b_r0, b_dr, b_k0, b_dk, Nt, Kt, full);
    };

    const int nk = (K + BK - 1) / BK;
    const int nfull = (Mt >= BM && Nt >= BN) ? K / BK : 0;  // slabs with no edge in them
    ring_fill<STAGES>(fetch, nk, nfull);

    constexpr int GX = BN / TN;
    const int tx = tid % GX, ty = tid / GX;
    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
    constexpr bool BLOCKED = TSM_BATCHED_BLOCKED_CP && TM * TN <= TSM_BATCHED_BLOCKED_MAX_CP;
    constexpr int FLUSH = TSM_BATCHED_BLOCK_K / BK;  // slabs a block
    T tot[BLOCKED ? TM * TN : 1];
#pragma unroll
    for (int e = 0; e < (BLOCKED ? TM * TN : 1); ++e) tot[e] = T(0);

    int rd = 0, wr = STAGES - 1;  // ring slots read and written this step
    for (int s = 0; s < nk; ++s) {
        const T* As = smem + ring_next<STAGES, NT>(fetch, s, nk, nfull, rd, wr) * SLAB;
        const T* Bs = As + BK * LDA;
        fma_slab<T, BM, BN, TM, TN, BK, LDA, LDB, SPLIT>(acc, As, Bs, ty, tx);
        if constexpr (BLOCKED) {
            if (s % FLUSH == FLUSH - 1) block_flush<T, TM * TN>(tot, &acc[0][0]);
        }
    }
    if constexpr (BLOCKED) block_join<T, TM * TN>(&acc[0][0], tot);
    cp_async_wait<0>();  // nothing is in flight past the end (empty groups only)

    // C's pointer and strides, read only now (registers are for the k loop).
    const long long sCm = p[10], sCn = p[11];
    T* __restrict__ C = reinterpret_cast<T*>(p[2]) + m0 * sCm + n0 * sCn;
    if (ks.S > 1 && !split_combine<T, NT, TM * TN, BM, BN>(&acc[0][0], p, m0, n0, ks, smem)) return;
    store_tile<T, BM, BN, TM, TN, SPLIT>(acc, C, sCm, sCn, Mt, Nt, ty, tx, alpha, beta);
}

// The 3xTF32 split of version 5's tensor-core tiles, in place: x's bits in `h` become
// hi = x rounded to TF32 to nearest (ties away), and `l` gets lo = x - hi (exact) as
// tf32_low passes it (the MMA truncates it to TF32). One integer op more than
// tf32_low's split, whose hi is the MMA's truncation of x: |lo| <= 2^-11 |x| instead
// of 2^-10, so the error of lo's own rounding and of the dropped lo * lo term is 4x
// smaller (batched/numerics.py: the 3xTF32 tiles' error on signed data within 1.5x
// of float32 FMAs in the same blocked order, against 2.5x with truncation). A finite
// x within 2^-11 of FLT_MAX rounds to Inf: hi * hi is then Inf and lo NaN, and the
// tile is redone with FMAs (tc3_redo_nonfinite), as for an Inf operand.
__device__ __forceinline__ void tf32_split_rn(unsigned& h, unsigned& l) {
    const float x = __uint_as_float(h);
    h = (h + 0x1000u) & 0xffffe000u;
    l = __float_as_uint(x - __uint_as_float(h)) + 0x1000u;
}

// Where a warp's fragments lie in a 128 x 128 tensor-core tile: version 5's
// mma.sync tiles give each warp 64 x 32 (a 2 x 4 grid of warps, MT = 4 rows and NT8
// = 4 columns of m16n8 fragments); version 6's warpgroups each own 64 rows and all
// 128 columns, a warp 16 of those rows (MT = 1, NT8 = 16). Within a fragment,
// element c of lane (g = lane / 4, t = lane % 4) is row g + 8 (c / 2), column
// 2 t + c % 2 in both (wgmma's accumulators are mma.sync's, m16n8 after m16n8).
template <int MT>
__device__ __forceinline__ void tc_warp_origin(int warp, int& wm0, int& wn0) {
    static_assert(MT == 4 || MT == 1, "the two warp grids built");
    if constexpr (MT == 4) {
        wm0 = (warp & 1) * 64;
        wn0 = (warp >> 1) * 32;
    } else {
        wm0 = (warp >> 2) * 64 + (warp & 3) * 16;
        wn0 = 0;
    }
}

// The end of a tensor-core tile (fragments of m16n8, laid out by tc_warp_origin):
// the split-K hand-off, then C = alpha * acc + beta * C. Each lane holds pairs of
// neighbouring columns: stored as 8-byte vectors where C's rows are contiguous and the
// pair is inside C and aligned (a warp's store then fills 8 whole sectors, where two
// scalar stores half-fill them twice).
template <typename T, int MT, int NT8>
__device__ __forceinline__ void tc3_finish(float (&acc)[MT][NT8][4], const long long* p, int m0,
                                           int n0, const KSplit& ks, T* smem, T alpha, T beta) {
    if (ks.S > 1 && !split_combine<T, 256, MT * NT8 * 4, 128, 128>(&acc[0][0][0], p, m0, n0, ks, smem))
        return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    int wm0, wn0;
    tc_warp_origin<MT>(warp, wm0, wn0);
    const int Mt = (int)p[3] - m0, Nt = (int)p[4] - n0;
    const long long sCm = p[10], sCn = p[11];
    T* __restrict__ C = reinterpret_cast<T*>(p[2]) + m0 * sCm + n0 * sCn;
    const bool read_c = (beta != T(0));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm0 + mt * 16 + gq + 8 * h;
                const int col = wn0 + nt * 8 + 2 * tq;
                if (r >= Mt) continue;
                T* cp0 = C + (r * sCm + col * sCn);
                if (sCn == 1 && col + 2 <= Nt &&
                    (reinterpret_cast<unsigned long long>(cp0) & 7) == 0) {
                    epi_run<T, 2>(cp0, &acc[mt][nt][2 * h], alpha, beta, read_c);
                    continue;
                }
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    if (col + c >= Nt) continue;
                    T* cp = cp0 + c * sCn;
                    const T v = alpha * acc[mt][nt][2 * h + c];
                    *cp = read_c ? fmaf(beta, *cp, v) : v;
                }
            }
}

// A tensor-core tile whose 3xTF32 sums came out Inf or NaN, multiplied again from
// global memory with FMAs in k order (each thread its own outputs), so that its Inf
// and NaN are the FMA tiles'. Out of line: the accumulators of the tile it replaces
// are dead by then, and inlined its loop costs the tensor-core path spills.
template <typename T, int MT, int NT8>
__device__ __noinline__ void tc3_fma_tile(const long long* p, int m0, int n0, T alpha, T beta,
                                          T* smem, KSplit ks) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    int wm0, wn0;
    tc_warp_origin<MT>(warp, wm0, wn0);
    const int Mt = (int)p[3] - m0, Nt = (int)p[4] - n0;
    const int K = ks.S > 1 ? ks.kl : (int)p[5];
    const long long am = p[6], ak = p[7], bk = p[8], bn = p[9];
    const T* A0 = reinterpret_cast<const T*>(p[0]) + (m0 * am + ks.kb * ak);
    const T* B0 = reinterpret_cast<const T*>(p[1]) + (n0 * bn + ks.kb * bk);
    float acc[MT][NT8][4];
#pragma unroll  // (acc indexed by constants: a loop index would put it in local memory)
    for (int e = 0; e < MT * NT8 * 4; ++e) {
        const int mt = e / (NT8 * 4), nt = (e / 4) % NT8, c = e & 3;
        const int r = wm0 + mt * 16 + gq + 8 * (c >> 1);
        const int col = wn0 + nt * 8 + 2 * tq + (c & 1);
        float v = 0.f;
        if (r < Mt && col < Nt) {
            const T* a = A0 + r * am;
            const T* b = B0 + col * bn;
#pragma unroll 1
            for (int k = 0; k < K; ++k) v = fmaf(a[k * ak], b[k * bk], v);
        }
        acc[mt][nt][c] = v;
    }
    tc3_finish<T>(acc, p, m0, n0, ks, smem, alpha, beta);
}

// Inf or NaN among a tile's operands makes its 3xTF32 sums NaN (the low part of an
// infinity's split is Inf - Inf), as does a sum that overflows. Such a tile (a block
// vote) is multiplied again from global memory with FMAs in k order, so its Inf and
// NaN come out as the FMA tiles' do; a finite tile pays one test an accumulator
// instead of a vote a slab. True where the tile was finished that way.
template <typename T, int MT, int NT8>
__device__ __forceinline__ bool tc3_redo_nonfinite(const float (&acc)[MT][NT8][4], const long long* p,
                                                   int m0, int n0, T alpha, T beta, T* smem,
                                                   const KSplit& ks) {
    int bad = 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
            for (int c = 0; c < 4; ++c) bad |= !(fabsf(acc[mt][nt][c]) <= 3.402823466e38f);
    if (!sync_tile_or<256>(bad)) return false;
    tc3_fma_tile<T, MT, NT8>(p, m0, n0, alpha, beta, smem, ks);
    return true;
}

// The problem of a 128 x 128 tensor-core tile (versions 5 and 6) and this thread's
// share of its copies: element l of a slab is row r0 + 64 (l % 2), k k0 + 4 (l / 2),
// r0 = 8 warp + lane % 8, k0 = lane / 8 (a warp copies 8 rows x 4 k, one 32-bank
// block of shared memory in either tile's layout); pa and pb point at the thread's
// first element of slab 0.
template <typename T>
struct TcCopy {
    int K, am, ak, bk, bn, Mt, Nt, r0, k0;
    const T* pa;
    const T* pb;
};

template <typename T>
__device__ __forceinline__ TcCopy<T> tc_copy(const long long* p, int m0, int n0, const KSplit& ks,
                                              int lane, int warp) {
    TcCopy<T> c;
    c.K = ks.S > 1 ? ks.kl : (int)p[5];
    c.am = (int)p[6];
    c.ak = (int)p[7];
    c.bk = (int)p[8];
    c.bn = (int)p[9];
    c.Mt = (int)p[3] - m0;
    c.Nt = (int)p[4] - n0;
    c.r0 = warp * 8 + (lane & 7);
    c.k0 = lane >> 3;
    c.pa = reinterpret_cast<const T*>(p[0]) + ((long long)m0 * c.am + (long long)ks.kb * c.ak) +
           (c.r0 * c.am + c.k0 * c.ak);
    c.pb = reinterpret_cast<const T*>(p[1]) + ((long long)n0 * c.bn + (long long)ks.kb * c.bk) +
           (c.r0 * c.bn + c.k0 * c.bk);
    return c;
}

// Version 5's 128 x 128 tiles of problems with K >= TC_MIN_K on the tensor cores,
// 3xTF32 (mma.m16n8k8, as version 2 and tsm2r_v3x: x = hi + lo, C += lo*hi + hi*lo +
// hi*hi), fed by a ring of STAGES slabs of BK = 16 k (two 8-deep MMA steps a
// barrier; in dynamic shared memory) of 4-byte cp.async copies. Both operands sit
// k-contiguous in shared memory (As[m][k], Bs[n][k], rows of BK + 4 words: 16-byte
// aligned for ldmatrix, whose 8 row addresses then fall on 8 different bank quads),
// so every fragment is an ldmatrix.x4: per warp and 8-deep step, 6 of them feed 48
// MMAs. Copies: each warp moves 8 x 4 blocks (8 rows, 4 k), whose 32 shared-memory
// words hit 32 banks; their global reads are 16 bytes of each of 8 rows (operand
// contiguous along k) or 32 bytes of each of 4 columns (contiguous along m or n).
// The warps form a 2 x 4 grid of 64 x 32 warp tiles (4 x 4 fragments, 64
// accumulators a thread). Each MMA adds into the accumulators (no per-slab partial
// sums as in version 2: the registers hold one set; the tests hold the results to
// the same float32 bound). Non-finite operands make the tile's 3xTF32 sums NaN;
// a tile whose sums are not all finite (one vote a tile, after its k loop) is
// multiplied again with FMAs (`tc3_fma_tile`), so Inf and NaN come out as with FMAs.
// This replaced a vote on x * 0 a slab: 1.02x for version 5 (H100).
template <typename T, int BM, int BN, int BK = TSM_BATCHED_TC3_BK, int STAGES = TSM_BATCHED_TC3_STAGES>
__device__ __forceinline__ void tile_gemm_tc3(const long long* __restrict__ meta, int prob, int m0,
                                              int n0, T alpha, T beta, T* smem,
                                              const KSplit& ks = KSplit{0, 0, 0, 1}) {
    static_assert(sizeof(T) == 4 && BM == 128 && BN == 128 && BK % 8 == 0, "the one shape built");
    constexpr int NT = 256;
    constexpr int LDK = BK + 4;
    constexpr int SLAB = (BM + BN) * LDK;
    constexpr int MT = 4, NT8 = 4;  // fragments of a 64 x 32 warp tile
    constexpr int RPA = BM / 64, RPB = BN / 64;
    constexpr int LA = BM * BK / NT, LB = BN * BK / NT;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long* p = meta + (long long)prob * TSM_BATCHED_META_STRIDE;
    const TcCopy<T> cp = tc_copy<T>(p, m0, n0, ks, lane, warp);
    const int K = cp.K, am = cp.am, ak = cp.ak, bk = cp.bk, bn = cp.bn, Mt = cp.Mt, Nt = cp.Nt;
    const int r0 = cp.r0, k0 = cp.k0;
    const T* pa = cp.pa;
    const T* pb = cp.pb;
    const unsigned sbase = smem_u32(smem);
    const unsigned sa0 = sbase + (unsigned)(r0 * LDK + k0) * 4u;
    const unsigned sb0 = sa0 + (unsigned)(BM * LDK) * 4u;

    auto fetch = [&](bool full, int s, int buf) {
        const int Kt = K - s * BK;
        const unsigned slot = (unsigned)(buf * SLAB) * 4u;
        copy_share<T, LA, RPA, 4, 4>(smem, sa0 + slot, pa + s * (BK * ak), pa, 64 * am, 4 * ak,
                                     64 * LDK, r0, 64, k0, 0, Mt, Kt, full);
        copy_share<T, LB, RPB, 4, 4>(smem, sb0 + slot, pb + s * (BK * bk), pb, 64 * bn, 4 * bk,
                                     64 * LDK, r0, 64, k0, 0, Nt, Kt, full);
    };

    const int nk = (K + BK - 1) / BK;
    const int nfull = (Mt >= BM && Nt >= BN) ? K / BK : 0;
    ring_fill<STAGES>(fetch, nk, nfull);

    // Fragment addresses (words, slot 0): lane l gives row l % 8 of matrix l / 8.
    const int q = lane >> 3, gq = lane >> 2, tq = lane & 3;
    const int wm0 = (warp & 1) * 64, wn0 = (warp >> 1) * 32;
    const int a_ld = (wm0 + (q & 1) * 8 + (lane & 7)) * LDK + (q >> 1) * 4;
    const int b_ld = BM * LDK + (wn0 + (q >> 1) * 8 + (lane & 7)) * LDK + (q & 1) * 4;

    float acc[MT][NT8][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

    int rd = 0, wr = STAGES - 1;
    for (int s = 0; s < nk; ++s) {
        const int slot = ring_next<STAGES, NT>(fetch, s, nk, nfull, rd, wr) * SLAB;

#pragma unroll
        for (int k8 = 0; k8 < BK; k8 += 8) {
            unsigned bh[NT8][2];
#pragma unroll
            for (int pp = 0; pp < NT8 / 2; ++pp) {
                unsigned r[4];
                const int o = slot + BM * LDK + (wn0 + pp * 16) * LDK + k8;  // b0, b1 of 2 n8s
                const int org[4] = {o, o + 4, o + 8 * LDK, o + 8 * LDK + 4};
                ldsm_x4(r, smem, slot + k8 + b_ld + pp * 16 * LDK, org, lane, LDK);
                bh[2 * pp][0] = r[0];
                bh[2 * pp][1] = r[1];
                bh[2 * pp + 1][0] = r[2];
                bh[2 * pp + 1][1] = r[3];
            }
            {
                unsigned bl[NT8][2];
#pragma unroll
                for (int nt = 0; nt < NT8; ++nt) {
                    tf32_split_rn(bh[nt][0], bl[nt][0]);
                    tf32_split_rn(bh[nt][1], bl[nt][1]);
                }
                // Blocked accumulation: per fragment, the three passes (lo hi, hi lo,
                // hi hi) sum into a fresh partial, added to acc by IEEE FADDs. The MMA
                // aligns its addends to the largest and truncates, so summing into acc
                // itself dropped bits of every product against the whole running total,
                // always toward zero: an error growing like K (emulated, 4-6x an FMA
                // loop's at K = 300-4096; the H100 measured 2-4x cuBLAS's at 700 x 700
                // x 300 and 12x at 4096^3), where the partial's truncations are against
                // eight k of products and the FADDs round to nearest. batched/numerics.py emulates both orders;
                // tests/test_batched_accuracy.py compares them. A's fragments are read
                // per row of fragments (registers: acc, the partial and B's hi and lo
                // leave no room for all four rows' at once).
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    unsigned ah[4], al[4];
                    {
                        const int o = slot + (wm0 + mt * 16) * LDK + k8;  // matrices a0..a3
                        const int org[4] = {o, o + 8 * LDK, o + 4, o + 8 * LDK + 4};
                        ldsm_x4(ah, smem, slot + k8 + a_ld + mt * 16 * LDK, org, lane, LDK);
                    }
#pragma unroll
                    for (int c = 0; c < 4; ++c) tf32_split_rn(ah[c], al[c]);
#pragma unroll
                    for (int nt = 0; nt < NT8; ++nt) {
                        float part[4] = {0.f, 0.f, 0.f, 0.f};
                        mma_tf32_16x8x8(part, al, bh[nt][0], bh[nt][1]);
                        mma_tf32_16x8x8(part, ah, bl[nt][0], bl[nt][1]);
                        mma_tf32_16x8x8(part, ah, bh[nt][0], bh[nt][1]);
#pragma unroll
                        for (int c = 0; c < 4; ++c) acc[mt][nt][c] += part[c];
                    }
                }
            }
        }
    }
    cp_async_wait<0>();
    if (tc3_redo_nonfinite<T>(acc, p, m0, n0, alpha, beta, smem, ks)) return;
    tc3_finish<T>(acc, p, m0, n0, ks, smem, alpha, beta);
}

// ---------------------------------------------------------------- version 6: wgmma
// The sm_90a warpgroup MMA (wgmma.mma_async): a warpgroup (4 warps) multiplies a 64 x 8
// slice of A, from its registers, by a 128 x 8 slice of B, read by the tensor cores
// from shared memory through a descriptor, into 64 x 128 accumulators (64 a thread).
// Compiled only where the module is built for sm_90a (runtime/compile.py's
// ARCH_SPECIFIC); elsewhere version 6 is never launched and these are empty.
// (The descriptor, fences and waits: include/wgmma.cuh.)

// Keeps the compiler from moving reads or writes of `d` across a point of the
// asynchronous MMA's life (its issue, its completion).
__device__ __forceinline__ void wg_pin(float (&d)[1][16][4]) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) asm volatile("" : "+f"(d[0][j][c])::"memory");
}

// d += A (64 x 8, tf32, this warp's 16 rows in a[], mma.m16n8k8's A fragment) * B (8 x
// 128, tf32, K-major in shared memory at descriptor db).
__device__ __forceinline__ void wgmma_tf32_m64n128k8(float (&d)[1][16][4], const unsigned (&a)[4],
                                                     unsigned long long db) {
#if defined(TSM_WGMMA)
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1;\n"
        : "+f"(d[0][0][0]), "+f"(d[0][0][1]), "+f"(d[0][0][2]), "+f"(d[0][0][3]),
          "+f"(d[0][1][0]), "+f"(d[0][1][1]), "+f"(d[0][1][2]), "+f"(d[0][1][3]),
          "+f"(d[0][2][0]), "+f"(d[0][2][1]), "+f"(d[0][2][2]), "+f"(d[0][2][3]),
          "+f"(d[0][3][0]), "+f"(d[0][3][1]), "+f"(d[0][3][2]), "+f"(d[0][3][3]),
          "+f"(d[0][4][0]), "+f"(d[0][4][1]), "+f"(d[0][4][2]), "+f"(d[0][4][3]),
          "+f"(d[0][5][0]), "+f"(d[0][5][1]), "+f"(d[0][5][2]), "+f"(d[0][5][3]),
          "+f"(d[0][6][0]), "+f"(d[0][6][1]), "+f"(d[0][6][2]), "+f"(d[0][6][3]),
          "+f"(d[0][7][0]), "+f"(d[0][7][1]), "+f"(d[0][7][2]), "+f"(d[0][7][3]),
          "+f"(d[0][8][0]), "+f"(d[0][8][1]), "+f"(d[0][8][2]), "+f"(d[0][8][3]),
          "+f"(d[0][9][0]), "+f"(d[0][9][1]), "+f"(d[0][9][2]), "+f"(d[0][9][3]),
          "+f"(d[0][10][0]), "+f"(d[0][10][1]), "+f"(d[0][10][2]), "+f"(d[0][10][3]),
          "+f"(d[0][11][0]), "+f"(d[0][11][1]), "+f"(d[0][11][2]), "+f"(d[0][11][3]),
          "+f"(d[0][12][0]), "+f"(d[0][12][1]), "+f"(d[0][12][2]), "+f"(d[0][12][3]),
          "+f"(d[0][13][0]), "+f"(d[0][13][1]), "+f"(d[0][13][2]), "+f"(d[0][13][3]),
          "+f"(d[0][14][0]), "+f"(d[0][14][1]), "+f"(d[0][14][2]), "+f"(d[0][14][3]),
          "+f"(d[0][15][0]), "+f"(d[0][15][1]), "+f"(d[0][15][2]), "+f"(d[0][15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#else
    (void)d;
    (void)a;
    (void)db;
#endif
}

// Version 6's 128 x 128 tiles of problems with K >= TC_MIN_K: version 5's tile
// (3xTF32, the same cp.async ring of 4-byte copies, the same split-K hand-off,
// Inf/NaN check and epilogue), its products on wgmma. The two warpgroups each
// multiply 64 rows by all 128 columns: per 8-deep step three m64n128k8 MMAs,
// lo(A) hi(B) + hi(A) lo(B) + hi(A) hi(B), where hi(x) is x itself (the tensor core
// reads the top 19 bits) and lo(x) = tf32_low(x). A's parts sit in registers (one
// ldmatrix.x4 a warp and step, then tf32_low: a warp splits only its own 16 rows,
// where the mma.sync tile split 64 rows in every warp); lo(B) is written once a slab
// beside the ring by all 256 threads, 8 words each.
// Shared memory, per slab: A and B as core matrices (8 rows x 4 k, 128 contiguous
// bytes; the layout a no-swizzle K-major descriptor reads), core matrix (row group
// g, k group q) at word (g * BK / 4 + q) * 32, row r % 8 at 4 (r % 8) + k % 4 in it.
// A warp's cp.async writes fill one core matrix (32 banks); ldmatrix reads four.
// Order, per slab: the ring's wait and barrier (slab s landed, slab s - 1's MMAs
// done in every warpgroup), the next slab's copies, lo(B) stores, a proxy fence
// (the copies and stores, to the tensor cores), a barrier, the MMAs of both steps,
// then wait for them before the next slab's barrier releases their operands.
template <typename T, int BM, int BN, int BK = TSM_BATCHED_TC3_BK, int STAGES = TSM_BATCHED_TC3_STAGES>
__device__ __forceinline__ void tile_gemm_wg3(const long long* __restrict__ meta, int prob, int m0,
                                              int n0, T alpha, T beta, T* smem,
                                              const KSplit& ks = KSplit{0, 0, 0, 1}) {
    static_assert(sizeof(T) == 4 && BM == 128 && BN == 128 && BK % 8 == 0, "the one shape built");
    constexpr int NT = 256;
    constexpr int KG = BK / 4;                // core matrices along k in a slab
    constexpr int OPW = 128 * BK;             // words of one operand's slab
    constexpr int SLAB = 2 * OPW;             // A, then B
    constexpr int RPA = 2, LA = BM * BK / NT;  // copies a thread: rows r0, r0 + 64; k groups

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long* p = meta + (long long)prob * TSM_BATCHED_META_STRIDE;
    const TcCopy<T> cp = tc_copy<T>(p, m0, n0, ks, lane, warp);  // version 5's copy map
    const int K = cp.K, am = cp.am, ak = cp.ak, bk = cp.bk, bn = cp.bn, Mt = cp.Mt, Nt = cp.Nt;
    const int r0 = cp.r0, k0 = cp.k0;
    const T* pa = cp.pa;
    const T* pb = cp.pb;
    const unsigned sbase = smem_u32(smem);
    // (r0, k0): row group r0 / 8 = warp, row r0 % 8, k group 0, k k0.
    const unsigned sa0 = sbase + (unsigned)(warp * KG * 32 + (lane & 7) * 4 + k0) * 4u;
    const unsigned sb0 = sa0 + (unsigned)OPW * 4u;

    auto fetch = [&](bool full, int s, int buf) {
        const int Kt = K - s * BK;
        const unsigned slot = (unsigned)(buf * SLAB) * 4u;
        copy_share<T, LA, RPA, 4, 32>(smem, sa0 + slot, pa + s * (BK * ak), pa, 64 * am, 4 * ak,
                                      8 * KG * 32, r0, 64, k0, 0, Mt, Kt, full);
        copy_share<T, LA, RPA, 4, 32>(smem, sb0 + slot, pb + s * (BK * bk), pb, 64 * bn, 4 * bk,
                                      8 * KG * 32, r0, 64, k0, 0, Nt, Kt, full);
    };

    const int nk = (K + BK - 1) / BK;
    const int nfull = (Mt >= BM && Nt >= BN) ? K / BK : 0;
    ring_fill<STAGES>(fetch, nk, nfull);

    // This warp's A rows: 16 of its warpgroup's 64, row groups ga, ga + 1. ldmatrix:
    // lane l gives row l % 8 of matrix l / 8 = (row group ga + (q & 1), k group q >> 1).
    const int q = lane >> 3;
    const int ga = ((warp >> 2) * 64 + (warp & 3) * 16) / 8;
    const int a_ld = ((ga + (q & 1)) * KG + (q >> 1)) * 32 + (lane & 7) * 4;
    T* const blo = smem + STAGES * SLAB;  // lo(B) of the current slab (one buffer)
    const unsigned blo_s = sbase + (unsigned)(STAGES * SLAB) * 4u;
    constexpr unsigned LBO = 128, SBO = KG * 128;  // bytes between core matrices: k, n

    float acc[1][16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[0][j][c] = 0.f;

    int rd = 0, wr = STAGES - 1;
    for (int s = 0; s < nk; ++s) {
        const int slot = ring_next<STAGES, NT>(fetch, s, nk, nfull, rd, wr) * SLAB;
        {  // lo(B): the slab's B in 16-byte pieces, piece tid, tid + 256, ... (8 words a
           // thread at BK 16), a warp's 32 pieces contiguous
            const T* bh = smem + slot + OPW;
#pragma unroll
            for (int w = tid * 4; w < OPW; w += NT * 4) {
                const float4 x = *reinterpret_cast<const float4*>(bh + w);
                float4 y;
                y.x = __uint_as_float(tf32_low(x.x));
                y.y = __uint_as_float(tf32_low(x.y));
                y.z = __uint_as_float(tf32_low(x.z));
                y.w = __uint_as_float(tf32_low(x.w));
                *reinterpret_cast<float4*>(blo + w) = y;
            }
        }
        fence_proxy_async();
        sync_tile<NT>();
        unsigned ah[BK / 8][4], al[BK / 8][4];
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8) {
            const int o = slot + (ga * KG + 2 * k8) * 32;  // matrices a0..a3 (host build)
            const int org[4] = {o, o + KG * 32, o + 32, o + KG * 32 + 32};
            ldsm_x4(ah[k8], smem, slot + a_ld + k8 * 2 * 32, org, lane, 4);
#pragma unroll
            for (int c = 0; c < 4; ++c) al[k8][c] = tf32_low(__uint_as_float(ah[k8][c]));
        }
        const unsigned bhi_s = sbase + (unsigned)(slot + OPW) * 4u;
        wg_fence();
#pragma unroll
        for (int k8 = 0; k8 < BK / 8; ++k8) {
            const unsigned long long dh = wg_desc(bhi_s + k8 * 2 * LBO, LBO, SBO);
            const unsigned long long dl = wg_desc(blo_s + k8 * 2 * LBO, LBO, SBO);
            wgmma_tf32_m64n128k8(acc, al[k8], dh);
            wgmma_tf32_m64n128k8(acc, ah[k8], dl);
            wgmma_tf32_m64n128k8(acc, ah[k8], dh);
        }
        wg_commit();
        wg_wait<0>();
        wg_pin(acc);  // (A's registers: ptxas keeps them until the wait itself)
    }
    cp_async_wait<0>();
    if (tc3_redo_nonfinite<T>(acc, p, m0, n0, alpha, beta, smem, ks)) return;
    tc3_finish<T>(acc, p, m0, n0, ks, smem, alpha, beta);
}

}  // namespace tsm_batched

// One block per tile of the flat tile list; the tile's type picks the instantiation.
// The switch is uniform over the block, so no warp diverges on it. V selects the
// version of the tile code (0: first version, kept as the ladder's base; 1: default
// for double; 2: version 1 with float's 32 x 32, 32 x 64 and 64 x 64 tiles on the
// tensor cores where K >= 128; 3, float only, its default: version 1 plus 128 x 64
// tiles of 8 x 4 outputs a thread at three blocks per SM; 4, float only: version 3
// plus 128 x 128 tiles of 8 x 8 at two blocks per SM, for batches of large problems;
// 5, float only, two blocks per SM: the 256-thread types by cp.async rings and the
// 128 x 128 type on the tensor cores where K >= 128, taken for batches of large
// problems; 6, float only, sm_90a: version 5 with the tensor-core tiles on wgmma).
// Register budget: the 64x64 path sets it. float fits 80 registers without spilling
// (3 blocks = 24 warps per SM); at 64 it spills. double needs 128 (2 blocks per SM):
// at 80 it spills 200+ bytes. Version 2's tensor-core path spills about 70 bytes at
// 80 (its fetch offsets, hoisted out of the k-loop), so it is built for 2 blocks per
// SM, as is version 4 (64 accumulators a thread). Version 3 spills a few dozen bytes
// at 80 (the 128 x 64 path on its own needs 79; inlined beside the five others it
// does not fit) and is still 1.0-1.23x faster than version 1 on the H100; keeping
// it out of line (__noinline__) cost more than the spills (H100). Checked by
// tests/test_batched_compile.py.
template <typename T, int V>
__global__ void __launch_bounds__(256, (sizeof(T) == 4 && V != 2 && V < 4) ? 3 : 2)
tsm_batched_gemm(const long long* __restrict__ meta, const int4* __restrict__ tiles, T alpha,
                 T beta) {
    using namespace tsm_batched;
    static_assert(V < 3 || sizeof(T) == 4, "versions 3 to 6 are float only");
    constexpr int BK = TSM_BATCHED_BK;
    constexpr int XBK = TSM_BATCHED_XBK;
    constexpr bool TC = V == 2;  // version 2: tiles of 32 rows or more on the tensor cores
    constexpr int PAD = TC ? 32 / (int)sizeof(T) : 16 / (int)sizeof(T);
    // Large enough for the largest slab pair (the others use a prefix of it); versions
    // 1 to 4 keep two of them.
    constexpr int SLAB = 2 * BK * (64 + PAD) > 2 * XBK * (128 + PAD) || V < 3 || V >= 5
                             ? 2 * BK * (64 + PAD)
                             : 2 * XBK * (128 + PAD);
    constexpr int SMEM = (V == 0 ? 1 : 2) * SLAB;
    // Versions 5 and 6's rings pass 48 KB: dynamic shared memory (the launcher passes
    // smem_bytes of tsm_core/_batched.py); the others' is static.
    __shared__ __align__(16) T smem_s[V >= 5 ? 1 : SMEM];
#if defined(__CUDACC__)
    extern __shared__ __align__(16) unsigned char smem_d[];
#else  // the tests' host build (no dynamic shared memory): a buffer large enough
    __shared__ __align__(16) unsigned char smem_d[V >= 5 ? 65536 : 16];
#endif
    T* const smem = V >= 5 ? reinterpret_cast<T*>(smem_d) : smem_s;
    const int4 t = tiles[blockIdx.x];
    const int type = t.w & 15;
    // Split-K tiles (versions 1, 3 and 5; in version 4 the combine costs spills):
    // this block's chunk of k.
    KSplit ks{0, 0, 0, 1};
    if constexpr (V == 1 || V == 3 || V >= 5) {
        if ((t.w >> 12) > 1) ks = k_split(t.w, (int)meta[(long long)t.x * TSM_BATCHED_META_STRIDE + 5]);
    }
    if constexpr (V >= 5) {
        switch (type) {
            case 0: tile_gemm_v1<T, 16, 16, 128, 2, 1>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 1: tile_gemm_v1<T, 16, 32, 128, 2, 2>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 2: tile_gemm_v1<T, 32, 32, 128, 4, 2>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 3: tile_gemm_cp<T, 32, 64, 256, 4, 2>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 5:
                tile_gemm_cp<T, 128, 64, 256, 8, 4, true>(meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                break;
            case 6:
                // 3xTF32 meets float32's rounding bound from K >= TC_MIN_K (version 2).
                if (meta[(long long)t.x * TSM_BATCHED_META_STRIDE + 5] >= TSM_BATCHED_TC_MIN_K) {
                    if constexpr (V == 6) {  // wgmma (sm_90a)
                        tile_gemm_wg3<T, 128, 128>(meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                    } else {
                        tile_gemm_tc3<T, 128, 128>(meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                    }
                } else {
                    tile_gemm_cp<T, 128, 128, 256, 8, 8, true, XBK, TSM_BATCHED_XSTAGES>(
                        meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                }
                break;
            default: tile_gemm_cp<T, 64, 64, 256, 4, 4>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
        }
    } else if constexpr (V == 0) {
        switch (type) {
            case 0: tile_gemm<T, 16, 16, 128, 2, 1>(meta, t.x, t.y, t.z, alpha, beta, smem); break;
            case 1: tile_gemm<T, 16, 32, 128, 2, 2>(meta, t.x, t.y, t.z, alpha, beta, smem); break;
            case 2: tile_gemm<T, 32, 32, 128, 4, 2>(meta, t.x, t.y, t.z, alpha, beta, smem); break;
            case 3: tile_gemm<T, 32, 64, 256, 4, 2>(meta, t.x, t.y, t.z, alpha, beta, smem); break;
            default: tile_gemm<T, 64, 64, 256, 4, 4>(meta, t.x, t.y, t.z, alpha, beta, smem); break;
        }
    } else {
        switch (type) {
            case 0: tile_gemm_v1<T, 16, 16, 128, 2, 1>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 1: tile_gemm_v1<T, 16, 32, 128, 2, 2>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 2: tile_gemm_v1<T, 32, 32, 128, 4, 2, TC>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 3: tile_gemm_v1<T, 32, 64, 256, 4, 2, TC>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
            case 5:
                if constexpr (V >= 3) {
                    tile_gemm_v1<T, 128, 64, 256, 8, 4, false, true, XBK>(meta, t.x, t.y, t.z, alpha,
                                                                          beta, smem, ks);
                    break;
                }
                [[fallthrough]];
            case 6:
                if constexpr (V == 4) {
                    tile_gemm_v1<T, 128, 128, 256, 8, 8, false, true, XBK>(meta, t.x, t.y, t.z, alpha,
                                                                           beta, smem, ks);
                    break;
                }
                [[fallthrough]];
            default: tile_gemm_v1<T, 64, 64, 256, 4, 4, TC>(meta, t.x, t.y, t.z, alpha, beta, smem, ks); break;
        }
    }
}

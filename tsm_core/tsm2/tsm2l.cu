// TSM2L: C = alpha * A @ B + beta * C with A (m x k) tall and skinny and B (k x n)
// small (opt1: k <= 32; opt2: any k; n is processed in chunks of TN). Chen et al., "TSM2X", section 3.2.
//
// With k this small each thread of a TSM2R-style launch (one row per thread) does
// too little work to hide memory latency: the launch is latency-bound. Both
// optimisations launch only m / tcf threads (tcf, the "thread count factor"), so
// that each thread walks tcf row tiles and always has the next tile's loads in
// flight while it computes the current one:
//   opt1  Algorithm 6: B (one n-chunk) stays in shared memory; each row tile is a
//         complete TSM2R step; the next tiles of A are prefetched (cp.async ring).
//   opt2  Algorithm 7: k is tiled too (any k): for each t1-row tile of B, every row
//         tile of A is visited with its partial sums loaded from C, updated and
//         stored back; the next tile's A and C are prefetched into registers.
// Two register forms of opt1 (at the end of this file) skip the shared-memory tile
// of A: tsm2l_opt1w (row-major A, rows of a few 16-byte vectors, a warp per 32/LPR
// rows) and tsm2l_opt1d (column-major A, a thread's rows of every column loaded at
// once).
//
// Thread mapping, chosen so that reads of A are coalesced in both layouts:
//   A column-major: a thread owns VEC consecutive rows (one 16-byte vector per
//                   column); a warp reads 32*VEC contiguous elements per column.
//   A row-major:    a thread owns one row and reads it as VEC-element vectors; a
//                   warp's reads of a tile cover one contiguous block of A.
// Shapes: A is (m, k), B is (k, n), C is (m, n). Strides in elements, 64-bit.
#include "common.cuh"

template <typename T, bool A_COL, int VEC, int KT>
struct LRegs {
    // A registers of one row tile: KT columns x VEC rows (column-major A) or
    // KT/VEC vectors of one row (row-major A).
    static constexpr int RV = A_COL ? VEC : 1;
    static constexpr int NV = A_COL ? KT : KT / VEC;
    T a[NV][VEC];
};

// Load the KT (k0 .. k0+KT) x rows tile of A owned by this thread, zero-filled
// past m and past k.
template <typename T, bool A_COL, int VEC, int KT>
__device__ __forceinline__ void load_a_tile(LRegs<T, A_COL, VEC, KT>& R, const T* __restrict__ A,
                                            i64 lda, i64 r, int m, int k, int k0) {
    if constexpr (A_COL) {
        const int rvalid = (int)max((i64)0, min((i64)VEC, (i64)m - r));
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            if (k0 + kk < k && rvalid > 0)
                load_vec_partial<T, VEC>(R.a[kk], A + r + (i64)(k0 + kk) * lda, rvalid);
            else
#pragma unroll
                for (int v = 0; v < VEC; ++v) R.a[kk][v] = T(0);
        }
    } else {
#pragma unroll
        for (int c = 0; c < KT / VEC; ++c) {
            const int col = k0 + c * VEC;
            const int valid = r < m ? max(0, min(VEC, k - col)) : 0;
            if (valid > 0)
                load_vec_partial<T, VEC>(R.a[c], A + r * lda + col, valid);
            else
#pragma unroll
                for (int v = 0; v < VEC; ++v) R.a[c][v] = T(0);
        }
    }
}

template <typename T, bool A_COL, int VEC, int KT, int TN>
__device__ __forceinline__ void compute_tile(T (&acc)[A_COL ? VEC : 1][TN],
                                             const LRegs<T, A_COL, VEC, KT>& R, const T* Bs) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        if constexpr (A_COL) {
#pragma unroll
            for (int v = 0; v < VEC; ++v) fma_row_from_smem<T, TN>(acc[v], R.a[kk][v], Bs + kk * TN);
        } else {
            fma_row_from_smem<T, TN>(acc[0], R.a[kk / VEC][kk % VEC], Bs + kk * TN);
        }
    }
}

// C[r, p:p+TN] (or VEC rows of it) = alpha * acc + beta * C, reading C only
// when beta != 0. `cols` = valid columns in this chunk.
template <typename T, int RV, int TN>
__device__ __forceinline__ void store_rows(T* __restrict__ C, i64 sc0, i64 sc1, i64 r, int m, int p,
                                           int cols, const T (&acc)[RV][TN], T alpha, T beta) {
#pragma unroll
    for (int v = 0; v < RV; ++v) {
        if (r + v >= m) continue;
        T* crow = C + (r + v) * sc0 + (i64)p * sc1;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            if (j >= cols) continue;
            T x = alpha * acc[v][j];
            if (beta != T(0)) x = fma(beta, crow[j * sc1], x);
            crow[j * sc1] = x;
        }
    }
}

// Copy the KT x TN chunk of B starting at (k0, p) into shared memory, zero-filled.
template <typename T, int T1, int KT, int TN>
__device__ __forceinline__ void load_b_chunk(T* Bs, const T* __restrict__ B, i64 sb0, i64 sb1,
                                             int k, int n, int k0, int p) {
    for (int e = threadIdx.x; e < KT * TN; e += T1) {
        const int kk = e / TN, j = e % TN;
        Bs[e] = (k0 + kk < k && p + j < n) ? B[(i64)(k0 + kk) * sb0 + (i64)(p + j) * sb1] : T(0);
    }
}

// ------------------------------------------------------------------ opt1

// Algorithm 6. Each block walks its row tiles (tile = blockIdx.x, +gridDim.x, ...:
// about tcf tiles each) and keeps the next NS-1 tiles of A in flight in a
// cp.async ring while it computes the current one: the prefetch of Algorithm 4
// carried across tiles, which is exactly where a TSM2R launch has nothing to
// overlap when k is small. Requires k <= KT (all of k is one tile).
//
// A tile layouts in shared memory:
//   column-major A: [KT][ROWS], ROWS = T1*VEC contiguous rows per column;
//   row-major A:    [ROWS][KT + PAD], ROWS = T1; when lda == k the whole tile is
//                   one contiguous stretch of A, copied in 16-byte chunks.
// A row-major C (sc1 == 1) is written through shared memory so that a warp's
// stores cover contiguous memory; otherwise each thread stores its rows directly.
template <typename T, bool A_COL, int VEC, int T1, int TN, int KT, int NS>
struct L1Tile {
    static constexpr int RV = A_COL ? VEC : 1;
    static constexpr int ROWS = T1 * RV;
    static constexpr int PAD = A_COL ? 0 : 16 / (int)sizeof(T);
    static constexpr int A_ELEMS = A_COL ? KT * ROWS : ROWS * (KT + PAD);
    static constexpr int C_LD = TN + 1;  // odd stride: conflict-free row writes
    static constexpr int C_ELEMS = ROWS * C_LD;
    static constexpr int SMEM_BYTES = (NS * A_ELEMS + C_ELEMS + KT * TN) * (int)sizeof(T);
};

template <typename T, bool A_COL, int VEC, int T1, int TN, int KT, int NS>
__global__ void __launch_bounds__(T1)
tsm2l_opt1(const T* __restrict__ A, i64 lda, const T* __restrict__ B, i64 sb0, i64 sb1,
           T* __restrict__ C, i64 sc0, i64 sc1, int m, int n, int k, T alpha, T beta) {
    typedef L1Tile<T, A_COL, VEC, T1, TN, KT, NS> L;
    constexpr int RV = L::RV, ROWS = L::ROWS;
    constexpr int KV = 16 / sizeof(T);
    static_assert(A_COL || KT % KV == 0, "row-major tiles are read as 16-byte vectors");
    static_assert(A_COL || KT % VEC == 0, "row-major tiles copy whole vectors");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* As0 = reinterpret_cast<T*>(smem_raw);
    T* Cs = As0 + NS * L::A_ELEMS;
    T* Bs = Cs + L::C_ELEMS;

    const int tid = threadIdx.x;
    const i64 ntile = ((i64)m + ROWS - 1) / ROWS;
    const int cnt = blockIdx.x < ntile ? (int)((ntile - 1 - blockIdx.x) / gridDim.x + 1) : 0;
    const bool stage_c = (sc1 == 1) && n > 1;

    auto issue = [&](int i, int s) {
        T* As = As0 + s * L::A_ELEMS;
        const i64 row0 = ((i64)blockIdx.x + (i64)i * gridDim.x) * ROWS;
        if constexpr (A_COL) {
            const i64 r = row0 + (i64)tid * VEC;
            const int rvalid = (int)max((i64)0, min((i64)VEC, (i64)m - r));
#pragma unroll 1
            for (int kk = 0; kk < KT; ++kk) {
                const bool ok = kk < k && rvalid > 0;
                cp_async<VEC * sizeof(T)>(As + kk * ROWS + tid * VEC, ok ? A + r + (i64)kk * lda : A,
                                          ok ? rvalid * (int)sizeof(T) : 0);
            }
        } else {
            constexpr int CPR = KT / VEC;
#pragma unroll 1  // keeps the chunks' addresses out of registers between tiles
            for (int j = 0; j < CPR; ++j) {
                const int c = tid + j * T1;
                const int rr = c / CPR, cc = (c % CPR) * VEC;
                const i64 r = row0 + rr;
                const int valid = r < m ? max(0, min(VEC, k - cc)) : 0;
                cp_async<VEC * sizeof(T)>(As + rr * (KT + L::PAD) + cc, valid > 0 ? A + r * lda + cc : A,
                                          valid * (int)sizeof(T));
            }
        }
    };

    for (int p = 0; p < n; p += TN) {
        const int cols = min(TN, n - p);
        __syncthreads();  // the previous chunk's Bs, Cs and ring stages are no longer read
        // A's first tiles are requested before B is read: with few tiles per block
        // (small m) the two DRAM round trips then overlap instead of adding up.
#pragma unroll
        for (int s = 0; s < NS - 1; ++s) {
            if (s < cnt) issue(s, s);
            cp_async_commit();
        }
        for (int e = tid; e < KT * TN; e += T1) {
            const int kk = e / TN, j = e % TN;
            Bs[e] = (kk < k && p + j < n) ? B[(i64)kk * sb0 + (i64)(p + j) * sb1] : T(0);
        }
        for (int i = 0; i < cnt; ++i) {
            cp_async_wait<NS - 2>();
            __syncthreads();  // tile i landed; stage (i-1)%NS and Cs are free
            if (i + NS - 1 < cnt) issue(i + NS - 1, (i + NS - 1) % NS);
            cp_async_commit();

            const T* As = As0 + (i % NS) * L::A_ELEMS;
            T acc[RV][TN];
#pragma unroll
            for (int v = 0; v < RV; ++v)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[v][j] = T(0);
            if constexpr (A_COL) {
#pragma unroll
                for (int kk = 0; kk < KT; ++kk) {
                    T a[VEC];
                    load_vec<T, VEC>(a, As + kk * ROWS + tid * VEC);
                    fma_rows_from_smem<T, VEC, TN>(acc, a, Bs + kk * TN);
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < KT; kk += KV) {
                    T a[KV];
                    load_vec<T, KV>(a, As + tid * (KT + L::PAD) + kk);
#pragma unroll
                    for (int q = 0; q < KV; ++q) fma_row_from_smem<T, TN>(acc[0], a[q], Bs + (kk + q) * TN);
                }
            }

            const i64 row0 = ((i64)blockIdx.x + (i64)i * gridDim.x) * ROWS;
            if (stage_c) {
#pragma unroll
                for (int v = 0; v < RV; ++v)
#pragma unroll
                    for (int j = 0; j < TN; ++j) Cs[(tid * RV + v) * L::C_LD + j] = acc[v][j];
                __syncthreads();
                // Row-major copy-out: consecutive threads, consecutive columns.
                constexpr int CV = 16 / sizeof(T);
                if (TN % CV == 0 && cols % CV == 0 && sc0 % CV == 0 &&
                    reinterpret_cast<unsigned long long>(C + p) % 16 == 0) {
                    // Whole 16-byte chunks, one per thread and store: a warp writes
                    // 512 contiguous bytes when sc0 == TN. A chunk narrower than TN
                    // (n = 12 in a TN = 16 chunk) skips its missing vectors here
                    // rather than taking the scalar loop below, whose division by a
                    // run-time column count costs more than the bytes it stores.
                    constexpr int CPR = TN / CV;
#pragma unroll 1
                    for (int e = tid; e < ROWS * CPR; e += T1) {
                        const int rr = e / CPR, j0 = (e % CPR) * CV;
                        const i64 r = row0 + rr;
                        if (r >= m || j0 >= cols) continue;
                        T* cp = C + r * sc0 + p + j0;
                        T x[CV], y[CV];
#pragma unroll
                        for (int q = 0; q < CV; ++q) y[q] = alpha * Cs[rr * L::C_LD + j0 + q];
                        if (beta != T(0)) {
                            load_vec<T, CV>(x, cp);
#pragma unroll
                            for (int q = 0; q < CV; ++q) y[q] = fma(beta, x[q], y[q]);
                        }
                        store_vec<T, CV>(cp, y);
                    }
                    continue;
                }
                for (int e = tid; e < ROWS * cols; e += T1) {
                    const int rr = e / cols, j = e % cols;
                    const i64 r = row0 + rr;
                    if (r < m) {
                        T x = alpha * Cs[rr * L::C_LD + j];
                        T* cp = C + r * sc0 + (p + j);
                        if (beta != T(0)) x = fma(beta, *cp, x);
                        *cp = x;
                    }
                }
            } else {
                store_rows<T, RV, TN>(C, sc0, sc1, row0 + (i64)tid * RV, m, p, cols, acc, alpha, beta);
            }
        }
        cp_async_wait<0>();
    }
}

// ------------------------------------------------------------------ opt2

template <typename T, bool A_COL, int VEC, int T1, int TN, int KT>
__global__ void __launch_bounds__(T1)
tsm2l_opt2(const T* __restrict__ A, i64 lda, const T* __restrict__ B, i64 sb0, i64 sb1,
           T* __restrict__ C, i64 sc0, i64 sc1, int m, int n, int k, T alpha, T beta) {
    constexpr int RV = A_COL ? VEC : 1;
    constexpr int ROWS = T1 * RV;
    __shared__ __align__(16) T Bs[KT * TN];
    const i64 ntile = ((i64)m + ROWS - 1) / ROWS;

    for (int p = 0; p < n; p += TN) {
        const int cols = min(TN, n - p);
        for (int k0 = 0; k0 < k; k0 += KT) {
            __syncthreads();
            load_b_chunk<T, T1, KT, TN>(Bs, B, sb0, sb1, k, n, k0, p);
            __syncthreads();
            // The partial sums so far live in C. The first k-tile applies beta
            // to the caller's C (and skips reading it when beta == 0); later
            // k-tiles add to what the earlier ones stored.
            const bool read_c = (k0 > 0) || (beta != T(0));
            const T cscale = (k0 > 0) ? T(1) : beta;

            i64 tile = blockIdx.x;
            LRegs<T, A_COL, VEC, KT> cur, nxt;
            T cprev[RV][TN], cnext[RV][TN];
            auto load_c = [&](T (&dst)[RV][TN], i64 r) {
#pragma unroll
                for (int v = 0; v < RV; ++v)
#pragma unroll
                    for (int j = 0; j < TN; ++j)
                        dst[v][j] = (read_c && r + v < m && j < cols) ? C[(r + v) * sc0 + (i64)(p + j) * sc1] : T(0);
            };
            i64 r = tile * ROWS + (i64)threadIdx.x * RV;
            load_a_tile<T, A_COL, VEC, KT>(cur, A, lda, r, m, k, k0);
            load_c(cprev, r);
            for (; tile < ntile; tile += gridDim.x) {
                r = tile * ROWS + (i64)threadIdx.x * RV;
                const i64 next = tile + gridDim.x;
                if (next < ntile) {  // prefetch next A and next C (Algorithm 7, nextC)
                    const i64 rn = next * ROWS + (i64)threadIdx.x * RV;
                    load_a_tile<T, A_COL, VEC, KT>(nxt, A, lda, rn, m, k, k0);
                    load_c(cnext, rn);
                }
                T acc[RV][TN];
#pragma unroll
                for (int v = 0; v < RV; ++v)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[v][j] = T(0);
                compute_tile<T, A_COL, VEC, KT, TN>(acc, cur, Bs);
#pragma unroll
                for (int v = 0; v < RV; ++v) {
                    if (r + v >= m) continue;
#pragma unroll
                    for (int j = 0; j < TN; ++j)
                        if (j < cols)
                            C[(r + v) * sc0 + (i64)(p + j) * sc1] = fma(cscale, cprev[v][j], alpha * acc[v][j]);
                }
                cur = nxt;
#pragma unroll
                for (int v = 0; v < RV; ++v)
#pragma unroll
                    for (int j = 0; j < TN; ++j) cprev[v][j] = cnext[v][j];
            }
        }
    }
}

// ------------------------------------------------------------------ opt1, row-major A, short rows

// Algorithm 6 for a row-major A whose rows are a few 16-byte vectors long (k = 8
// or 16 in float32: rows of 32 or 64 bytes). tsm2l_opt1 stages such tiles in
// shared memory and pays two block barriers per 256 rows; here a warp reads its
// rows straight into registers, LPR lanes per row, one 16-byte vector each, so
// every load instruction covers 32/LPR whole rows (512 contiguous bytes when
// lda == k) and nothing waits on a barrier:
//   - lane l holds k-slice q = l % LPR (VEC elements) of row l / LPR;
//   - the VEC x TN values of B that slice needs live in the lane's registers for
//     the whole launch (B is read once per thread, from L2);
//   - the TN partial sums of a row are reduce-scattered over its LPR lanes, after
//     which lane q owns the OPL = TN / LPR consecutive outputs from q * OPL: a
//     row-major C is written with 16-byte stores covering whole rows;
//   - U load instructions per warp step, and the next step's loads are issued
//     before the current step is summed (Algorithm 6's prefetch, in registers).
// A block walks row tiles of W * U * (32 / LPR) rows (tile = blockIdx.x, +gridDim.x,
// ...), as tsm2l_opt1 does; tcf is the number of tiles per block.
// Needs: A's rows 16-byte aligned (lda % VEC == 0), k <= LPR * VEC, n <= TN.
template <typename T, int LPR, int TN, int U>
__global__ void __launch_bounds__(256)
tsm2l_opt1w(const T* __restrict__ A, i64 lda, const T* __restrict__ B, i64 sb0, i64 sb1,
            T* __restrict__ C, i64 sc0, i64 sc1, int m, int n, int k, T alpha, T beta) {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int RPI = 32 / LPR;        // rows per load instruction
    constexpr int OPL = TN / LPR;        // outputs per lane after the reduce-scatter
    constexpr int W = 256 / 32;          // warps per block
    constexpr int ROWS = W * U * RPI;    // rows per block tile
    static_assert(LPR >= 1 && LPR <= 32 && 32 % LPR == 0, "lanes per row divide the warp");
    static_assert(TN % LPR == 0, "each lane of a row owns whole outputs");

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q = lane % LPR, rr = lane / LPR;
    const int kq = q * VEC;  // first k of this lane's slice

    T b[VEC][TN];
#pragma unroll
    for (int e = 0; e < VEC; ++e)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            b[e][j] = (kq + e < k && j < n) ? B[(i64)(kq + e) * sb0 + (i64)j * sb1] : T(0);

    const i64 ntile = ((i64)m + ROWS - 1) / ROWS;
    const int rem_k = k - kq;  // this lane's elements inside a row: <= 0, 1 .. VEC-1, or >= VEC
    // Row of instruction u in tile t; rows past m read row m - 1 (any valid row)
    // and are never stored.
    auto row_of = [&](i64 t, int u) { return t * ROWS + (i64)(warp * U + u) * RPI + rr; };
    // Lanes past k (k = 12 in float32: 3 vectors on 4 lanes) form no address at all.
    auto load = [&](T (&a)[U][VEC], i64 t) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 r = min(row_of(t, u), (i64)m - 1);
            if (rem_k >= VEC) {
                load_vec_stream<T, VEC>(a[u], A + r * lda + kq);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) a[u][e] = (e < rem_k) ? A[r * lda + kq + e] : T(0);
            }
        }
    };
    const bool vec_c = sc1 == 1 && sc0 % VEC == 0 && (reinterpret_cast<unsigned long long>(C) % 16) == 0;

    T a[U][VEC], an[U][VEC];
    i64 t = blockIdx.x;
    if (t < ntile) load(a, t);
    for (; t < ntile; t += gridDim.x) {
        const i64 tn = t + gridDim.x;
        if (tn < ntile) load(an, tn);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            T acc[TN];
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[j] = T(0);
#pragma unroll
            for (int e = 0; e < VEC; ++e)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[j] = fma(a[u][e], b[e][j], acc[j]);
            warp_reduce_scatter<T, TN, TN, LPR / 2>(acc, lane);
            const i64 r = row_of(t, u);
            const int c0 = q * OPL;
            if (r < m && c0 < n) {
                T y[OPL];
#pragma unroll
                for (int i = 0; i < OPL; ++i) y[i] = alpha * acc[i];
                T* crow = C + r * sc0;
                if (beta != T(0)) {
#pragma unroll
                    for (int i = 0; i < OPL; ++i)
                        if (c0 + i < n) y[i] = fma(beta, crow[(i64)(c0 + i) * sc1], y[i]);
                }
                constexpr int SV = OPL < VEC ? OPL : VEC;  // elements per store
                if (vec_c && c0 + OPL <= n && (c0 % SV) == 0) {
#pragma unroll
                    for (int i = 0; i < OPL; i += SV) {
                        T z[SV];
#pragma unroll
                        for (int s = 0; s < SV; ++s) z[s] = y[i + s];
                        store_vec<T, SV>(crow + c0 + i, z);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < OPL; ++i)
                        if (c0 + i < n) crow[(i64)(c0 + i) * sc1] = y[i];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int e = 0; e < VEC; ++e) a[u][e] = an[u][e];
    }
}

// ------------------------------------------------------------------ opt1, column-major A, in registers

// Algorithm 6 for a column-major A with no shared-memory tile of A: each thread
// loads its VEC consecutive rows of every column straight into registers (KT
// 16-byte loads, all issued before the first is used), so a thread has KT * 16
// bytes in flight from its first instructions on, and nothing waits on a block
// barrier. Meant for mid-sized m (1e4 .. 1e6 rows), where tsm2l_opt1's ring has
// one or two tiles per block to overlap and its barriers and shared-memory
// round trip are a large part of a short launch.
//   - B (one chunk, n <= TN) sits in shared memory, filled while the first loads
//     of A are in flight;
//   - once a tile is summed, the next tile's loads go out (into the same
//     registers) before the current tile is stored: the prefetch of Algorithm 6
//     with no second register set;
//   - SC = 1 stages a row-major C through a per-warp slice of shared memory
//     (a warp barrier only) so that each store instruction covers contiguous
//     rows; SC = 0 stores each row's TN outputs directly (16-byte vectors where
//     C allows), 32 scattered rows per instruction.
// Needs: k <= KT, n <= TN, A's columns 16-byte aligned for VEC * sizeof(T) = 16
// (lda % VEC == 0 and an aligned base; the launcher's layout check).
template <typename T, int VEC, int T1, int KT, int TN, int SC>
struct L1dTile {
    static constexpr int ROWS = T1 * VEC;
    static constexpr int WROWS = 32 * VEC;  // rows of one warp
    static constexpr int C_LD = TN + 1;     // odd: lanes write rows conflict-free
    static constexpr int SMEM_BYTES =
        (KT * TN + (SC ? (T1 / 32) * WROWS * C_LD : 0)) * (int)sizeof(T);
};

template <typename T, int VEC, int T1, int KT, int TN, int SC>
__global__ void __launch_bounds__(T1)
tsm2l_opt1d(const T* __restrict__ A, i64 lda, const T* __restrict__ B, i64 sb0, i64 sb1,
            T* __restrict__ C, i64 sc0, i64 sc1, int m, int n, int k, T alpha, T beta) {
    typedef L1dTile<T, VEC, T1, KT, TN, SC> L;
    constexpr int ROWS = L::ROWS, WROWS = L::WROWS, C_LD = L::C_LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Bs = reinterpret_cast<T*>(smem_raw);
    T* Cw = Bs + KT * TN + (threadIdx.x >> 5) * (WROWS * C_LD);  // this warp's slice (SC)
    const int tid = threadIdx.x, lane = tid & 31;
    const i64 ntile = ((i64)m + ROWS - 1) / ROWS;

    T a[KT][VEC];
    auto load = [&](i64 t) {
        const i64 r = t * ROWS + (i64)tid * VEC;
        const int rvalid = (int)max((i64)0, min((i64)VEC, (i64)m - r));
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            if (kk < k && rvalid > 0)
                load_vec_partial<T, VEC>(a[kk], A + r + (i64)kk * lda, rvalid);
            else
#pragma unroll
                for (int v = 0; v < VEC; ++v) a[kk][v] = T(0);
        }
    };

    i64 t = blockIdx.x;
    if (t < ntile) load(t);  // in flight while B is copied
    for (int e = tid; e < KT * TN; e += T1) {
        const int kk = e / TN, j = e % TN;
        Bs[e] = (kk < k && j < n) ? B[(i64)kk * sb0 + (i64)j * sb1] : T(0);
    }
    __syncthreads();  // the only block barrier: Bs is read-only from here on

    constexpr int CV = 16 / sizeof(T);
    constexpr int SV = TN < CV ? TN : CV;  // elements per vector store
    const bool vec_c = sc1 == 1 && n % SV == 0 && sc0 % SV == 0 &&
                       reinterpret_cast<unsigned long long>(C) % (SV * sizeof(T)) == 0;
    const bool stage = SC && sc1 == 1 && n > 1;
    const bool read_c = beta != T(0);

    for (; t < ntile; t += gridDim.x) {
        T acc[VEC][TN];
#pragma unroll
        for (int v = 0; v < VEC; ++v)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[v][j] = T(0);
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) fma_rows_from_smem<T, VEC, TN>(acc, a[kk], Bs + kk * TN);
        const i64 tn = t + gridDim.x;
        if (tn < ntile) load(tn);  // next tile's loads overlap this tile's stores

        const i64 r0 = t * ROWS + (i64)tid * VEC;
        if (stage) {
            // Row l * VEC + v of the warp's rows sits at (v * 32 + l) * C_LD: for
            // each v, consecutive lanes write rows C_LD apart, C_LD odd.
            __syncwarp();  // the previous tile's copy-out has read Cw
#pragma unroll
            for (int v = 0; v < VEC; ++v)
#pragma unroll
                for (int j = 0; j < TN; ++j) Cw[(v * 32 + lane) * C_LD + j] = acc[v][j];
            __syncwarp();
            const i64 w0 = t * ROWS + (i64)(tid >> 5) * WROWS;  // the warp's first row
            if (vec_c) {
                constexpr int CPR = TN / SV;
#pragma unroll 1
                for (int e = lane; e < WROWS * CPR; e += 32) {
                    const int rr = e / CPR, j0 = (e % CPR) * SV;
                    const i64 r = w0 + rr;
                    if (r >= m || j0 >= n) continue;
                    const T* cs = Cw + ((rr % VEC) * 32 + rr / VEC) * C_LD + j0;
                    T* cp = C + r * sc0 + j0;
                    T y[SV], x[SV];
                    if (read_c) load_vec<T, SV>(x, cp);
#pragma unroll
                    for (int q = 0; q < SV; ++q) y[q] = read_c ? fma(beta, x[q], alpha * cs[q]) : alpha * cs[q];
                    store_vec<T, SV>(cp, y);
                }
            } else {
#pragma unroll 2  // with "unroll 1" ptxas (sm_90) spilled a few bytes in some instantiations
                for (int e = lane; e < WROWS * TN; e += 32) {
                    const int rr = e / TN, j = e % TN;
                    const i64 r = w0 + rr;
                    if (r >= m || j >= n) continue;
                    T x = alpha * Cw[((rr % VEC) * 32 + rr / VEC) * C_LD + j];
                    T* cp = C + r * sc0 + j;
                    if (read_c) x = fma(beta, *cp, x);
                    *cp = x;
                }
            }
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                const i64 r = r0 + v;
                if (r >= m) continue;
                T* crow = C + r * sc0;
                if (vec_c) {
#pragma unroll
                    for (int j0 = 0; j0 < TN; j0 += SV) {
                        if (j0 >= n) continue;
                        T y[SV];
#pragma unroll
                        for (int q = 0; q < SV; ++q) y[q] = alpha * acc[v][j0 + q];
                        if (beta != T(0)) {
                            T x[SV];
                            load_vec<T, SV>(x, crow + j0);
#pragma unroll
                            for (int q = 0; q < SV; ++q) y[q] = fma(beta, x[q], y[q]);
                        }
                        store_vec<T, SV>(crow + j0, y);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        if (j >= n) continue;
                        T x = alpha * acc[v][j];
                        if (beta != T(0)) x = fma(beta, crow[(i64)j * sc1], x);
                        crow[(i64)j * sc1] = x;
                    }
                }
            }
        }
    }
}

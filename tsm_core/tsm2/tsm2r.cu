// TSM2R: C = alpha * A @ B + beta * C with A (m x k) large and B (k x n) tall and
// skinny (n small). Chen et al., "TSM2X", section 3.1.
//
// The optimisation ladder of the paper, each version validated against the same
// float64 reference (tests/test_gpu_tsm2.py):
//   v0  Algorithm 1: one thread per row of C, inner products (A read n times)
//   v1  Algorithm 2: one thread per row, outer products (A read once per n-chunk)
//   v2  Algorithm 3: v1 + a t1 x t2 tile of B in shared memory, t3 elements of A
//       fetched at a time
//   v3  Algorithm 4: v2 + prefetching: the next tiles of A and B are fetched while
//       the current ones are used. On sm_80+ the prefetch is a cp.async ring of NS
//       shared-memory stages (the modern form of the paper's nextA/nextB registers:
//       the copies do not even occupy registers while in flight). v3 also splits k
//       across blocks (split-K) so that small m still fills a 132-SM GPU, and has a
//       thread mapping for each layout of A so that every read of A is coalesced:
//         tsm2r_v3  (A column-major): thread = VEC consecutive rows; a k-step of
//                   the tile is T1*VEC contiguous elements (the paper's mapping);
//         tsm2r_v3r (A row-major): a warp owns R rows and its lanes split k, so
//                   each load instruction reads 512 contiguous bytes of a row
//                   (or RG groups of lanes own R rows each: 512/RG bytes of RG
//                   rows per instruction, B broadcast to the groups);
//         tsm2r_v3d (float64, A row-major): the same on the FP64 tensor
//                   cores (mma.m8n8k4.f64), 8 rows per A fragment;
//         tsm2r_v3x (float32, A row-major): on the tensor cores in 3xTF32
//                   (mma.m16n8k8.tf32, operands split in two TF32 parts), 16 rows
//                   per A fragment.
//
// Shapes: A is (m, k), B is (k, n), C is (m, n); every size >= 1, none needs to be
// a multiple of a tile. Strides are in elements; products of sizes are 64-bit.
#include "common.cuh"

// ------------------------------------------------------------------ epilogue

// C = alpha * acc + beta * C. C is not read when beta == 0 (BLAS semantics: a
// NaN already in C must not leak into the result).
template <typename T>
__device__ __forceinline__ void store_c(T* C, i64 off, T acc, T alpha, T beta) {
    T r = alpha * acc;
    if (beta != T(0)) r = fma(beta, C[off], r);
    C[off] = r;
}

// ------------------------------------------------------------------ v0

template <typename T>
__global__ void tsm2r_v0(const T* __restrict__ A, i64 sa0, i64 sa1,
                         const T* __restrict__ B, i64 sb0, i64 sb1,
                         T* __restrict__ C, i64 sc0, i64 sc1,
                         int m, int n, int k, T alpha, T beta) {
    const i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    for (int i = 0; i < n; ++i) {
        T s = T(0);
        for (int j = 0; j < k; ++j) s = fma(A[r * sa0 + j * sa1], B[j * sb0 + i * sb1], s);
        store_c(C, r * sc0 + i * sc1, s, alpha, beta);
    }
}

// ------------------------------------------------------------------ v1

template <typename T, int TN>
__global__ void tsm2r_v1(const T* __restrict__ A, i64 sa0, i64 sa1,
                         const T* __restrict__ B, i64 sb0, i64 sb1,
                         T* __restrict__ C, i64 sc0, i64 sc1,
                         int m, int n, int k, T alpha, T beta) {
    const i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    for (int p = 0; p < n; p += TN) {
        T acc[TN];
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[j] = T(0);
        for (int l = 0; l < k; ++l) {
            const T a = A[r * sa0 + l * sa1];
#pragma unroll
            for (int j = 0; j < TN; ++j)
                if (p + j < n) acc[j] = fma(a, B[l * sb0 + (p + j) * sb1], acc[j]);
        }
#pragma unroll
        for (int j = 0; j < TN; ++j)
            if (p + j < n) store_c(C, r * sc0 + (p + j) * sc1, acc[j], alpha, beta);
    }
}

// ------------------------------------------------------------------ v2

// Block of T1 threads, one row each; B tile of T1 rows x TN columns in shared
// memory, each thread fetching one row of it (t1 = threads, as in the paper).
template <typename T, int T1, int TN, int T3>
__global__ void __launch_bounds__(T1)
tsm2r_v2(const T* __restrict__ A, i64 sa0, i64 sa1,
         const T* __restrict__ B, i64 sb0, i64 sb1,
         T* __restrict__ C, i64 sc0, i64 sc1,
         int m, int n, int k, T alpha, T beta) {
    __shared__ __align__(16) T Bs[T1][TN];
    const int tid = threadIdx.x;
    const i64 r = (i64)blockIdx.x * T1 + tid;
    const bool live = r < m;
    for (int p = 0; p < n; p += TN) {
        T acc[TN];
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[j] = T(0);
        for (int j0 = 0; j0 < k; j0 += T1) {
            __syncthreads();  // the previous tile is no longer being read
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const i64 row = j0 + tid;
                Bs[tid][j] = (row < k && p + j < n) ? B[row * sb0 + (p + j) * sb1] : T(0);
            }
            __syncthreads();
            if (live) {
                const int lim = min(T1, k - j0);
                for (int l = 0; l < lim; l += T3) {
                    T a[T3];
#pragma unroll
                    for (int q = 0; q < T3; ++q)
                        a[q] = (l + q < lim) ? A[r * sa0 + (i64)(j0 + l + q) * sa1] : T(0);
#pragma unroll
                    for (int q = 0; q < T3; ++q)
                        if (l + q < lim) fma_row_from_smem<T, TN>(acc, a[q], &Bs[l + q][0]);
                }
            }
        }
        if (live) {
#pragma unroll
            for (int j = 0; j < TN; ++j)
                if (p + j < n) store_c(C, r * sc0 + (p + j) * sc1, acc[j], alpha, beta);
        }
    }
}

// ------------------------------------------------------------------ stream-K
// Split-K cuts every row block's k into the same number of slices, so the grid is
// row blocks x splits blocks: where that is not a whole number of waves the last
// wave runs part-empty (float32 row-major n = 16, m = 20480: 160 row blocks of 128
// rows, 2 resident per SM on 132 SMs, is 0.61 of a wave unsplit and 1.82 waves at
// 3 splits). Stream-K (Osama et al., PPoPP 2023) instead lays the work out as one
// line of units, unit = (row block, KT-deep k-tile) row block after row block, and
// gives each of G blocks (one full wave, and at most one block per unit, so that
// no run is empty) an equal contiguous run of it.
// A run that covers a row block's whole k writes C itself; the others write their
// partial sums to slot (block - first block of that row block) of W, and
// tsm2r_streamk_reduce adds the slots of each split row block in slot order
// (deterministic) and applies the epilogue. Both row-major tensor-core kernels have
// this form (tsm2r_v3d_sk, tsm2r_v3x_sk): their block bodies take the k-range and
// the output slot as arguments; unit = (row block, one KT-deep B tile). tsm2r_v3
// (column-major A) has none: on its 8-deep k-tiles stream-K lost to its split-K
// grid at every shape tried (measured on the H100, 2026-11-23).

// First unit of block g: floor(g * units / G) (64-bit: units * G < 2^63).
__device__ __forceinline__ i64 sk_start(i64 g, i64 units, i64 G) { return g * units / G; }

// The block whose run holds unit u.
__device__ __forceinline__ i64 sk_block_of(i64 u, i64 units, i64 G) {
    i64 g = u * G / units;
    while (g + 1 < G && sk_start(g + 1, units, G) <= u) ++g;
    while (g > 0 && sk_start(g, units, G) > u) --g;
    return g;
}

// ------------------------------------------------------------------ v3, column-major A

// Column-major A (A[i, j] at i + j*lda): a thread owns VEC consecutive rows (one
// 16-byte vector per column), so a warp's copy of one column of a tile is 32*VEC
// contiguous elements: the paper's mapping.
// Template parameters:
//   VEC    elements per 16-byte copy of A (fewer when A is not 16-byte aligned)
//   T1     threads per block (t1); rows per block T1*VEC
//   TN     columns of C per pass (t2); n > TN makes ceil(n/TN) passes over A
//   KC     k-depth of one pipeline stage (t3: A vectors each thread fetches at once)
//   NS     pipeline stages (NS - 1 tiles in flight while one is computed)
// Grid: (ceil(m / (T1*VEC)), splits). Block y handles k in
// [y*kchunk, min(k, (y+1)*kchunk)); with splits > 1 it writes raw partial sums to
// W[(y*n + col)*m + row] and tsm2r_splitk_reduce finishes C.
template <typename T, int VEC, int T1, int TN, int KC>
struct V3Tile {
    static constexpr int ROWS = T1 * VEC;
    static constexpr int A_ELEMS = KC * ROWS;  // [KC][ROWS]
    static constexpr int B_ELEMS = KC * TN;    // [KC][TN]
    static constexpr int STAGE = A_ELEMS + B_ELEMS;
};

template <typename T, int VEC, int T1, int TN, int KC, int NS>
__global__ void __launch_bounds__(T1)
tsm2r_v3(const T* __restrict__ A, i64 lda,
         const T* __restrict__ B, i64 sb0, i64 sb1,
         T* __restrict__ C, i64 sc0, i64 sc1, T* __restrict__ W,
         int m, int n, int k, int kchunk, T alpha, T beta) {
    typedef V3Tile<T, VEC, T1, TN, KC> Tile;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* smem = reinterpret_cast<T*>(smem_raw);

    const int tid = threadIdx.x;
    const i64 row0 = (i64)blockIdx.x * Tile::ROWS;
    const int kbeg = blockIdx.y * kchunk;
    const int kend = min(k, kbeg + kchunk);
    const int ntiles = (kend - kbeg + KC - 1) / KC;

    // Issue the copies of k-tile `t` into stage `s`. Everything past the edges
    // of A and B is zero-filled, so the compute loop needs no bounds checks.
    auto issue = [&](int t, int s, int p) {
        T* As = smem + s * Tile::STAGE;
        T* Bs = As + Tile::A_ELEMS;
        const int kt = kbeg + t * KC;
        // KC columns of ROWS contiguous elements; thread tid copies rows
        // [tid*VEC, tid*VEC+VEC) of each column: a warp covers 32*16 bytes.
        const i64 r = row0 + (i64)tid * VEC;
        const int rvalid = (int)max((i64)0, min((i64)VEC, (i64)m - r));
#pragma unroll
        for (int kk = 0; kk < KC; ++kk) {
            const int col = kt + kk;
            const bool ok = col < kend && rvalid > 0;
            const T* src = ok ? A + r + (i64)col * lda : A;
            cp_async<VEC * sizeof(T)>(As + kk * Tile::ROWS + tid * VEC, src, ok ? rvalid * (int)sizeof(T) : 0);
        }
        // B tile: KC x TN elements, any strides, one element per copy.
#pragma unroll 1
        for (int e = tid; e < Tile::B_ELEMS; e += T1) {
            const int kk = e / TN, j = e % TN;
            const bool ok = kt + kk < kend && p + j < n;
            const T* src = ok ? B + (i64)(kt + kk) * sb0 + (i64)(p + j) * sb1 : B;
            cp_async<sizeof(T)>(Bs + kk * TN + j, src, ok ? (int)sizeof(T) : 0);
        }
    };

    for (int p = 0; p < n; p += TN) {
        T acc[VEC][TN];
#pragma unroll
        for (int v = 0; v < VEC; ++v)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[v][j] = T(0);

        // Prologue: NS-1 tiles in flight. Every iteration commits exactly one
        // group (possibly empty) so that wait_group<NS-2> always means "tile t
        // has landed".
#pragma unroll
        for (int s = 0; s < NS - 1; ++s) {
            if (s < ntiles) issue(s, s, p);
            cp_async_commit();
        }
        for (int t = 0; t < ntiles; ++t) {
            cp_async_wait<NS - 2>();
            // Makes tile t visible to every thread, and guarantees that stage
            // (t-1) % NS, refilled just below, is no longer being read.
            __syncthreads();
            if (t + NS - 1 < ntiles) issue(t + NS - 1, (t + NS - 1) % NS, p);
            cp_async_commit();

            const T* As = smem + (t % NS) * Tile::STAGE;
            const T* Bs = As + Tile::A_ELEMS;
#pragma unroll 4
            for (int kk = 0; kk < KC; ++kk) {
                T a[VEC];
                load_vec<T, VEC>(a, As + kk * Tile::ROWS + tid * VEC);
                fma_rows_from_smem<T, VEC, TN>(acc, a, Bs + kk * TN);
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // stages are reused by the next pass

#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const i64 r = row0 + (i64)tid * VEC + v;
            if (r >= m) continue;
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                if (p + j >= n) continue;
                if (gridDim.y == 1)
                    store_c(C, r * sc0 + (i64)(p + j) * sc1, acc[v][j], alpha, beta);
                else
                    W[((i64)blockIdx.y * n + p + j) * m + r] = acc[v][j];
            }
        }
    }
}

// Sums the split-K partials in a fixed order (deterministic) and applies the
// epilogue. One thread per element of C, rows fastest: reads of W are coalesced.
template <typename T>
__global__ void tsm2r_splitk_reduce(const T* __restrict__ W, int splits,
                                    T* __restrict__ C, i64 sc0, i64 sc1,
                                    int m, int n, T alpha, T beta) {
    const i64 total = (i64)m * n;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const i64 r = idx % m, j = idx / m;
        T s = T(0);
        for (int y = 0; y < splits; ++y) s += W[((i64)y * n + j) * m + r];
        store_c(C, r * sc0 + j * sc1, s, alpha, beta);
    }
}

// ------------------------------------------------------------------ v3, row-major A

// Row-major A (A[i, j] at i*lda + j): a warp owns R rows and walks each of them
// from kbeg to kend in long contiguous runs (what DRAM pages like; a tile of many
// rows x a short k-segment, as tsm2r_v3 stages for column-major A, runs far
// slower here). The warp's lanes form G groups of LPG = 32/G lanes: the lanes of
// a group split k (VEC consecutive elements each, so a load instruction covers
// LPG*VEC contiguous elements of a row, the same addresses for every group),
// and group g owns columns [g*TG, g*TG+TG) of the n-chunk, TG = TN/G. Splitting
// the columns is what keeps shared memory from being the bottleneck: each lane
// reads VEC x TG values of B per step instead of VEC x TN, and the G groups read
// the same addresses (broadcast), so the B traffic per byte of A falls by G*G.
// Lanes can instead form RG groups that split the *rows* (G must then be 1): a
// group of LPG = 32/RG lanes splits k and owns R rows of its own, and all groups
// read the same B addresses, so one shared-memory wavefront serves RG lanes per
// 16-byte piece: B traffic per byte of A falls by RG with no extra registers
// and no repeated loads of A (each load instruction covers RG rows x LPG*VEC
// contiguous elements; a 128-byte piece per row at LPG = 8).
// With PF the next step's A is prefetched into registers while the current one
// is used (Algorithm 4's nextA); without, the registers go to more resident warps,
// whose loads hide each other's latency instead.
//
// B is read k-major (Bk[j*ldb + kk], i.e. B transposed; the launcher makes such
// a copy when B is not laid out so). The block's warps walk k in step, and a
// KT-deep tile of B (TN x KT) is double-buffered in shared memory with cp.async
// (Algorithm 4's nextB): every value of B comes from L2 once per block and
// feeds W*R rows. After the k-loop the R*TG partial sums of each lane are summed
// over the LPG lanes of its group with a reduce-scatter.
//
// Grid: (ceil(m / (W*RG*R)), splits); block y handles k in [y*kchunk, ...),
// kchunk a multiple of KT; with splits > 1 partial sums go to Wk as in tsm2r_v3.
template <typename T, int VEC, int W, int R, int TN, int KT, int G, int PF, int RG = 1>
// Launch bounds: with R*TN >= 32 sums per lane, 3 blocks per SM for float32 with
// prefetch (<= 85 registers), else 2 (<= 128; float64 then needs a one-step B
// tile not to spill), measured fastest: occupancy beats registers here. Otherwise
// 1, which leaves ptxas the whole register file.
__global__ void __launch_bounds__(W * 32, (W <= 8 && R * TN >= 32) ? ((sizeof(T) == 4 && PF) ? 3 : 2) : 1)
tsm2r_v3r(const T* __restrict__ A, i64 lda, const T* __restrict__ Bk, i64 ldb,
          T* __restrict__ C, i64 sc0, i64 sc1, T* __restrict__ Wk,
          int m, int n, int k, int kchunk, T alpha, T beta) {
    constexpr int LPG = 32 / (G * RG);  // lanes per group
    constexpr int TG = TN / G;          // columns per group
    constexpr int STEP = LPG * VEC;     // k per warp step
    constexpr int V = R * TG;           // partial sums per lane
    static_assert(TN % G == 0 && 32 % (G * RG) == 0, "groups split the columns and the warp evenly");
    static_assert(G == 1 || RG == 1, "lane groups split either the columns or the rows");
    static_assert(KT % STEP == 0, "a B tile holds whole warp steps");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Bs0 = reinterpret_cast<T*>(smem_raw);  // [2][TN][KT]

    const int lane = threadIdx.x & 31;
    const int sub = lane % LPG;
    const int grp = RG == 1 ? lane / LPG : 0;   // column group
    const int rgrp = RG == 1 ? 0 : lane / LPG;  // row group
    const int warp = threadIdx.x >> 5;
    const i64 row0 = (((i64)blockIdx.x * W + warp) * RG + rgrp) * R;
    const int kbeg = blockIdx.y * kchunk;
    const int kend = min(k, kbeg + kchunk);
    const int ntiles = (kend - kbeg + KT - 1) / KT;

    // Rows past m read row m-1 (any valid row) and are never stored.
    const T* arow = A + min(row0, (i64)m - 1) * lda;
    int rv[R];  // row v of the warp is arow + rv[v] * lda
#pragma unroll
    for (int v = 0; v < R; ++v) rv[v] = (int)min((i64)v, (i64)m - 1 - min(row0, (i64)m - 1));

    // Whole-step loads (the warp-uniform fast path) and edge loads (zero-filled).
    auto load_a_full = [&](T (&a)[R][VEC], int kk) {
#pragma unroll
        for (int v = 0; v < R; ++v) load_vec_stream<T, VEC>(a[v], arow + (i64)rv[v] * lda + kk);
    };
    auto load_a = [&](T (&a)[R][VEC], int kk) {
        const int valid = kend - kk;
#pragma unroll
        for (int v = 0; v < R; ++v) {
            const T* pr = arow + (i64)rv[v] * lda + kk;
#pragma unroll
            for (int q = 0; q < VEC; ++q) a[v][q] = (q < valid) ? pr[q] : T(0);
        }
    };
    auto issue_b = [&](int t, int buf, int p) {
        T* Bs = Bs0 + buf * (TN * KT);
        const int kt0 = kbeg + t * KT;
        constexpr int CH = TN * KT / VEC;
#pragma unroll 1
        for (int c = threadIdx.x; c < CH; c += W * 32) {
            const int j = c / (KT / VEC), kk = (c % (KT / VEC)) * VEC;
            const int valid = (p + j < n) ? max(0, min(VEC, kend - (kt0 + kk))) : 0;
            const T* src = valid > 0 ? Bk + (i64)(p + j) * ldb + kt0 + kk : Bk;
            cp_async<VEC * sizeof(T)>(Bs + j * KT + kk, src, valid * (int)sizeof(T));
        }
    };

    for (int p = 0; p < n; p += TN) {
        T acc[V];
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] = T(0);

        T a[R][VEC], an[R][VEC];
        if (PF && kbeg + sub * VEC < kend) {
            if (kbeg + STEP <= kend) load_a_full(a, kbeg + sub * VEC);
            else load_a(a, kbeg + sub * VEC);
        }
        issue_b(0, 0, p);
        cp_async_commit();
        for (int t = 0; t < ntiles; ++t) {
            cp_async_wait<0>();
            __syncthreads();  // tile t has landed; buffer (t+1)&1 is no longer read
            if (t + 1 < ntiles) issue_b(t + 1, (t + 1) & 1, p);
            cp_async_commit();
            const T* Bs = Bs0 + (t & 1) * (TN * KT) + grp * TG * KT;
            const int kt0 = kbeg + t * KT;
#pragma unroll 1
            for (int s = 0; s < KT / STEP; ++s) {
                const int kbase = kt0 + s * STEP;  // warp-uniform
                const int kk = kbase + sub * VEC;
                if (kk >= kend) break;
                if constexpr (PF) {
                    if (kbase + 2 * STEP <= kend) load_a_full(an, kk + STEP);
                    else if (kk + STEP < kend) load_a(an, kk + STEP);
                } else {
                    // no register prefetch: more resident warps hide the latency
                    if (kbase + STEP <= kend) load_a_full(a, kk);
                    else load_a(a, kk);
                }
#pragma unroll
                for (int j = 0; j < TG; ++j) {
                    T b[VEC];
                    load_vec<T, VEC>(b, Bs + j * KT + s * STEP + sub * VEC);
#pragma unroll
                    for (int v = 0; v < R; ++v)
#pragma unroll
                        for (int q = 0; q < VEC; ++q) acc[v * TG + j] = fma(a[v][q], b[q], acc[v * TG + j]);
                }
                if constexpr (PF) {
#pragma unroll
                    for (int v = 0; v < R; ++v)
#pragma unroll
                        for (int q = 0; q < VEC; ++q) a[v][q] = an[v][q];
                }
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // the buffers are refilled by the next pass

        warp_reduce_scatter<T, V, V, LPG / 2>(acc, lane);
        constexpr int MINE = V >= LPG ? V / LPG : 1;
        // With V < LPG several lanes of a group hold the same sums; one stores.
        constexpr int DUP = V >= LPG ? 1 : LPG / V;
        if (sub % DUP == 0) {
#pragma unroll
            for (int i = 0; i < MINE; ++i) {
                const int idx = scattered_index<V, LPG / 2>(i, lane);
                const int v = idx / TG, j = grp * TG + idx % TG;
                const i64 r = row0 + v;
                if (r < m && p + j < n) {
                    if (gridDim.y == 1)
                        store_c(C, r * sc0 + (i64)(p + j) * sc1, acc[i], alpha, beta);
                    else
                        Wk[((i64)blockIdx.y * n + p + j) * m + r] = acc[i];
                }
            }
        }
    }
}

// ------------------------------------------------------------------ v3d
// float64, A row-major, on the FP64 tensor cores (DMMA, mma.m8n8k4.f64).
//
// Why: with 16 columns of C a float64 element of A feeds 16 FMAs; at the read
// bandwidth that is ~37% of the SM's FP64 FMA pipe before any load, shuffle or
// address instruction, and tsm2r_v3r is issue-bound there (0.53-0.56 of the
// bandwidth). One DMMA does 256 FMAs per warp instruction instead of 32.
//
// Mapping: a warp owns R groups of 8 rows. In an m8n8k4 A fragment lane l holds
// row l/4 and k-index l%4; the sum over k does not care which real k an index
// stands for, so lane l loads 2 *consecutive* elements (one 16-byte load) at
// k = k0 + 8u + 2(l%4) + {0,1} and feeds them to two DMMAs (j = 0, 1). Every load
// instruction then reads 8 rows x 64 contiguous bytes (whole 32-byte sectors); U
// such pieces (u = 0 .. U-1) make a warp step, a run of 64U bytes per row (longer
// runs per row are kinder to DRAM: see tsm2r_v3x).
// The B fragment (k-index l%4, column l/4) must name the same real k: lane l
// reads Bs[col][k0 + 8u + 2(l%4) + {0,1}], one 16-byte shared load for both j.
// C fragment: lane l holds row l/4, columns 2(l%4) + {0,1} of each 8-column half.
// (dmma_8x8x4 itself is in common.cuh.)

// One block's work; as v3x_block (SK false: the split-K grid, blockIdx and gridDim;
// SK true: a stream-K run, rows of block blk over k in [kb, ke)).
template <int VEC, int W, int R, int TN, int KT, int PF, int U, bool SK>
__device__ __forceinline__ void v3d_block(const double* __restrict__ A, i64 lda, const double* __restrict__ Bk,
                                          i64 ldb, double* __restrict__ C, i64 sc0, i64 sc1,
                                          double* __restrict__ Wk, int m, int n, int k, double alpha,
                                          double beta, unsigned blk, int kb, int ke, bool direct,
                                          unsigned slot) {
    constexpr int NH = TN / 8;   // 8-column halves of the n-chunk
    constexpr int STEP = 8 * U;  // k per warp step: U pieces of 4 lanes x 2 elements
    // Padded B rows: consecutive columns 64 bytes apart mod 128, so the 16-byte
    // loads of a quarter warp (2 columns x 4 k-pairs) hit 8 distinct bank pairs.
    constexpr int KP = KT + 8;
    static_assert(TN % 8 == 0 && KT % STEP == 0, "whole 8-column halves and warp steps");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    double* Bs0 = reinterpret_cast<double*>(smem_raw);  // [2][TN][KP]

    const int lane = threadIdx.x & 31;
    const int q = lane & 3, rr = lane >> 2;
    const int warp = threadIdx.x >> 5;
    const i64 row0 = ((i64)(SK ? blk : blockIdx.x) * W + warp) * (8 * R);
    const int kbeg = SK ? kb : blockIdx.y * kb;  // (split-K: kb is the chunk)
    const int kend = SK ? ke : min(k, kbeg + kb);
    const int ntiles = (kend - kbeg + KT - 1) / KT;

    // Rows past m read row m-1 (any valid row) and are never stored.
    const double* arow[R];
#pragma unroll
    for (int g = 0; g < R; ++g) arow[g] = A + min(row0 + 8 * g + rr, (i64)m - 1) * lda + 2 * q;

    auto load_a = [&](double (&a)[R][U][2], int kb) {  // kb: warp-uniform step base
        if (kb + STEP <= kend) {
#pragma unroll
            for (int g = 0; g < R; ++g)
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const double* p = arow[g] + kb + 8 * u;
                    if constexpr (VEC == 2) {
                        load_vec_stream<double, 2>(a[g][u], p);
                    } else {
                        a[g][u][0] = __ldcs(p);
                        a[g][u][1] = __ldcs(p + 1);
                    }
                }
        } else {
#pragma unroll
            for (int g = 0; g < R; ++g)
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int kk = kb + 8 * u + 2 * q + j;
                        a[g][u][j] = kk < kend ? arow[g][kb + 8 * u + j] : 0.0;
                    }
        }
    };
    auto issue_b = [&](int t, int buf, int p) {
        double* Bs = Bs0 + buf * (TN * KP);
        const int kt0 = kbeg + t * KT;
        constexpr int CH = TN * KT / VEC;
#pragma unroll 1
        for (int c = threadIdx.x; c < CH; c += W * 32) {
            const int j = c / (KT / VEC), kk = (c % (KT / VEC)) * VEC;
            const int valid = (p + j < n) ? max(0, min(VEC, kend - (kt0 + kk))) : 0;
            const double* src = valid > 0 ? Bk + (i64)(p + j) * ldb + kt0 + kk : Bk;
            cp_async<VEC * 8>(Bs + j * KP + kk, src, valid * 8);
        }
    };

    for (int p = 0; p < n; p += TN) {
        double acc[R][NH][2];
#pragma unroll
        for (int g = 0; g < R; ++g)
#pragma unroll
            for (int h = 0; h < NH; ++h) acc[g][h][0] = acc[g][h][1] = 0.0;

        double a[R][U][2], an[R][U][2];
        if (PF) load_a(a, kbeg);
        issue_b(0, 0, p);
        cp_async_commit();
        for (int t = 0; t < ntiles; ++t) {
            cp_async_wait<0>();
            __syncthreads();  // tile t has landed; buffer (t+1)&1 is no longer read
            if (t + 1 < ntiles) issue_b(t + 1, (t + 1) & 1, p);
            cp_async_commit();
            const double* Bs = Bs0 + (t & 1) * (TN * KP) + rr * KP + 2 * q;
            const int kt0 = kbeg + t * KT;
#pragma unroll 1
            for (int s = 0; s < KT / STEP; ++s) {
                const int kb = kt0 + s * STEP;  // warp-uniform
                if (kb >= kend) break;
                if constexpr (PF) {
                    if (kb + STEP < kend) load_a(an, kb + STEP);
                } else {
                    load_a(a, kb);
                }
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int h = 0; h < NH; ++h) {
                        double b[2];
                        load_vec<double, 2>(b, Bs + h * 8 * KP + s * STEP + 8 * u);
#pragma unroll
                        for (int g = 0; g < R; ++g) {
                            dmma_8x8x4(acc[g][h], a[g][u][0], b[0]);
                            dmma_8x8x4(acc[g][h], a[g][u][1], b[1]);
                        }
                    }
                if constexpr (PF) {
#pragma unroll
                    for (int g = 0; g < R; ++g)
#pragma unroll
                        for (int u = 0; u < U; ++u) a[g][u][0] = an[g][u][0], a[g][u][1] = an[g][u][1];
                }
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // the buffers are refilled by the next pass

#pragma unroll
        for (int g = 0; g < R; ++g) {
            const i64 r = row0 + 8 * g + rr;
            if (r >= m) continue;
#pragma unroll
            for (int h = 0; h < NH; ++h)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int col = p + h * 8 + 2 * q + i;
                    if (col >= n) continue;
                    if (SK ? direct : gridDim.y == 1)
                        store_c(C, r * sc0 + (i64)col * sc1, acc[g][h][i], alpha, beta);
                    else
                        Wk[((i64)(SK ? slot : blockIdx.y) * n + col) * m + r] = acc[g][h][i];
                }
        }
    }
}

template <int VEC, int W, int R, int TN, int KT, int PF, int U = 2>
__global__ void __launch_bounds__(W * 32)
tsm2r_v3d(const double* __restrict__ A, i64 lda, const double* __restrict__ Bk, i64 ldb,
          double* __restrict__ C, i64 sc0, i64 sc1, double* __restrict__ Wk,
          int m, int n, int k, int kchunk, double alpha, double beta) {
    v3d_block<VEC, W, R, TN, KT, PF, U, false>(A, lda, Bk, ldb, C, sc0, sc1, Wk, m, n, k, alpha, beta, 0,
                                               kchunk, 0, false, 0);
}

// The same run loop as tsm2r_v3x_sk's. Kept apart: one shared driver gave one of
// the two kernels different SASS (statement order), and that was not measured.
template <int VEC, int W, int R, int TN, int KT, int PF, int U, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
tsm2r_v3d_sk(const double* __restrict__ A, i64 lda, const double* __restrict__ Bk, i64 ldb,
             double* __restrict__ C, i64 sc0, i64 sc1, double* __restrict__ Wk,
             int m, int n, int k, i64 nu, double alpha, double beta) {
    const i64 G = gridDim.x, g = blockIdx.x;
    const i64 units = (((i64)m + W * 8 * R - 1) / (W * 8 * R)) * nu;
    const i64 u1 = sk_start(g + 1, units, G);
    for (i64 u = sk_start(g, units, G); u < u1;) {
        const i64 rb = u / nu, first = rb * nu;
        const i64 ue = min(u1, first + nu);
        const bool whole = (u == first) && (ue == first + nu);
        const unsigned slot = whole ? 0u : (unsigned)(g - sk_block_of(first, units, G));
        v3d_block<VEC, W, R, TN, KT, PF, U, true>(A, lda, Bk, ldb, C, sc0, sc1, Wk, m, n, k, alpha, beta,
                                                  (unsigned)rb, (int)((u - first) * KT),
                                                  (int)min((i64)k, (ue - first) * KT), whole, slot);
        __syncthreads();  // shared memory is refilled by the next run
        u = ue;
    }
}

// ------------------------------------------------------------------ v3x
// float32, A row-major, on the tensor cores in 3xTF32 (mma.m16n8k8.tf32).
//
// Why: tsm2r_v3r is bound by shared-memory and issue slots at 8-16 columns
// (ncu: L1/TEX 82%, issue slots 70% busy at n = 16): every lane needs its own k-slice of B,
// so each byte of A costs several bytes of B from shared memory plus one FFMA per
// column. An m16n8k8 fragment instead shares each B value among 16 rows, and one
// MMA does 1024 multiply-adds per warp instruction.
//
// Accuracy: TF32 keeps 10 of float32's 23 mantissa bits, so each operand is split
// into a high TF32 part (truncated: it cannot overflow) and the rest rounded to
// TF32, x = hi + lo with |lo| < 2^-10 |x|, and C accumulates hi*hi + hi*lo + lo*hi
// in float32 (three MMAs, the small terms first). The dropped lo*lo term is below
// 2^-20 |ab| per product and the rounding of lo below 2^-21 |x|: for signed data
// the error against a float64 reference is of the order of float32 FMA's
// (tests/test_gpu_tsm2.py holds both kernels to the same bound). The MMA itself
// accumulates with truncation, so it only sums 16-deep pieces (see the k-loop).
// Inf and NaN: a non-finite x has lo = 0, and its high part takes part only in
// hi*hi (the cross terms use hc = 0 instead), so Inf * b gives Inf where b's low
// part is 0 rather than Inf * 0 = NaN; a NaN is made quiet with its payload in the
// high bits (the MMA ignores the low 13). The one departure from IEEE: Inf times
// a subnormal below 2^-136 (whose TF32 high part is 0) gives NaN, not Inf.
// Mapping: a warp owns MT fragments of 16 rows. In an m16n8k8 A fragment lane
// (g, t) = (lane/4, lane%4) holds rows g, g+8 at k-indices t, t+4; the sum over k
// does not care which real k an index stands for, so lane (g, t) takes the 16-byte
// vector A[row][k0 + 4t .. k0 + 4t + 3] of rows g and g+8 and feeds elements
// (2j, 2j+1) to MMA j = 0, 1 as k-indices (t, t+4); U such 16-deep pieces make a
// warp step. The B fragment (k-indices t, t+4 of column g) must name the same real
// k: one 16-byte shared load of Bs[col][k0 + 4t ..] serves both MMAs.
// A reaches shared memory through a per-warp cp.async ring of NS stages (no
// registers held by loads in flight, and no block barrier: each warp waits for its
// own copies only); a stage is the warp's rows x 16U columns, copied in runs of
// 64U contiguous bytes per row (measured on the H100: 64-byte runs per row ran at
// 0.58 of the read bandwidth, 256-byte runs above 0.85). B is staged split (hi, hc,
// lo) in shared memory, double-buffered through registers, KT deep.
// C fragment: lane (g, t) holds rows g, g+8, columns 2t, 2t+1 of each 8-column half.
struct Tf32Parts {
    unsigned hi, hc, lo;  // hi*hi + hc*lo' + lo*hc' (hc: hi for finite x, else 0)
};

__device__ __forceinline__ Tf32Parts tf32_split(float x) {
    const float h = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
    const bool finite = fabsf(x) < __int_as_float(0x7f800000);
    // x - h is exact; rounded to TF32 by adding half a TF32 unit (the MMA drops
    // the low 13 bits): finite and below 2^-10 |x|, so the carry cannot overflow.
    const float r = finite ? x - h : 0.0f;
    Tf32Parts p;
    p.hi = __float_as_uint(finite ? h : x + 0.0f);  // x + 0: a NaN comes out quiet (0x7fffffff)
    p.hc = __float_as_uint(finite ? h : 0.0f);
    p.lo = __float_as_uint(r) + 0x1000u;
    return p;
}

// One block's work: rows [blk * W * 16 * MT, ...) over k in [kb, ke); C is written
// directly (direct) or the partial sums go to W's split slot `slot`. The split-K
// grid (SK false) takes blk, the k-range (kb = its chunk), direct and slot from
// blockIdx and gridDim instead, as the kernel did before stream-K: its code stays
// as it was.
template <int VEC, int W, int MT, int TN, int KT, int U, int NS, bool SK>
__device__ __forceinline__ void v3x_block(const float* __restrict__ A, i64 lda, const float* __restrict__ Bk,
                                          i64 ldb, float* __restrict__ C, i64 sc0, i64 sc1,
                                          float* __restrict__ Wk, int m, int n, int k, float alpha,
                                          float beta, unsigned blk, int kb, int ke, bool direct,
                                          unsigned slot) {
    constexpr int NH = TN / 8;    // 8-column halves of the n-chunk
    constexpr int STEP = 16 * U;  // k per warp step
    constexpr int ROWS = 16 * MT;  // rows per warp
    // Padded rows in shared memory: consecutive B columns (and A rows) 64 bytes
    // apart mod 128, so the 16-byte loads of a quarter warp (2 rows x 4 k-quads)
    // hit 8 distinct bank quads.
    constexpr int KP = KT + 16;
    constexpr int AS = STEP + (STEP % 32 ? 32 : 16);
    constexpr int BCH = TN * KT / VEC;                   // VEC-wide pieces of a B tile
    constexpr int BPT = (BCH + W * 32 - 1) / (W * 32);   // pieces per thread
    constexpr int CPR = STEP / VEC;                      // copies per row of an A stage
    constexpr int APL = ROWS * CPR / 32;                 // copies per lane of an A stage
    static_assert(TN % 8 == 0 && KT % STEP == 0 && KT % 32 == 0, "whole halves and warp steps");
    static_assert((ROWS * CPR) % 32 == 0 && NS != 1, "whole copies per lane, a ring of 2+ stages (or 0)");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned* Bs0 = reinterpret_cast<unsigned*>(smem_raw);  // [2 buffers][hi, hc, lo][TN][KP]

    const int lane = threadIdx.x & 31;
    const int t = lane & 3, g = lane >> 2;
    const int warp = threadIdx.x >> 5;
    const i64 row0 = ((i64)(SK ? blk : blockIdx.x) * W + warp) * ROWS;
    const int kbeg = SK ? kb : blockIdx.y * kb;  // (split-K: kb is the chunk)
    const int kend = SK ? ke : min(k, kbeg + kb);
    const int ntiles = (kend - kbeg + KT - 1) / KT;
    const int nsteps = (kend - kbeg + STEP - 1) / STEP;
    // NS = 0: no ring; each step's A is loaded into registers at its start, and the
    // other resident warps hide the latency.
    float* As = reinterpret_cast<float*>(Bs0 + 2 * 3 * TN * KP) + warp * (NS * ROWS * AS);  // [NS][ROWS][AS]
    const float* arow[MT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) arow[i][e] = A + min(row0 + 16 * i + 8 * e + g, (i64)m - 1) * lda + 4 * t;
    auto load_a = [&](float (&a)[MT][2][U][4], int kb) {  // kb: warp-uniform step base
        if (kb + STEP <= kend) {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const float* p = arow[i][e] + kb + 16 * u;
                        if constexpr (VEC == 4) {
                            load_vec_stream<float, 4>(a[i][e][u], p);
                        } else {
#pragma unroll
                            for (int q = 0; q < 4; ++q) a[i][e][u][q] = __ldcs(p + q);
                        }
                    }
        } else {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e)
#pragma unroll
                    for (int u = 0; u < U; ++u)
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const int kk = kb + 16 * u + 4 * t + q;
                            a[i][e][u][q] = kk < kend ? arow[i][e][kb + 16 * u + q] : 0.0f;
                        }
        }
    };

    // The warp's ring of A: stage st holds its ROWS rows x STEP columns from
    // kbeg + st*STEP, copied by cp.async (consecutive lanes along a row: CPR*VEC*4
    // contiguous bytes per row), zero-filled past kend. Rows past m copy row m-1
    // (any valid row) and are never stored.
    const float* cprow[NS ? APL : 1];
#pragma unroll
    for (int v = 0; v < (NS ? APL : 1); ++v) cprow[v] = A + min(row0 + (lane + 32 * v) / CPR, (i64)m - 1) * lda;
    auto issue_a = [&](int st) {
        const int kb = kbeg + st * STEP;
        float* dst = As + (st % (NS ? NS : 1)) * (ROWS * AS);
#pragma unroll
        for (int v = 0; v < APL; ++v) {
            const int c = lane + 32 * v;
            const int r = c / CPR, col = (c % CPR) * VEC;
            const int valid = max(0, min(VEC, kend - (kb + col)));
            cp_async<VEC * 4>(dst + r * AS + col, valid > 0 ? cprow[v] + kb + col : A, valid * 4);
        }
    };
    // B tile t (columns p.., k from kbeg + t*KT) into registers, zero past the edges.
    float breg[BPT][VEC];
    auto fetch_b = [&](int tile, int p) {
        const int kt0 = kbeg + tile * KT;
#pragma unroll
        for (int c = 0; c < BPT; ++c) {
            const int idx = threadIdx.x + c * W * 32;
            const int j = idx / (KT / VEC), kk = (idx % (KT / VEC)) * VEC;
            const int valid = (idx < BCH && p + j < n) ? max(0, min(VEC, kend - (kt0 + kk))) : 0;
            if (valid == VEC) {
                load_vec<float, VEC>(breg[c], Bk + (i64)(p + j) * ldb + kt0 + kk);
            } else {
#pragma unroll
                for (int q = 0; q < VEC; ++q) breg[c][q] = q < valid ? Bk[(i64)(p + j) * ldb + kt0 + kk + q] : 0.0f;
            }
        }
    };
    auto put_b = [&](int buf) {
        unsigned* Bh = Bs0 + buf * (3 * TN * KP);
#pragma unroll
        for (int c = 0; c < BPT; ++c) {
            const int idx = threadIdx.x + c * W * 32;
            if (BCH % (W * 32) != 0 && idx >= BCH) break;
            const int j = idx / (KT / VEC), kk = (idx % (KT / VEC)) * VEC;
            float h[VEC], hc[VEC], l[VEC];
#pragma unroll
            for (int q = 0; q < VEC; ++q) {
                const Tf32Parts s = tf32_split(breg[c][q]);
                h[q] = __uint_as_float(s.hi), hc[q] = __uint_as_float(s.hc), l[q] = __uint_as_float(s.lo);
            }
            float* d = reinterpret_cast<float*>(Bh) + j * KP + kk;
            store_vec<float, VEC>(d, h);
            store_vec<float, VEC>(d + TN * KP, hc);
            store_vec<float, VEC>(d + 2 * TN * KP, l);
        }
    };

    for (int p = 0; p < n; p += TN) {
        float acc[MT][NH][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < NH; ++h)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[i][h][c] = 0.0f;

        if constexpr (NS >= 2) {
#pragma unroll
            for (int st = 0; st < NS - 1; ++st) {
                if (st < nsteps) issue_a(st);
                cp_async_commit();
            }
        }
        fetch_b(0, p);
        put_b(0);
        __syncthreads();
        for (int tile = 0; tile < ntiles; ++tile) {
            if (tile + 1 < ntiles) fetch_b(tile + 1, p);  // in flight during this tile
            const float* Bh = reinterpret_cast<const float*>(Bs0) + (tile & 1) * (3 * TN * KP) + g * KP + 4 * t;
#pragma unroll 1
            for (int s = 0; s < KT / STEP; ++s) {
                const int st = tile * (KT / STEP) + s;
                if (st >= nsteps) break;
                float areg[MT][2][U][4];
                if constexpr (NS >= 2) {
                    cp_async_wait<(NS >= 2 ? NS - 2 : 0)>();
                    __syncwarp();  // stage st has landed for every lane; stage st-1 is read
                    if (st + NS - 1 < nsteps) issue_a(st + NS - 1);
                    cp_async_commit();
                } else {
                    load_a(areg, kbeg + st * STEP);
                }
                const float* Ast = As + (st % (NS ? NS : 1)) * (ROWS * AS) + g * AS + 4 * t;
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    unsigned bh[NH][4], bc[NH][4], bl[NH][4];
#pragma unroll
                    for (int h = 0; h < NH; ++h) {
                        const float* src = Bh + h * 8 * KP + s * STEP + 16 * u;
                        float x[4];
                        load_vec<float, 4>(x, src);
#pragma unroll
                        for (int q = 0; q < 4; ++q) bh[h][q] = __float_as_uint(x[q]);
                        load_vec<float, 4>(x, src + TN * KP);
#pragma unroll
                        for (int q = 0; q < 4; ++q) bc[h][q] = __float_as_uint(x[q]);
                        load_vec<float, 4>(x, src + 2 * TN * KP);
#pragma unroll
                        for (int q = 0; q < 4; ++q) bl[h][q] = __float_as_uint(x[q]);
                    }
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        float a[2][4];  // rows g, g+8 of fragment i: k-quad t of piece u
                        if constexpr (NS >= 2) {
                            load_vec<float, 4>(a[0], Ast + (16 * i) * AS + 16 * u);
                            load_vec<float, 4>(a[1], Ast + (16 * i + 8) * AS + 16 * u);
                        } else {
#pragma unroll
                            for (int q = 0; q < 4; ++q) a[0][q] = areg[i][0][u][q], a[1][q] = areg[i][1][u][q];
                        }
                        // A finite piece (the common case, decided per warp) is its
                        // own high part; otherwise each element is split with the
                        // Inf/NaN rules of tf32_split.
                        bool finite = true;
#pragma unroll
                        for (int e = 0; e < 2; ++e)
#pragma unroll
                            for (int q = 0; q < 4; ++q) finite = finite && fabsf(a[e][q]) < __int_as_float(0x7f800000);
                        Tf32Parts x[2][4];
                        if (__all_sync(0xffffffffu, finite)) {
#pragma unroll
                            for (int e = 0; e < 2; ++e)
#pragma unroll
                                for (int q = 0; q < 4; ++q) {
                                    x[e][q].hi = x[e][q].hc = __float_as_uint(a[e][q]);
                                    x[e][q].lo = tf32_low(a[e][q]);
                                }
                        } else {
#pragma unroll
                            for (int e = 0; e < 2; ++e)
#pragma unroll
                                for (int q = 0; q < 4; ++q) x[e][q] = tf32_split(a[e][q]);
                        }
                        // The MMA's float32 accumulation truncates (rounds towards
                        // zero): over thousands of MMAs into one fragment that bias
                        // reached 1e-5 of |C| at k = 20480. So each 16-deep piece is
                        // summed in a fresh fragment (6 MMAs) and added to acc by an
                        // IEEE (round-to-nearest) FADD.
                        float part[NH][4];
#pragma unroll
                        for (int h = 0; h < NH; ++h)
#pragma unroll
                            for (int c = 0; c < 4; ++c) part[h][c] = 0.0f;
#pragma unroll
                        for (int j = 0; j < 2; ++j) {
                            const int q0 = 2 * j, q1 = 2 * j + 1;
                            const unsigned ah[4] = {x[0][q0].hi, x[1][q0].hi, x[0][q1].hi, x[1][q1].hi};
                            const unsigned ac[4] = {x[0][q0].hc, x[1][q0].hc, x[0][q1].hc, x[1][q1].hc};
                            const unsigned al[4] = {x[0][q0].lo, x[1][q0].lo, x[0][q1].lo, x[1][q1].lo};
#pragma unroll
                            for (int h = 0; h < NH; ++h) {
                                mma_tf32_16x8x8(part[h], al, bc[h][q0], bc[h][q1]);
                                mma_tf32_16x8x8(part[h], ac, bl[h][q0], bl[h][q1]);
                                mma_tf32_16x8x8(part[h], ah, bh[h][q0], bh[h][q1]);
                            }
                        }
#pragma unroll
                        for (int h = 0; h < NH; ++h)
#pragma unroll
                            for (int c = 0; c < 4; ++c) acc[i][h][c] += part[h][c];
                    }
                }
            }
            if (tile + 1 < ntiles) put_b((tile + 1) & 1);
            __syncthreads();  // tile+1 is in place; buffer tile&1 is free for tile+2
        }
        if constexpr (NS >= 2) {
            cp_async_wait<0>();
            __syncwarp();  // the ring is refilled by the next pass
        }

#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const i64 r = row0 + 16 * i + 8 * e + g;
                if (r >= m) continue;
#pragma unroll
                for (int h = 0; h < NH; ++h)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int col = p + h * 8 + 2 * t + c;
                        if (col >= n) continue;
                        const float v = acc[i][h][2 * e + c];
                        if (SK ? direct : gridDim.y == 1)
                            store_c(C, r * sc0 + (i64)col * sc1, v, alpha, beta);
                        else
                            Wk[((i64)(SK ? slot : blockIdx.y) * n + col) * m + r] = v;
                    }
            }
    }
}

template <int VEC, int W, int MT, int TN, int KT, int U, int NS, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
tsm2r_v3x(const float* __restrict__ A, i64 lda, const float* __restrict__ Bk, i64 ldb,
          float* __restrict__ C, i64 sc0, i64 sc1, float* __restrict__ Wk,
          int m, int n, int k, int kchunk, float alpha, float beta) {
    v3x_block<VEC, W, MT, TN, KT, U, NS, false>(A, lda, Bk, ldb, C, sc0, sc1, Wk, m, n, k, alpha, beta, 0,
                                                kchunk, 0, false, 0);
}

template <int VEC, int W, int MT, int TN, int KT, int U, int NS, int MINB>
__global__ void __launch_bounds__(W * 32, MINB)
tsm2r_v3x_sk(const float* __restrict__ A, i64 lda, const float* __restrict__ Bk, i64 ldb,
             float* __restrict__ C, i64 sc0, i64 sc1, float* __restrict__ Wk,
             int m, int n, int k, i64 nu, float alpha, float beta) {
    const i64 G = gridDim.x, g = blockIdx.x;
    const i64 units = (((i64)m + W * 16 * MT - 1) / (W * 16 * MT)) * nu;
    const i64 u1 = sk_start(g + 1, units, G);
    for (i64 u = sk_start(g, units, G); u < u1;) {
        const i64 rb = u / nu, first = rb * nu;
        const i64 ue = min(u1, first + nu);
        const int kbeg = (int)((u - first) * KT);
        const int kend = (int)min((i64)k, (ue - first) * KT);
        const bool whole = (u == first) && (ue == first + nu);
        const unsigned slot = whole ? 0u : (unsigned)(g - sk_block_of(first, units, G));
        v3x_block<VEC, W, MT, TN, KT, U, NS, true>(A, lda, Bk, ldb, C, sc0, sc1, Wk, m, n, k, alpha, beta,
                                             (unsigned)rb, kbeg, kend, whole, slot);
        __syncthreads();  // shared memory is refilled by the next run
        u = ue;
    }
}

// C for the row blocks stream-K split: the sum of their slots in W, in slot order.
// One thread per element of C, rows fastest (coalesced reads of W); elements of
// unsplit row blocks were written by the kernel itself and are skipped.
template <typename T>
__global__ void tsm2r_streamk_reduce(const T* __restrict__ W, T* __restrict__ C, i64 sc0, i64 sc1,
                                     int m, int n, int rows_per_block, i64 nu, i64 G, T alpha, T beta) {
    const i64 total = (i64)m * n;
    const i64 units = (((i64)m + rows_per_block - 1) / rows_per_block) * nu;
    for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (i64)gridDim.x * blockDim.x) {
        const i64 r = idx % m, j = idx / m;
        const i64 rb = r / rows_per_block;
        const i64 g0 = sk_block_of(rb * nu, units, G), g1 = sk_block_of(rb * nu + nu - 1, units, G);
        if (g0 == g1) continue;
        T s = T(0);
        for (i64 y = 0; y <= g1 - g0; ++y) s += W[(y * n + j) * m + r];
        store_c(C, r * sc0 + j * sc1, s, alpha, beta);
    }
}

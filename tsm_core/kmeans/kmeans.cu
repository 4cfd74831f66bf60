// k-means (Lloyd) kernels: assignment of rows to their nearest centre and the
// deterministic centroid update.
//
//   kmeans_assign_fused   X (n, d) row-major, C (k, d): labels, min distance and
//                         the "labels changed" flag in ONE read of X. The distance
//                         GEMM X @ C^T is the TSM2R case (d large, k small); the
//                         mapping follows tsm2r_v3r: a warp owns R rows, its lanes
//                         split d (each load reads 32*VEC contiguous elements of a
//                         row), a d-tile of C sits in shared memory (cp.async,
//                         double buffered) and is reused for the block's W*R rows.
//                         The n x k distances never leave registers.
//   kmeans_assign_tile    the same outputs for k > 32 or short rows: a register-
//                         blocked SIMT GEMM with the argmin in its epilogue (v1,
//                         ||x||^2 from kmeans_row_sqnorm).
//   kmeans_assign_tile2   v2: gemm.cu's 2V x 2V blocking, 256 x 64 tiles (float),
//                         ||x||^2 summed from the shared X tile (one read of X).
//   kmeans_centres_t      C transposed and padded for kmeans_assign_tile2.
//   kmeans_argmin_rows    the same outputs from a block of dot products D = X C^T
//                         computed by cuBLAS (the route for larger k, where the
//                         distance GEMM is compute-bound).
//   kmeans_row_sqnorm     ||x_i||^2, a warp per row (for the cuBLAS route).
//   kmeans_sums_direct    centroid sums with per-warp accumulators in shared memory
//   kmeans_reduce_rb      (k small), rows in their own order; then row blocks in order.
//   kmeans_assign_sums_packed  short rows against few centres: the assignment and
//                         the direct route's sums in one pass over X.
//   kmeans_hist, _scatter stable counting sort of the rows by label (k large), then
//   kmeans_offsets        per-label offsets and pieces of <= P rows (for k above
//   kmeans_bounds, _pieces SORT_KMAX the same from cupy.argsort's stable order),
//   kmeans_partials       a float64 sum per piece and d-slice (a warp each), and
//   kmeans_reduce         the pieces of each label in order.
//   The update side also reads __half / __nv_bfloat16 X (float accumulators).
//   kmeans_finalize       new centre = sum / weight (old one kept where the weight
//                         is 0), its squared norm and its squared shift.
//   kmeans_status         total squared shift, number of empty clusters, changed flag.
//
// Determinism: no floating-point atomics anywhere. Every sum is taken in an order
// fixed by the data (label-sorted row order from a deterministic sort, fixed
// pieces, fixed warp order), so a given input gives bit-identical output.
#include "common.cuh"

// The smaller distance wins; on equal distances the smaller index (numpy argmin).
template <typename T>
__device__ __forceinline__ void argmin_merge(T& v, int& i, T v2, int i2) {
    if (v2 < v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// ------------------------------------------------------------------ fused assign

// Template parameters:
//   VEC  elements per vector load of X and C (d, ldx and X's address allow it)
//   W    warps per block; R rows per warp (block: W*R rows, sharing each C tile)
//   KP   centres held in registers (k <= KP; rows of the tile past k are zeros and
//        never win, the argmin loop stops at k)
//   KT   d-depth of the C tile in shared memory (a multiple of 32*VEC)
// Registers per lane: R*KP partial dot products, R partial squared norms and one
// step's R*VEC elements of X for each of the KT/(32*VEC) steps of a tile (loaded
// together before use: that is what keeps enough bytes in flight per SM).
template <typename T, int VEC, int W, int R, int KP, int KT>
__global__ void __launch_bounds__(W * 32)
kmeans_assign_fused(const T* __restrict__ X, i64 ldx, const T* __restrict__ C,
                    const T* __restrict__ cn, int n, int d, int k,
                    int* labels, T* __restrict__ mind, const int* prev,
                    int* __restrict__ changed) {
    constexpr int STEP = 32 * VEC;
    constexpr int S = KT / STEP;
    static_assert(KT % STEP == 0, "a C tile holds whole warp steps");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* Cs0 = reinterpret_cast<T*>(smem_raw);  // [2][KP][KT]

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const i64 row0 = ((i64)blockIdx.x * W + warp) * R;
    const int ntiles = (d + KT - 1) / KT;

    // Rows past n re-read row n-1 (any valid row) and are never stored.
    const T* xr[R];
#pragma unroll
    for (int v = 0; v < R; ++v) xr[v] = X + min(row0 + v, (i64)n - 1) * ldx;

    auto issue = [&](int t, int buf) {
        T* Cs = Cs0 + buf * (KP * KT);
        const int d0 = t * KT;
        constexpr int CH = KP * KT / VEC;
#pragma unroll 1
        for (int c = threadIdx.x; c < CH; c += W * 32) {
            const int j = c / (KT / VEC), kk = (c % (KT / VEC)) * VEC;
            const int valid = (j < k) ? max(0, min(VEC, d - (d0 + kk))) : 0;
            const T* src = valid > 0 ? C + (i64)j * d + d0 + kk : C;
            cp_async<VEC * sizeof(T)>(Cs + j * KT + kk, src, valid * (int)sizeof(T));
        }
    };

    T acc[R][KP];
    T xx[R];
#pragma unroll
    for (int v = 0; v < R; ++v) {
        xx[v] = T(0);
#pragma unroll
        for (int j = 0; j < KP; ++j) acc[v][j] = T(0);
    }

    issue(0, 0);
    cp_async_commit();
    for (int t = 0; t < ntiles; ++t) {
        const int d0 = t * KT;
        // Load this tile's X first: the loads are in flight while we wait for C.
        T a[S][R][VEC];
        if (d0 + KT <= d) {
#pragma unroll
            for (int s = 0; s < S; ++s)
#pragma unroll
                for (int v = 0; v < R; ++v) load_vec_stream<T, VEC>(a[s][v], xr[v] + d0 + s * STEP + lane * VEC);
        } else {
#pragma unroll
            for (int s = 0; s < S; ++s) {
                const int kk = d0 + s * STEP + lane * VEC;
#pragma unroll
                for (int v = 0; v < R; ++v)
#pragma unroll
                    for (int q = 0; q < VEC; ++q) a[s][v][q] = (kk + q < d) ? xr[v][kk + q] : T(0);
            }
        }
        cp_async_wait<0>();
        __syncthreads();  // tile t has landed; buffer (t+1)&1 is no longer read
        if (t + 1 < ntiles) issue(t + 1, (t + 1) & 1);
        cp_async_commit();
        const T* Cs = Cs0 + (t & 1) * (KP * KT);
#pragma unroll
        for (int s = 0; s < S; ++s) {
#pragma unroll
            for (int v = 0; v < R; ++v)
#pragma unroll
                for (int q = 0; q < VEC; ++q) xx[v] = fma(a[s][v][q], a[s][v][q], xx[v]);
#pragma unroll
            for (int j = 0; j < KP; ++j) {
                // Lanes read consecutive 16-byte vectors: no bank conflicts.
                T c[VEC];
                load_vec<T, VEC>(c, Cs + j * KT + s * STEP + lane * VEC);
#pragma unroll
                for (int v = 0; v < R; ++v)
#pragma unroll
                    for (int q = 0; q < VEC; ++q) acc[v][j] = fma(a[s][v][q], c[q], acc[v][j]);
            }
        }
    }
    cp_async_wait<0>();

    // Butterfly: every lane ends with the full sums (fixed order: deterministic).
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int v = 0; v < R; ++v) {
            xx[v] += __shfl_xor_sync(0xffffffffu, xx[v], o);
#pragma unroll
            for (int j = 0; j < KP; ++j) acc[v][j] += __shfl_xor_sync(0xffffffffu, acc[v][j], o);
        }
    }
    int ch = 0;
#pragma unroll
    for (int v = 0; v < R; ++v) {
        const i64 r = row0 + v;
        if (r >= n || lane != v % 32) continue;
        // ||x||^2 - 2 x.c + ||c||^2, the argmin on ||c||^2 - 2 x.c (||x||^2 is common).
        T best = cn[0] - T(2) * acc[v][0];
        int bi = 0;
#pragma unroll
        for (int j = 1; j < KP; ++j)
            if (j < k) argmin_merge(best, bi, cn[j] - T(2) * acc[v][j], j);
        // prev may be labels itself (updated in place): read before writing.
        const int old = prev != nullptr ? prev[r] : bi;
        labels[r] = bi;
        mind[r] = max(xx[v] + best, T(0));  // rounding can make it slightly negative
        ch |= (old != bi);
    }
    // One store of the flag per block: stores from every SM to one address queue up
    // at its L2 slice (most labels change in the first iterations).
    if (__syncthreads_or(ch) && threadIdx.x == 0) *changed = 1;
}

// ------------------------------------------------------------------ tiled assign

// merge with "no candidate yet" (index < 0) allowed on either side
template <typename T>
__device__ __forceinline__ void argmin_merge_opt(T& v, int& i, T v2, int i2) {
    if (i2 >= 0 && (i < 0 || v2 < v || (v2 == v && i2 < i))) {
        v = v2;
        i = i2;
    }
}

// A register-blocked SIMT GEMM of X's rows against the centres with the argmin in
// its epilogue: the route for k > 32 or short rows, where the distances are
// compute-bound and cuBLAS would write (and the argmin re-read) an n x k block.
// Block: BM rows x BN centres per pass, (BM/TM) x (BN/TN) threads; thread (ty, tx)
// owns rows ty*TM.. and centres tx*TN.. of the tile (TM x TN accumulators, one
// 16-byte shared load of a and of b per TM*TN/4 FMAs). tx = tid % (BN/TN), so the
// threads sharing rows are neighbouring lanes and the final argmin is a shuffle.
// Centre tiles are visited in turn (any k); each row's running minimum stays in
// registers. X's tile is read again per centre tile (from L2 when rows are short;
// the launcher sends long rows with many centres to cuBLAS instead).
// Tiles: X (BM x BK) and C (BN x BK) are loaded to registers (VEC-wide, coalesced
// along d) while the previous tile is computed, then stored transposed to shared
// memory (As[kk][row]) so that the inner loop reads contiguous rows/centres.
template <typename T, int VEC, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
kmeans_assign_tile(const T* __restrict__ X, i64 ldx, const T* __restrict__ C, const T* __restrict__ cn,
                   const T* __restrict__ xx, int n, int d, int k,
                   int* labels, T* __restrict__ mind, const int* prev, int* __restrict__ changed) {
    constexpr int NX = BN / TN;         // threads along the centres
    constexpr int NT = (BM / TM) * NX;  // threads per block
    constexpr int VS = 16 / (int)sizeof(T);  // shared-memory vector width
    constexpr int PAD = VS;              // keeps rows 16-byte aligned
    constexpr int XL = BM * BK / VEC / NT;  // X vectors per thread per tile
    constexpr int CL = BN * BK / VEC / NT;
    static_assert(NX <= 32 && 32 % NX == 0, "threads sharing rows lie in one warp");
    static_assert(TM % VS == 0 && TN % VS == 0, "whole shared vectors per thread");
    static_assert(XL * VEC * NT == BM * BK && CL * VEC * NT == BN * BK && BK % VEC == 0, "even tile loads");
    __shared__ __align__(16) T As[BK][BM + PAD];
    __shared__ __align__(16) T Bs[BK][BN + PAD];
    const int tid = threadIdx.x;
    const int tx = tid % NX, ty = tid / NX;
    const i64 row0 = (i64)blockIdx.x * BM;

    T xr[XL][VEC], cr[CL][VEC];
    auto load_tiles = [&](int p, int d0) {
#pragma unroll
        for (int i = 0; i < XL; ++i) {
            const int e = (tid + i * NT) * VEC;
            const int r = e / BK, c = d0 + e % BK;
            const i64 row = row0 + r;
            if (row < n && c + VEC <= d) {
                load_vec<T, VEC>(xr[i], X + row * ldx + c);
            } else {
#pragma unroll
                for (int q = 0; q < VEC; ++q) xr[i][q] = (row < n && c + q < d) ? X[row * ldx + c + q] : T(0);
            }
        }
#pragma unroll
        for (int i = 0; i < CL; ++i) {
            const int e = (tid + i * NT) * VEC;
            const int j = p * BN + e / BK, c = d0 + e % BK;
            if (j < k && c + VEC <= d) {
                load_vec<T, VEC>(cr[i], C + (i64)j * d + c);
            } else {
#pragma unroll
                for (int q = 0; q < VEC; ++q) cr[i][q] = (j < k && c + q < d) ? C[(i64)j * d + c + q] : T(0);
            }
        }
    };
    auto store_tiles = [&]() {
#pragma unroll
        for (int i = 0; i < XL; ++i) {
            const int e = (tid + i * NT) * VEC;
#pragma unroll
            for (int q = 0; q < VEC; ++q) As[e % BK + q][e / BK] = xr[i][q];
        }
#pragma unroll
        for (int i = 0; i < CL; ++i) {
            const int e = (tid + i * NT) * VEC;
#pragma unroll
            for (int q = 0; q < VEC; ++q) Bs[e % BK + q][e / BK] = cr[i][q];
        }
    };

    T best[TM];
    int bi[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        best[i] = T(0);
        bi[i] = -1;
    }
    const int ntd = (d + BK - 1) / BK;
    const int np = (k + BN - 1) / BN;
    for (int p = 0; p < np; ++p) {
        T acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
        load_tiles(p, 0);
        for (int t = 0; t < ntd; ++t) {
            __syncthreads();  // the previous tile has been read by every thread
            store_tiles();
            __syncthreads();
            if (t + 1 < ntd) load_tiles(p, (t + 1) * BK);  // in flight during the FMAs
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                T a[TM], b[TN];
#pragma unroll
                for (int v = 0; v < TM; v += VS) {
                    T tmp[VS];
                    load_vec<T, VS>(tmp, &As[kk][ty * TM + v]);
#pragma unroll
                    for (int q = 0; q < VS; ++q) a[v + q] = tmp[q];
                }
#pragma unroll
                for (int v = 0; v < TN; v += VS) {
                    T tmp[VS];
                    load_vec<T, VS>(tmp, &Bs[kk][tx * TN + v]);
#pragma unroll
                    for (int q = 0; q < VS; ++q) b[v + q] = tmp[q];
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
            }
        }
        // Centres in increasing order per thread: ties keep the smaller index.
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int col = p * BN + tx * TN + j;
            if (col < k) {
                const T cj = cn[col];
#pragma unroll
                for (int i = 0; i < TM; ++i) argmin_merge_opt(best[i], bi[i], cj - T(2) * acc[i][j], col);
            }
        }
    }
#pragma unroll
    for (int o = NX / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const T v2 = __shfl_xor_sync(0xffffffffu, best[i], o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi[i], o);
            argmin_merge_opt(best[i], bi[i], v2, i2);
        }
    }
    if (tx == 0) {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const i64 r = row0 + ty * TM + i;
            if (r < n) {
                const int old = prev != nullptr ? prev[r] : bi[i];
                labels[r] = bi[i];
                mind[r] = max(xx[r] + best[i], T(0));
                if (old != bi[i]) *changed = 1;
            }
        }
    }
}

// ------------------------------------------------------------------ tiled assign, v2

// v2 of the tile kernel: gemm.cu's register blocking (gemm_tiled: 256 threads, a
// 2V x 2V block per thread, k-major shared tiles, two buffers, one barrier per
// k-step) with the argmin and ||x||^2 folded in, so one read of X gives labels and
// distances. float: 256 rows x 64 centres per block tile (k = 64 in one pass, each
// centre tile read once per 256 rows: a quarter of v1's traffic of C from L2),
// 8 x 8 accumulators per thread, 16 FFMAs per shared load; double: 64 x 64, 4 x 4.
//   Thread (ty, tx), tx = lane % TX: rows {h * BM/2 + ty*V + i}, centres
//   {h * BN/2 + tx*V + j} of the tile (the split halves keep a warp's fragment
//   reads on consecutive vectors: no bank conflicts). The TX threads that share
//   rows are neighbouring lanes of one warp, so the row argmin is a shuffle.
//   Centre tiles (k > BN) are visited in turn inside the block: the k-steps of all
//   passes form one pipeline (the loads of pass p+1's first tile are in flight
//   during pass p's last), X's rows come back from L2, and each row keeps its
//   running (min, argmin) in one lane (lane tx holds rows tx, tx + TX, ..).
//   ||x||^2 is summed during pass 0 from the shared X tile, a thread per row, in
//   the order of d (deterministic), after the step's FFMAs (placed there, ptxas
//   fits the kernel in 128 registers without spilling; in the staging path it did not).
//   The changed flag is OR-ed over the block first: one store per block, not one
//   per changed row to a single address.
// The centres come transposed and padded, CT (d, ldc) with ldc = BN * ceil(k / BN)
// and zeros past k (kmeans_centres_t): a k-major tile of them is then a plain copy,
// done with cp.async (no staging registers, which the 8 x 8 block cannot spare).
// VEC: global vector width of X (d, ldx and X's address allow it).
template <typename T, int VEC, int TX, int BK>
__global__ void __launch_bounds__(256, 2)
kmeans_assign_tile2(const T* __restrict__ X, i64 ldx, const T* __restrict__ CT, int ldc,
                    const T* __restrict__ cn, int n, int d, int k, int* labels, T* __restrict__ mind,
                    const int* prev, int* __restrict__ changed) {
    constexpr int NT = 256;
    constexpr int V = 16 / (int)sizeof(T);   // shared-memory vector width
    constexpr int TY = NT / TX;
    constexpr int BM = 2 * V * TY, BN = 2 * V * TX;
    constexpr int M2 = 2 * V;                 // rows (and centres) per thread
    constexpr int RPL = (M2 + TX - 1) / TX;   // running minima per lane
    constexpr int PAD = V;                    // 16-byte rows; transposed stores spread over banks
    constexpr int KV = BK / VEC;              // vectors per row of a tile (lanes sharing a row)
    constexpr int LA = BM * BK / VEC / NT;
    constexpr int CB = BK * BN / V;           // 16-byte chunks of a centre tile
    constexpr int LB = (CB + NT - 1) / NT;
    static_assert(32 % TX == 0 && TX <= 32, "threads sharing rows lie in one warp");
    static_assert(LA * VEC * NT == BM * BK && (CB % NT == 0 || CB < NT), "even tile loads");
    static_assert(KV <= 32 && 32 % KV == 0 && VEC <= V, "staging layout");
    __shared__ __align__(16) T As[2][BK][BM + PAD];
    __shared__ __align__(16) T Bs[2][BK][BN + PAD];
    // Each lane's running (min, argmin) over the centre tiles lives in shared memory
    // (each element has one owner thread, so no barrier guards it): registers are the
    // limit here, the 8 x 8 block, its fragments and the staging registers leave
    // nothing of the 128 that two blocks per SM allow.
    __shared__ T xs[BM];  // ||x||^2 of the block's rows
    __shared__ T bst[RPL][NT];
    __shared__ int bix[RPL][NT];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tx = lane % TX, ty = warp * (32 / TX) + lane / TX;
    const i64 row0 = (i64)blockIdx.x * BM;
    const int ntd = (d + BK - 1) / BK;
    const int np = (k + BN - 1) / BN;
    const int nsteps = ntd * np;
    // Staging position of this thread's vectors: row v / KV, column (v % KV) * VEC
    // of the tile, with v = tid + l * NT; the column is the same for all l.
    const int sc = (tid % KV) * VEC;

    // Rows past n re-read row n - 1 (any valid row; never stored): only the d edge
    // is guarded, which keeps the address arithmetic (registers) small.
    const T* xrow[LA];
#pragma unroll
    for (int l = 0; l < LA; ++l) xrow[l] = X + min(row0 + (tid + l * NT) / KV, (i64)n - 1) * ldx + sc;

    T xr[LA][VEC];
    static_assert(BM <= NT, "a thread per row sums ||x||^2");
    T xsq = T(0);  // ||x||^2 of row tid of the block (tid < BM), summed in pass 0
    auto load = [&](int p, int d0, int buf) {
        const int c = d0 + sc;
#pragma unroll
        for (int l = 0; l < LA; ++l) {
            if (c + VEC <= d) {
                load_vec<T, VEC>(xr[l], xrow[l] + d0);
            } else {
#pragma unroll
                for (int q = 0; q < VEC; ++q) xr[l][q] = (c + q < d) ? xrow[l][d0 + q] : T(0);
            }
        }
#pragma unroll
        for (int l = 0; l < LB; ++l) {
            const int e = tid + l * NT;
            if (CB < NT && e >= CB) break;  // warp-uniform
            const int kk = e / (BN / V), j = (e % (BN / V)) * V;
            const bool ok = d0 + kk < d;  // rows past d are zeros
            cp_async<16>(&Bs[buf][kk][j], ok ? CT + (i64)(d0 + kk) * ldc + p * BN + j : CT, ok ? 16 : 0);
        }
        cp_async_commit();
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int l = 0; l < LA; ++l) {
            const int r = (tid + l * NT) / KV;
#pragma unroll
            for (int q = 0; q < VEC; ++q) As[buf][sc + q][r] = xr[l][q];
        }
    };

    T acc[M2][M2];
#pragma unroll
    for (int i = 0; i < M2; ++i)
#pragma unroll
        for (int j = 0; j < M2; ++j) acc[i][j] = T(0);
#pragma unroll
    for (int u = 0; u < RPL; ++u) {
        bst[u][tid] = T(0);
        bix[u][tid] = -1;
    }

    load(0, 0, 0);
    store(0);
    cp_async_wait<0>();
    __syncthreads();
    int p = 0, t = 0;  // pass and k-step of step s
    for (int s = 0; s < nsteps; ++s) {
        const int buf = s & 1;
        const int t1 = (t + 1 == ntd) ? 0 : t + 1, p1 = (t + 1 == ntd) ? p + 1 : p;
        const bool more = s + 1 < nsteps;
        if (more) load(p1, t1 * BK, buf ^ 1);  // in flight during the FFMAs (Bs[buf ^ 1]
                                                // was last read in step s - 1)
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            T a[M2], b[M2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                T ta[V], tb[V];
                load_vec<T, V>(ta, &As[buf][kk][h * (BM / 2) + ty * V]);
                load_vec<T, V>(tb, &Bs[buf][kk][h * (BN / 2) + tx * V]);
#pragma unroll
                for (int q = 0; q < V; ++q) {
                    a[h * V + q] = ta[q];
                    b[h * V + q] = tb[q];
                }
            }
#pragma unroll
            for (int i = 0; i < M2; ++i)
#pragma unroll
                for (int j = 0; j < M2; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        // ||x||^2 from the shared tile (pass 0), a thread per row: consecutive rows,
        // no bank conflicts; BK FMAs next to the thread's 4 * V * V * BK.
        if (p == 0 && tid < BM) {
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) xsq = fma(As[buf][kk][tid], As[buf][kk][tid], xsq);
        }
        // The other buffer was last read in step s - 1, before that step's barrier.
        // Stored before the pass epilogue: the staging registers are free during it.
        if (more) store(buf ^ 1);
        cp_async_wait<0>();
        if (t + 1 == ntd) {
            // End of pass p: argmin over its centres, ||c||^2 - 2 x.c (||x||^2 is
            // common to a row). Ties go to the smaller index in every merge.
            // One row at a time (few live registers): its minimum over this thread's
            // centres, then over the TX lanes; lane i % TX keeps row i's running minimum.
#pragma unroll
            for (int i = 0; i < M2; ++i) {
                T v = T(0);
                int ii = -1;
#pragma unroll
                for (int j = 0; j < M2; ++j) {
                    const int col = p * BN + (j / V) * (BN / 2) + tx * V + j % V;
                    if (col < k) argmin_merge_opt(v, ii, cn[col] - T(2) * acc[i][j], col);
                }
#pragma unroll
                for (int o = TX / 2; o > 0; o >>= 1) {
                    const T v2 = __shfl_xor_sync(0xffffffffu, v, o);
                    const int i2 = __shfl_xor_sync(0xffffffffu, ii, o);
                    argmin_merge_opt(v, ii, v2, i2);
                }
                if (tx == i % TX) {
                    T bv = bst[i / TX][tid];
                    int bj = bix[i / TX][tid];
                    argmin_merge_opt(bv, bj, v, ii);
                    bst[i / TX][tid] = bv;
                    bix[i / TX][tid] = bj;
                }
            }
#pragma unroll
            for (int i = 0; i < M2; ++i)
#pragma unroll
                for (int j = 0; j < M2; ++j) acc[i][j] = T(0);
        }
        __syncthreads();
        t = t1;
        p = p1;
    }

    if (tid < BM) xs[tid] = xsq;
    __syncthreads();
    int ch = 0;
#pragma unroll
    for (int u = 0; u < RPL; ++u) {
        const int m = tx + u * TX;
        const int lr = (m / V) * (BM / 2) + ty * V + m % V;  // row within the block
        const i64 r = row0 + lr;
        if (m < M2 && r < n) {
            const T xx = xs[lr];
            const int b = bix[u][tid];
            // prev may be labels itself (updated in place): read before writing.
            const int old = prev != nullptr ? prev[r] : b;
            labels[r] = b;
            mind[r] = max(xx + bst[u][tid], T(0));  // rounding can make it slightly negative
            ch |= (old != b);
        }
    }
    if (__syncthreads_or(ch) && tid == 0) *changed = 1;
}

// CT[c * ldc + j] = C[j * d + c] for j < k, 0 for k <= j < ldc (kmeans_assign_tile2's
// centre operand). Grid-stride over CT; C is tiny (k x d), read through L2.
template <typename T>
__global__ void kmeans_centres_t(const T* __restrict__ C, int k, int d, int ldc, T* __restrict__ CT) {
    const i64 total = (i64)d * ldc;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const int c = (int)(i / ldc), j = (int)(i % ldc);
        CT[i] = j < k ? C[(i64)j * d + c] : T(0);
    }
}

// ------------------------------------------------------------------ cuBLAS route

// D (rows, k) row-major holds x.c; a warp per row, lanes over the centres.
template <typename T>
__global__ void kmeans_argmin_rows(const T* __restrict__ D, int rows, int k,
                                   const T* __restrict__ cn, const T* __restrict__ xx,
                                   int* labels, T* __restrict__ mind, const int* prev,
                                   int* __restrict__ changed) {
    const int lane = threadIdx.x & 31;
    const i64 r0 = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const i64 r = r0 < rows ? r0 : rows - 1;  // no early exit: the block barrier below
    const T* dr = D + r * k;
    T best = T(0);
    int bi = -1;
    for (int j = lane; j < k; j += 32) {
        const T v = cn[j] - T(2) * dr[j];
        if (bi < 0) {
            best = v;
            bi = j;
        } else {
            argmin_merge(best, bi, v, j);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T v2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        if (i2 >= 0 && (bi < 0 || v2 < best || (v2 == best && i2 < bi))) {
            best = v2;
            bi = i2;
        }
    }
    int ch = 0;
    if (lane == 0 && r0 < rows) {
        const int old = prev != nullptr ? prev[r] : bi;
        labels[r] = bi;
        mind[r] = max(xx[r] + best, T(0));
        ch = old != bi;
    }
    if (__syncthreads_or(ch) && threadIdx.x == 0) *changed = 1;  // one store per block
}

// ---- X in half precision (update side): __half and __nv_bfloat16 rows are read
// as raw 16-bit words and widened to float (exactly); sums are float in shared
// memory and registers, float64 in the partials (as for float X). Only the type
// names are needed: CUDA's headers where the compiler finds them, else two
// stand-ins of the same size (nothing here uses their members or operators).
#if defined(__has_include)
#if __has_include(<cuda_fp16.h>) && __has_include(<cuda_bf16.h>)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define TSM_KMEANS_CUDA_HALF 1
#endif
#endif
#ifndef TSM_KMEANS_CUDA_HALF
struct __align__(2) __half { unsigned short bits_; };
struct __align__(2) __nv_bfloat16 { unsigned short bits_; };
#endif

// The accumulator type of X's type: float for the half types, T otherwise.
template <typename T> struct AccT { typedef T type; };
template <> struct AccT<__half> { typedef float type; };
template <> struct AccT<__nv_bfloat16> { typedef float type; };

template <typename T> __device__ __forceinline__ float half_bits(unsigned short b);
template <> __device__ __forceinline__ float half_bits<__half>(unsigned short b) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));  // exact
    return f;
}
template <> __device__ __forceinline__ float half_bits<__nv_bfloat16>(unsigned short b) {
    return __uint_as_float((unsigned)b << 16);  // bfloat16: the high half of a float
}

// The element at p, widened to the accumulator type.
__device__ __forceinline__ float widen_at(const float* p) { return *p; }
__device__ __forceinline__ double widen_at(const double* p) { return *p; }
__device__ __forceinline__ float widen_at(const __half* p) {
    return half_bits<__half>(*reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ float widen_at(const __nv_bfloat16* p) {
    return half_bits<__nv_bfloat16>(*reinterpret_cast<const unsigned short*>(p));
}

// The raw 32-bit words of V elements of X at p (float, __half or __nv_bfloat16; at
// most 16 bytes), of which the first `valid` exist: one streamed vector load where
// all V do, else the valid ones one at a time (zero bits after them: +0 in every
// type). widen_raw gives the elements as float, the same values load_x gives.
template <typename T, int V>
struct Raw {
    static constexpr int NW = (V * (int)sizeof(T) + 3) / 4;
};

template <typename T, int V>
__device__ __forceinline__ void load_raw(unsigned (&u)[Raw<T, V>::NW], const T* p, int valid) {
    constexpr int NW = Raw<T, V>::NW;
    static_assert(sizeof(T) <= 4 && V * sizeof(T) <= 16, "float or 16-bit elements, 16 bytes at most");
    if (valid >= V) {
        if constexpr (NW == 4) {
            const uint4 x = __ldcs(reinterpret_cast<const uint4*>(p));
            u[0] = x.x; u[1] = x.y; u[2] = x.z; u[3] = x.w;
        } else if constexpr (NW == 2) {
            const uint2 x = __ldcs(reinterpret_cast<const uint2*>(p));
            u[0] = x.x; u[1] = x.y;
        } else if constexpr (V * sizeof(T) == 4) {
            u[0] = __ldcs(reinterpret_cast<const unsigned*>(p));
        } else {
            u[0] = __ldcs(reinterpret_cast<const unsigned short*>(p));
        }
        return;
    }
#pragma unroll
    for (int w = 0; w < NW; ++w) u[w] = 0u;
#pragma unroll
    for (int q = 0; q < V; ++q) {
        if (q < valid) {
            if constexpr (sizeof(T) == 4) {
                u[q] = *reinterpret_cast<const unsigned*>(p + q);
            } else {
                u[q / 2] |= (unsigned)*reinterpret_cast<const unsigned short*>(p + q) << (16 * (q % 2));
            }
        }
    }
}

template <typename T, int V>
__device__ __forceinline__ void widen_raw(float (&a)[V], const unsigned (&u)[Raw<T, V>::NW]) {
#pragma unroll
    for (int q = 0; q < V; ++q) {
        if constexpr (sizeof(T) == 4) {
            a[q] = __uint_as_float(u[q]);
        } else {
            a[q] = half_bits<T>((unsigned short)(u[q / 2] >> (16 * (q % 2))));
        }
    }
}

// V elements of X at p (aligned to V*sizeof(T), at most 16 bytes), widened to A,
// streamed (evict-first: X is read once per update).
template <typename T, int V>
__device__ __forceinline__ void load_x(typename AccT<T>::type (&a)[V], const T* p) {
    if constexpr (sizeof(T) >= 4) {
        load_vec_stream<T, V>(a, p);
    } else {
        unsigned u[Raw<T, V>::NW];
        load_raw<T, V>(u, p, V);
        widen_raw<T, V>(a, u);
    }
}

// ||x_i||^2, a warp per row (float for half X: out is AccT<T>).
template <typename T>
__global__ void kmeans_row_sqnorm(const T* __restrict__ X, i64 ldx, int n, int d,
                                  typename AccT<T>::type* __restrict__ out) {
    typedef typename AccT<T>::type A;
    const int lane = threadIdx.x & 31;
    const i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= n) return;
    const T* xr = X + r * ldx;
    A s = A(0);
    for (int j = lane; j < d; j += 32) {
        const A x = widen_at(xr + j);
        s = fma(x, x, s);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[r] = s;
}

// ------------------------------------------------------------------ centroid update

// Two routes to the per-cluster sums, both deterministic:
//  direct  (k * 32*VEC accumulators per warp fit in shared memory): rows in their
//          own order; a block owns RB consecutive rows and one d-slice of 32*VEC
//          columns, each warp a contiguous run of those rows and private
//          accumulators; warps are combined in warp order, row blocks in
//          block order (kmeans_reduce_rb).
//  sorted  (large k): rows sorted by label with a stable sort: a counting sort
//          (kmeans_hist, a prefix sum, kmeans_scatter, kmeans_offsets; k up to
//          SORT_KMAX) or a radix sort (cupy.argsort; then kmeans_bounds,
//          kmeans_pieces). A warp sums a piece of <= P rows of one label over
//          one d-slice (kmeans_partials), pieces are combined in order
//          (kmeans_reduce). Both sorts are stable, so they give the same order.
// Both launch the d-slices of one row range as consecutive blocks / warps: those
// that run together read whole rows, not the same columns of many rows (which
// would send every load to the same few DRAM channels).
// X may be float, double, __half or __nv_bfloat16; sums in registers and shared
// memory are in AccT<T> (float for the half types), partials in float64.

// A slice row of accumulators (32*V elements of A, one V-vector per lane) is
// stored in 16-byte chunks, chunk c of all lanes together (c*32*CH + lane*CH), so
// every shared access of a warp is contiguous: no bank conflicts. Where a lane's
// V elements fit 16 bytes (float, double) that is simply lane*V + q.
template <typename A, int V>
struct SliceRow {
    static constexpr int CH = (V * (int)sizeof(A) <= 16) ? V : 16 / (int)sizeof(A);
    // column offset (within the slice) of position p of the stored row
    __device__ static int col(int p) {
        const int c = p / (32 * CH), rem = p % (32 * CH);
        return (rem / CH) * V + c * CH + rem % CH;
    }
};

template <typename A, int V>
__device__ __forceinline__ void smem_axpy(A* row, int lane, const A (&x)[V], A a) {
    constexpr int CH = SliceRow<A, V>::CH;
#pragma unroll
    for (int c = 0; c < V / CH; ++c) {
        A* p = row + c * 32 * CH + lane * CH;
        A cur[CH];
        load_vec<A, CH>(cur, p);  // one access of <= 16 bytes per lane
#pragma unroll
        for (int q = 0; q < CH; ++q) cur[q] = fma(a, x[c * CH + q], cur[q]);
        store_vec<A, CH>(p, cur);
    }
}

// The raw words and weights of rows r + u G + grp (u < U) of [a, b) (kmeans_assign_sums_packed's
// prefetch); rows past b: zeros, weight 0.
template <typename T, int VEC, int U, int G>
__device__ __forceinline__ void fetch_rows(unsigned (&nx)[U][Raw<T, VEC>::NW], float (&nwr)[U],
                                           const T* __restrict__ X, i64 ldx, const float* __restrict__ w,
                                           int r, int a, int b, int grp, int col, int valid) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int rr = r + u * G + grp;
        const bool ok = rr < b;
        nwr[u] = ok ? (w != nullptr ? w[rr] : 1.0f) : 0.0f;
        load_raw<T, VEC>(nx[u], X + (i64)(ok ? rr : a) * ldx + col, ok ? valid : 0);
    }
}

// Grid: nrb * nslices blocks (slice fastest). Shared memory: (W*k*32*VEC + W*G*k) A,
// G = 32 / LPR.
// part[(rb*k + l)*d + c], wpart[rb*k + l]: float64 sums of row block rb.
// w: weights in the accumulator type (float for half X), or null.
// LPR: lanes per row. 32: a warp takes one row at a time, a d-slice of 32*VEC columns.
// Below 32 (rows of d <= LPR*VEC, one slice): the warp's G groups of LPR lanes take G
// rows at a time (group g the rows a + g, a + g + G, ...), each lane adding into its
// own accumulator slots, so the groups never write the same place; the slots of the
// G groups are added in group order after the warps' (a fixed order).
// KP = 0: the labels are read (kmeans_sums_direct). KP > 0: each group decides its
// rows' labels first (kmeans_assign_sums_packed, below); then `part` may be null
// (labels only).
template <typename T, int VEC, int W, int LPR, int KP>
__device__ __forceinline__ void direct_body(const T* __restrict__ X, i64 ldx, int n, int d, int* labels,
                                            const typename AccT<T>::type* __restrict__ w, int k, int RB,
                                            int nslices, double* __restrict__ part, double* __restrict__ wpart,
                                            const float* __restrict__ C, float* __restrict__ mind,
                                            const int* prev, int* __restrict__ changed, int exact) {
    typedef typename AccT<T>::type A;
    static_assert(LPR == 4 || LPR == 8 || LPR == 16 || LPR == 32, "LPR divides the warp");
    constexpr int SW = 32 * VEC;            // accumulators of a label, a warp
    constexpr int G = 32 / LPR;             // rows a warp step takes
    constexpr int CW = LPR * VEC;           // columns a step covers (the slice width)
    constexpr int U = VEC >= 4 ? 4 : 8;     // rows a group loads before it adds them
    extern __shared__ __align__(16) unsigned char smem_raw[];
    A* acc = reinterpret_cast<A*>(smem_raw);  // [W][k][SW]
    A* wacc = acc + (i64)W * k * SW;          // [W][G][k]
    const int rb = blockIdx.x / nslices, ds = blockIdx.x % nslices;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int grp = lane / LPR, sub = lane % LPR;
    const bool sums = KP == 0 || part != nullptr;
    A* my = acc + (i64)warp * k * SW;
    if (sums) {
        for (int i = lane; i < k * SW; i += 32) my[i] = A(0);
        for (int i = lane; i < G * k; i += 32) wacc[warp * G * k + i] = A(0);
    }
    static_assert(KP == 0 || sizeof(A) == 4, "the packed assignment reads float, __half or __nv_bfloat16 X");
    // The centres, zero past d (a row's columns past d are zeros too): [KP][CW] floats
    // after the accumulators (at a 16-byte boundary), or alone when nothing is summed.
    float* Cs = reinterpret_cast<float*>(
        smem_raw + (sums ? ((((i64)W * k * (SW + G)) * (i64)sizeof(A) + 15) & ~(i64)15) : 0));
    if constexpr (KP > 0) {
        for (int i = threadIdx.x; i < KP * CW; i += W * 32) {
            const int j = i / CW, c = i % CW;
            Cs[i] = (j < k && c < d) ? C[(i64)j * d + c] : 0.0f;
        }
        __syncthreads();
    } else {
        __syncwarp();
    }
    const int r0 = rb * RB, r1 = min(n, r0 + RB);
    const int per = (RB + W - 1) / W;
    const int a = min(r1, r0 + warp * per), b = min(r1, a + per);
    const int col = ds * CW + sub * VEC;
    const bool full = col + VEC <= d;
    bool ch = false;
    // PF: the next U rows of the group are loaded (raw words, and their weights)
    // before this step's are used, so a warp keeps its loads in flight while it
    // computes; the values, and so every result, are those of the loads in place.
    // (Not at KP = 32 in float, where the words would spill.)
    constexpr bool PF = KP > 0 && (sizeof(T) == 2 || KP <= 16);
    constexpr int NW = PF ? Raw<T, VEC>::NW : 1;
    unsigned nx[U][NW];
    A nwr[U];
    const int valid = max(0, min(VEC, d - col));
    if constexpr (PF) {
        if (a < b) fetch_rows<T, VEC, U, G>(nx, nwr, X, ldx, w, a, a, b, grp, col, valid);
    }
    for (int r = a; r < b; r += U * G) {
        int l[U];
        A x[U][VEC], wr[U];
        if constexpr (PF) {
            unsigned cx[U][NW];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                wr[u] = nwr[u];
#pragma unroll
                for (int q = 0; q < NW; ++q) cx[u][q] = nx[u][q];
            }
            if (r + U * G < b) fetch_rows<T, VEC, U, G>(nx, nwr, X, ldx, w, r + U * G, a, b, grp, col, valid);
#pragma unroll
            for (int u = 0; u < U; ++u) widen_raw<T, VEC>(x[u], cx[u]);
        } else {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int rr = r + u * G + grp;
                const bool ok = rr < b;
                if constexpr (KP == 0) l[u] = ok ? labels[rr] : -1;
                wr[u] = ok ? (w != nullptr ? w[rr] : A(1)) : A(0);
                const T* px = X + (i64)(ok ? rr : a) * ldx + col;
                if (ok && full) {
                    load_x<T, VEC>(x[u], px);
                } else {
#pragma unroll
                    for (int q = 0; q < VEC; ++q) x[u][q] = (ok && col + q < d) ? widen_at(px + q) : A(0);
                }
            }
        }
        if constexpr (KP > 0) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                // ||x - c_j||^2 from the differences, the group's lanes summed by a
                // butterfly (every lane of the group gets the same bits), four centres
                // at a time (their shuffles interleave); the smaller index on ties.
                constexpr int JC = 4;
                constexpr int CV = VEC < 4 ? VEC : 4;  // floats a 16-byte load takes
                float best = 0.0f, second = __int_as_float(0x7f800000);
                int bi = 0;
#pragma unroll
                for (int j0 = 0; j0 < KP; j0 += JC) {
                    if (j0 >= k) break;  // warp-uniform
                    float s[JC];
#pragma unroll
                    for (int jj = 0; jj < JC; ++jj) {
                        s[jj] = 0.0f;
#pragma unroll
                        for (int h = 0; h < VEC / CV; ++h) {
                            float c[CV];  // centres past k: zeros in Cs
                            load_vec<float, CV>(c, Cs + (j0 + jj) * CW + sub * VEC + h * CV);
#pragma unroll
                            for (int q = 0; q < CV; ++q) {
                                const float t = (float)x[u][h * CV + q] - c[q];
                                s[jj] = fmaf(t, t, s[jj]);
                            }
                        }
                    }
#pragma unroll
                    for (int o = LPR / 2; o > 0; o >>= 1)
#pragma unroll
                        for (int jj = 0; jj < JC; ++jj) s[jj] += __shfl_xor_sync(0xffffffffu, s[jj], o);
#pragma unroll
                    for (int jj = 0; jj < JC; ++jj) {
                        if (j0 + jj == 0 || j0 + jj < k && s[jj] < best) {
                            second = j0 + jj == 0 ? second : best;
                            best = s[jj];
                            bi = j0 + jj;
                        } else if (j0 + jj < k && s[jj] < second) {
                            second = s[jj];
                        }
                    }
                }
                // exact: where the two best lie within the sums' rounding bound
                // (nonnegative terms: relative (VEC + log2 LPR + 2) u, here 2 (d + 8) u,
                // u = 2^-24), decide again in double (the smaller index on ties), so
                // the label is float64's.
                const bool unsure = exact && second - best <= (float)(d + 8) * 0x1p-23f * (best + second);
                if (__any_sync(0xffffffffu, unsure)) {
                    double bd = 0.0;
                    int bj = 0;
                    for (int j = 0; j < k; ++j) {
                        double t2 = 0.0;
#pragma unroll
                        for (int q = 0; q < VEC; ++q) {
                            const double t = (double)x[u][q] - (double)Cs[j * CW + sub * VEC + q];
                            t2 = fma(t, t, t2);
                        }
#pragma unroll
                        for (int o = LPR / 2; o > 0; o >>= 1) t2 += __shfl_xor_sync(0xffffffffu, t2, o);
                        if (j == 0 || t2 < bd) {
                            bd = t2;
                            bj = j;
                        }
                    }
                    if (unsure) {
                        best = (float)bd;
                        bi = bj;
                    }
                }
                const int rr = r + u * G + grp;
                const bool ok = rr < b;
                if (ok && sub == 0) {
                    if (prev != nullptr && prev[rr] != bi) ch = true;
                    labels[rr] = bi;
                    mind[rr] = best;
                }
                l[u] = ok ? bi : -1;
            }
        }
        if (sums) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (l[u] < 0) continue;  // warp-uniform where LPR == 32
                smem_axpy<A, VEC>(my + l[u] * SW, lane, x[u], wr[u]);
                if (sub == 0) wacc[(warp * G + grp) * k + l[u]] += wr[u];
            }
        }
    }
    if constexpr (KP > 0) {
        if (__syncthreads_or(ch) && threadIdx.x == 0) *changed = 1;  // one store per block
        if (!sums) return;  // block-uniform
    } else {
        __syncthreads();
    }
    if constexpr (LPR == 32) {
        for (int i = threadIdx.x; i < k * SW; i += W * 32) {
            const int l = i / SW, c = ds * SW + SliceRow<A, VEC>::col(i % SW);
            double s = 0.0;
            for (int u = 0; u < W; ++u) s += (double)acc[(i64)u * k * SW + i];
            if (c < d) part[((i64)rb * k + l) * d + c] = s;
        }
    } else {
        // Column c = sub * VEC + q of group g sits where lane g * LPR + sub stores its
        // element q (smem_axpy's layout: chunk q / CH of every lane together).
        constexpr int CH = SliceRow<A, VEC>::CH;
        for (int i = threadIdx.x; i < k * CW; i += W * 32) {
            const int l = i / CW, c = i % CW;
            const int sb = c / VEC, q = c % VEC;
            const int pos = (q / CH) * 32 * CH + sb * CH + q % CH;  // lane sb's slot; + g LPR CH per group
            double s = 0.0;
            for (int u = 0; u < W; ++u)
#pragma unroll
                for (int g = 0; g < G; ++g) s += (double)acc[(i64)u * k * SW + l * SW + pos + g * LPR * CH];
            if (c < d) part[((i64)rb * k + l) * d + c] = s;
        }
    }
    if (ds == 0) {
        for (int l = threadIdx.x; l < k; l += W * 32) {
            double s = 0.0;
            for (int u = 0; u < W; ++u)
                for (int g = 0; g < G; ++g) s += (double)wacc[(u * G + g) * k + l];
            wpart[(i64)rb * k + l] = s;
        }
    }
}

template <typename T, int VEC, int W, int LPR>
__global__ void __launch_bounds__(W * 32)
kmeans_sums_direct(const T* __restrict__ X, i64 ldx, int n, int d, const int* __restrict__ labels,
                   const typename AccT<T>::type* __restrict__ w, int k, int RB, int nslices,
                   double* __restrict__ part, double* __restrict__ wpart) {
    direct_body<T, VEC, W, LPR, 0>(X, ldx, n, d, const_cast<int*>(labels), w, k, RB, nslices, part, wpart,
                                   nullptr, nullptr, nullptr, nullptr, 0);
}

// Assignment and centroid sums in one pass over X, for short rows (d <= LPR*VEC:
// one slice, nslices = 1) and few centres (k <= KP): the blocks, warps, row order
// and accumulators of kmeans_sums_direct<T, VEC, W, LPR>, so the sums equal its sums
// of the same labels bit for bit. Each group of LPR lanes decides its row's label
// from the centres C (k x d float32) in shared memory, ||x - c||^2 from the
// differences in float (X widened exactly): labels[r], mind[r] and the changed
// flag against prev (may be labels, or null), the smaller index on ties; with
// `exact`, rows whose two best distances lie within their rounding bound are
// decided again in double (labels equal to float64's). part = null: labels only
// (nothing summed). Shared memory: kmeans_sums_direct's (when
// summing), rounded up to 16 bytes, then KP * LPR * VEC floats.
template <typename T, int VEC, int W, int LPR, int KP>
__global__ void __launch_bounds__(W * 32, (sizeof(T) == 4 ? 24 : 16) / W)  // warps an SM: 24 (float), 16
kmeans_assign_sums_packed(const T* __restrict__ X, i64 ldx, int n, int d, const float* __restrict__ C, int k,
                          int* labels, float* __restrict__ mind, const int* prev, int* __restrict__ changed,
                          const typename AccT<T>::type* __restrict__ w, int RB, double* __restrict__ part,
                          double* __restrict__ wpart, int exact) {
    direct_body<T, VEC, W, LPR, KP>(X, ldx, n, d, labels, w, k, RB, 1, part, wpart, C, mind, prev, changed,
                                    exact);
}

// A warp per output (l, c), c = 0..d, blocks of any number of warps: sums[l, c] (+)=
// part[rb, l, c] for rb = 0.. in order; c = d is the weight, wsum[l] (+)= wpart[rb, l].
// With acc = 1 the sums continue from their current value, so a streamed fit adds its
// chunks in exactly the order an in-memory fit adds its row blocks. The lanes load
// 32 * U consecutive partials at once and every lane adds them in row-block order
// from the shuffles (one chain, the bits of one add a load, but many loads in
// flight: there are few outputs, k * (d + 1), and many row blocks).
template <typename T>
__global__ void kmeans_reduce_rb(const T* __restrict__ part, const T* __restrict__ wpart, int nrb, int k,
                                 int d, int acc, T* __restrict__ sums, T* __restrict__ wsum) {
    constexpr int U = 4;
    const int lane = threadIdx.x & 31;
    const i64 o = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= (i64)k * (d + 1)) return;  // warp-uniform
    const int l = (int)(o / (d + 1)), c = (int)(o % (d + 1));
    const T* src = c < d ? part + (i64)l * d + c : wpart + l;
    const i64 step = c < d ? (i64)k * d : (i64)k;
    T* dst = c < d ? sums + (i64)l * d + c : wsum + l;
    T s = acc ? *dst : T(0);
    int rb = 0;
    for (; rb + 32 * U <= nrb; rb += 32 * U) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = src[(i64)(rb + u * 32 + lane) * step];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int q = 0; q < 32; ++q) s += __shfl_sync(0xffffffffu, v[u], q);
    }
    for (; rb < nrb; rb += 32) {
        const T v = rb + lane < nrb ? src[(i64)(rb + lane) * step] : T(0);
        const int m = min(32, nrb - rb);
        for (int q = 0; q < m; ++q) s += __shfl_sync(0xffffffffu, v, q);
    }
    if (lane == 0) *dst = s;
}

// ---- stable counting sort by label (for the sorted route)
constexpr int SORT_UL = 4;  // 32-row steps whose labels a warp loads at once
// Warp g (of nw) owns rows [g*RW, min(n, (g+1)*RW)); block b its WB warps g = b*WB ..
// The counts are per block: cnt[l*nb + b] its rows of label l (nb = ceil(nw / WB)),
// so that there are nb k of them to write, scan and read back, not nw k.

// The warp's histogram of its rows in h (k ints, zeroed here): each 32-row step adds
// one count per distinct label, through the lowest lane holding it (no atomics).
__device__ __forceinline__ void warp_hist(const int* __restrict__ labels, int a, int b, int k, int lane,
                                          int* h) {
    for (int i = lane; i < k; i += 32) h[i] = 0;
    __syncwarp();
    for (int r = a; r < b; r += 32 * SORT_UL) {
        int ls[SORT_UL];  // SORT_UL steps' labels loaded before they are counted
#pragma unroll
        for (int u = 0; u < SORT_UL; ++u) ls[u] = (r + u * 32 + lane < b) ? labels[r + u * 32 + lane] : -1;
#pragma unroll
        for (int u = 0; u < SORT_UL; ++u) {
            const int l = ls[u];
            const unsigned peers = __match_any_sync(0xffffffffu, l);
            if (l >= 0 && lane == __ffs(peers) - 1) h[l] += __popc(peers);
            __syncwarp();
        }
    }
}

// Shared memory: WB*k ints (a histogram per warp).
template <int WB>
__global__ void __launch_bounds__(WB * 32)
kmeans_hist(const int* __restrict__ labels, int n, int k, int RW, int nw, int* __restrict__ cnt) {
    extern __shared__ int hist[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = blockIdx.x * WB + warp;
    const int a = min(n, g * RW), b = min(n, a + RW);  // empty past the last warp
    warp_hist(labels, a, b, k, lane, hist + warp * k);
    __syncthreads();
    const int nb = gridDim.x;
    for (int i = threadIdx.x; i < k; i += WB * 32) {
        int c = 0;
#pragma unroll
        for (int w = 0; w < WB; ++w) c += hist[w * k + i];
        cnt[(i64)i * nb + blockIdx.x] = c;
    }
}

// incl: inclusive prefix sum of cnt (label-major). order[pos] = row, stable: the
// block's first position of label l, then its warps in order, each warp's rows in
// order. The warps' histograms are counted again here (labels are read twice, the
// counts are not stored per warp).
template <int WB>
__global__ void __launch_bounds__(WB * 32)
kmeans_scatter(const int* __restrict__ labels, int n, int k, int RW, int nw, const int* __restrict__ cnt,
               const int* __restrict__ incl, int* __restrict__ order) {
    extern __shared__ int run[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = blockIdx.x * WB + warp;
    const int a = min(n, g * RW), b = min(n, a + RW);
    warp_hist(labels, a, b, k, lane, run + warp * k);
    __syncthreads();
    const int nb = gridDim.x;
    for (int i = threadIdx.x; i < k; i += WB * 32) {  // counts -> each warp's first position
        const i64 e = (i64)i * nb + blockIdx.x;
        int pos = incl[e] - cnt[e];
#pragma unroll
        for (int w = 0; w < WB; ++w) {
            const int c = run[w * k + i];
            run[w * k + i] = pos;
            pos += c;
        }
    }
    __syncthreads();
    int* h = run + warp * k;
    for (int r = a; r < b; r += 32 * SORT_UL) {
        int ls[SORT_UL];
#pragma unroll
        for (int u = 0; u < SORT_UL; ++u) ls[u] = (r + u * 32 + lane < b) ? labels[r + u * 32 + lane] : -1;
#pragma unroll
        for (int u = 0; u < SORT_UL; ++u) {
            const int l = ls[u];
            const unsigned peers = __match_any_sync(0xffffffffu, l);
            if (l >= 0) {
                const int rank = __popc(peers & ((1u << lane) - 1u));
                order[h[l] + rank] = r + u * 32 + lane;
            }
            __syncwarp();  // every lane has read h[l] before it moves on
            if (l >= 0 && lane == __ffs(peers) - 1) h[l] += __popc(peers);
            __syncwarp();
        }
    }
}

// off (k+1): first position of each label in the sorted order; pstart (k+1): first
// piece of each label (pieces of <= P rows). One block of 1024 threads, a label per
// thread and a scan of the piece counts in shared memory, 1024 labels at a time
// (it was one thread looping over the labels: up to k memory round trips per
// iteration of the fit, not measured separately).
template <int P>
__global__ void __launch_bounds__(1024)
kmeans_offsets(const int* __restrict__ cnt, const int* __restrict__ incl, int k, int nw,
               int n, int* __restrict__ off, int* __restrict__ pstart) {  // nw: the count columns (blocks)
    constexpr int NT = 1024;
    __shared__ int sh[NT];
    const int t = threadIdx.x;
    int carry = 0;  // pieces of the labels before this round (the same in every thread)
    for (int base = 0; base < k; base += NT) {
        const int l = base + t;
        int c = 0;
        if (l < k) {
            const int o = incl[(i64)l * nw] - cnt[(i64)l * nw];
            const int e = (l + 1 < k) ? incl[(i64)(l + 1) * nw] - cnt[(i64)(l + 1) * nw] : n;
            off[l] = o;
            c = (e - o + P - 1) / P;
        }
        sh[t] = c;
        __syncthreads();
        for (int s = 1; s < NT; s <<= 1) {  // inclusive scan (Hillis-Steele)
            const int v = t >= s ? sh[t - s] : 0;
            __syncthreads();
            sh[t] += v;
            __syncthreads();
        }
        if (l < k) pstart[l] = carry + sh[t] - c;
        carry += sh[NT - 1];
        __syncthreads();  // sh is rewritten by the next round
    }
    if (t == 0) {
        off[k] = n;
        pstart[k] = carry;
    }
}

// ---- radix-sort route: order64 from cupy.argsort(labels) (a stable sort)
// Thread i (of n, n >= 1): order[i] = (int)order64[i]; off[l] = the first sorted
// position of label l (l = 0..k; off[k] = n), labels without rows included.
__global__ void kmeans_bounds(const long long* __restrict__ order64, const int* __restrict__ labels,
                              int n, int k, int* __restrict__ order, int* __restrict__ off) {
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int r = (int)order64[i];
    order[i] = r;
    const int lb = labels[r];
    const int la = i > 0 ? labels[(int)order64[i - 1]] : -1;
    for (int l = la + 1; l <= lb; ++l) off[l] = (int)i;  // labels (la, lb] start here
    if (i == n - 1) {
        for (int l = lb + 1; l <= k; ++l) off[l] = n;  // trailing empty labels, and off[k]
    }
}

// pstart (k+1): first piece of each label (pieces of <= P rows), from off (k+1).
// One block of 1024 threads, each a run of consecutive labels, and a scan of the
// runs' piece counts (integers: exact).
template <int P>
__global__ void __launch_bounds__(1024)
kmeans_pieces(const int* __restrict__ off, int k, int* __restrict__ pstart) {
    __shared__ int wsum[32];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int per = (k + 1023) / 1024;
    const int l0 = min(k, t * per), l1 = min(k, l0 + per);
    int s = 0;
    for (int l = l0; l < l1; ++l) s += (off[l + 1] - off[l] + P - 1) / P;
    int incl = s;  // inclusive scan over the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int v = wsum[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += u;
        }
        wsum[lane] = v;  // inclusive over the warps
    }
    __syncthreads();
    int base = (warp > 0 ? wsum[warp - 1] : 0) + incl - s;
    for (int l = l0; l < l1; ++l) {
        pstart[l] = base;
        base += (off[l + 1] - off[l] + P - 1) / P;
    }
    if (t == 0) pstart[k] = wsum[31];
}

// A warp per task (piece b, d-slice ds), task = b * nslices + ds; blocks of any
// number of warps. The lanes split as RPW = 32/LPR rows x LPR column groups of VEC
// elements (slice width LPR*VEC: short rows keep every lane busy). Sub-row s of the
// warp takes rows beg+s, beg+s+RPW, ... of the piece in order, U of them loaded
// before they are added; the sub-rows are combined by a shuffle tree (fixed
// order). w: weights in the accumulator type (float for half X), or null.
template <typename T, int VEC, int LPR, int P>
__global__ void __launch_bounds__(256)
kmeans_partials(const T* __restrict__ X, i64 ldx, int d, int nslices, const int* __restrict__ order,
                const int* __restrict__ off, const int* __restrict__ pstart, int k,
                const typename AccT<T>::type* __restrict__ w, double* __restrict__ part,
                double* __restrict__ wpart) {
    typedef typename AccT<T>::type A;
    constexpr int RPW = 32 / LPR, SW = LPR * VEC, U = 4;
    static_assert(LPR >= 1 && LPR <= 32 && 32 % LPR == 0, "lanes per row divide the warp");
    const int lane = threadIdx.x & 31;
    const i64 task = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (task >= (i64)pstart[k] * nslices) return;  // warp-uniform; no block barrier below
    const int b = (int)(task / nslices), ds = (int)(task % nslices);
    int lo = 0, hi = k;  // the label l with pstart[l] <= b < pstart[l+1]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (pstart[mid] <= b) lo = mid;
        else hi = mid;
    }
    const int beg = off[lo] + (b - pstart[lo]) * P;
    const int end = min(off[lo + 1], beg + P);
    const int sub = lane / LPR;
    const int col = ds * SW + (lane % LPR) * VEC;
    const bool full = col + VEC <= d;
    double acc[VEC];
#pragma unroll
    for (int q = 0; q < VEC; ++q) acc[q] = 0.0;
    double ws = 0.0;
    for (int i0 = beg + sub; i0 < end; i0 += U * RPW) {
        int r[U];
#pragma unroll
        for (int u = 0; u < U; ++u) r[u] = (i0 + u * RPW < end) ? order[i0 + u * RPW] : -1;
        A wr[U];
        if constexpr (sizeof(T) == 2) {
            // 16-bit rows stay packed (half the registers) until they are added: more
            // blocks an SM, more loads in flight; the same values in the same order.
            unsigned xr[U][Raw<T, VEC>::NW];
            const int valid = max(0, min(VEC, d - col));
#pragma unroll
            for (int u = 0; u < U; ++u) {
                wr[u] = r[u] < 0 ? A(0) : (w != nullptr ? w[r[u]] : A(1));
                load_raw<T, VEC>(xr[u], X + (i64)max(r[u], 0) * ldx + col, r[u] >= 0 ? valid : 0);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (r[u] < 0) break;  // rows past the piece's end come last
                float x[VEC];
                widen_raw<T, VEC>(x, xr[u]);
#pragma unroll
                for (int q = 0; q < VEC; ++q) acc[q] = fma((double)wr[u], (double)x[q], acc[q]);
                ws += (double)wr[u];
            }
        } else {
            A x[U][VEC];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const T* px = X + (i64)max(r[u], 0) * ldx + col;
                wr[u] = r[u] < 0 ? A(0) : (w != nullptr ? w[r[u]] : A(1));
                if (r[u] >= 0 && full) {
                    load_x<T, VEC>(x[u], px);
                } else {
#pragma unroll
                    for (int q = 0; q < VEC; ++q) x[u][q] = (r[u] >= 0 && col + q < d) ? widen_at(px + q) : A(0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (r[u] < 0) break;  // rows past the piece's end come last
#pragma unroll
                for (int q = 0; q < VEC; ++q) acc[q] = fma((double)wr[u], (double)x[u][q], acc[q]);
                ws += (double)wr[u];
            }
        }
    }
#pragma unroll
    for (int o = 16; o >= LPR; o >>= 1) {  // sub-rows, a fixed tree
#pragma unroll
        for (int q = 0; q < VEC; ++q) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
        ws += __shfl_xor_sync(0xffffffffu, ws, o);
    }
    if (sub == 0) {
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
            if (col + q < d) part[(i64)b * d + col + q] = acc[q];
        }
        if (lane == 0 && ds == 0) wpart[b] = ws;
    }
}

// A thread per (label, column), t = l*d + c: sums[l, c] (+)= the pieces of label l,
// in order; the thread of column 0 does wsum[l] too.
template <typename T>
__global__ void kmeans_reduce(const T* __restrict__ part, const T* __restrict__ wpart,
                              const int* __restrict__ pstart, int k, int d, int acc,
                              T* __restrict__ sums, T* __restrict__ wsum) {
    const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (i64)k * d) return;
    const int l = (int)(t / d), c = (int)(t % d);
    const int p0 = pstart[l], p1 = pstart[l + 1];
    T s = acc ? sums[t] : T(0);
    for (int p = p0; p < p1; ++p) s += part[(i64)p * d + c];
    sums[t] = s;
    if (c == 0) {
        T s2 = acc ? wsum[l] : T(0);
        for (int p = p0; p < p1; ++p) s2 += wpart[p];
        wsum[l] = s2;
    }
}

// kmeans_finalize: the centres are T, sums float64; a fit of half-precision X has
// float32 centres (kmeans_finalize<float>).
// Block per centre (blockDim.x a power of two, <= 1024). new = sums / wsum, or the
// old centre where wsum == 0; cn = ||new||^2 (as the next assign step uses it);
// shift2 = ||new - old||^2. Tree reductions in shared memory: fixed order.
template <typename T>
__global__ void kmeans_finalize(const double* __restrict__ sums, const double* __restrict__ wsum,
                                const T* __restrict__ old, int d, T* __restrict__ out,
                                T* __restrict__ cn, double* __restrict__ shift2) {
    __shared__ double s_n[1024], s_s[1024];
    const int l = blockIdx.x, t = threadIdx.x;
    const double wl = wsum[l];
    double nn = 0.0, ss = 0.0;
    for (int c = t; c < d; c += blockDim.x) {
        const i64 i = (i64)l * d + c;
        const T o = old[i];
        const T v = wl > 0.0 ? (T)(sums[i] / wl) : o;
        out[i] = v;
        nn += (double)v * (double)v;
        const double df = (double)v - (double)o;
        ss += df * df;
    }
    s_n[t] = nn;
    s_s[t] = ss;
    __syncthreads();
    for (int h = blockDim.x >> 1; h > 0; h >>= 1) {
        if (t < h) {
            s_n[t] += s_n[t + h];
            s_s[t] += s_s[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        cn[l] = (T)s_n[0];
        shift2[l] = s_s[0];
    }
}

// One block of NT threads: status = [sum of shift2, empty clusters, changed flag];
// the flag is reset for the next assignment (one launch fewer per iteration).
template <int NT>
__global__ void __launch_bounds__(NT)
kmeans_status(const double* __restrict__ shift2, const double* __restrict__ wsum,
              int k, int* __restrict__ changed, double* __restrict__ status) {
    __shared__ double s_s[NT], s_e[NT];
    const int t = threadIdx.x;
    double s = 0.0, e = 0.0;
    for (int l = t; l < k; l += NT) {
        s += shift2[l];
        e += wsum[l] > 0.0 ? 0.0 : 1.0;
    }
    s_s[t] = s;
    s_e[t] = e;
    __syncthreads();
    for (int h = NT / 2; h > 0; h >>= 1) {
        if (t < h) {
            s_s[t] += s_s[t + h];
            s_e[t] += s_e[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        status[0] = s_s[0];
        status[1] = s_e[0];
        status[2] = (double)*changed;
        *changed = 0;
    }
}

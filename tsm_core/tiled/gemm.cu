// Regular tiled GEMM and the fused Strassen primitive.
//
//   gemm_tiled<T, A_K, B_K, VA, VB, BK, NA, NB, NC, FUSED, OCC, WN, SPLIT>   (v1)
//   gemm_async<T, A_K, B_K, VA, VB, BM, BN, BK, STAGES, OCC>       (v2, further down)
//   gemm_pipe<A_K, B_K, BK, STAGES, UNR, ORDER, NA, NB, NC, FUSED, MIDBAR>   (v3, last)
//
// One template serves both:
//  * plain GEMM (FUSED = false, NA = NB = NC = 1): C = alpha * A @ B + beta * C;
//  * the fused Strassen product of the paper ("Strassen's algorithm reloaded on
//    GPUs", Algorithm 2 / Figure 3): M = (sum_a ca_i X_i) (sum_b cb_j V_j),
//    C_l += cc_l * M for NC destination blocks. The operand sums are formed while
//    the tiles are packed into shared memory and M is added into the C blocks
//    straight from registers, so no workspace is needed. NA, NB, NC are compile-time
//    term counts, so a product with one A term carries no second pointer, load or add.
//    blockIdx.z selects a product descriptor (several products in one launch).
//
// Layout. A is (M, K), B (K, N), C (M, N).
//   A_K: A is contiguous along k (row-major), A[i, k] = A[i * lda + k];
//        else contiguous along m (column-major), A[i, k] = A[i + k * lda].
//   B_K: B is contiguous along k (column-major), B[k, j] = B[k + j * ldb];
//        else contiguous along n (row-major), B[k, j] = B[k * ldb + j].
//   C[i, j] = C[i * rsc + j * csc] (any strides).
//   VA / VB: 16-byte vector loads are legal (base and leading dimension aligned);
//   otherwise the same elements are read with scalar loads (same sectors, 4x the
//   load instructions, which are few next to the FFMAs: no cliff at odd sizes).
//
// Tiles. float: 128 x 128 block tile, 256 threads, an 8 x 8 register block per
// thread; double: 64 x 64, 4 x 4 (V = 16 / sizeof(T) elements per vector, a thread
// owns 2V x 2V). WN = 4 doubles the tile's width (float 128 x 256, 8 x 16 per
// thread, one block per SM): 6 fragment loads per 128 FFMAs instead of 4 per 64. Both shared-memory tiles are stored k-major (As[k][m], Bs[k][n]),
// so the inner loop reads each thread's A and B fragments as two 16-byte vectors
// each. A thread's rows are {ty*V + i} and {BM/2 + ty*V + i}: the two halves keep
// the vectors of one warp in consecutive addresses (no bank conflicts).
//
// Pipeline. Global -> registers -> shared memory, two shared buffers, one barrier per
// k-step: the loads of tile t+1 are issued before tile t is computed and stored after
// it, so their latency hides behind 8 * BK * 8 FFMAs per thread. A register stage
// (rather than cp.async) is what lets a k-contiguous operand be transposed into the
// k-major tile with ordinary 4-byte stores; the row stride BM + PAD spreads those
// stores over all 32 banks.
//
// Fused products stage one operand term at a time and sum the terms in shared
// memory (see load_term / put_term), so their staging registers match the plain
// kernel's; they are compiled for two blocks per SM, where ptxas spills a few dozen
// bytes for 2- and 4-term variants (measured faster than one block per SM).
//
// Edges. Every k-tile but a partial last one uses unpredicated vector loads, in edge
// blocks too: rows (columns) past the matrix are read from its last one
// (clamp_start), and what they produce lands in rows (columns) of the tile that are
// not stored. The last partial k-tile takes the guarded path (zero fill), a
// block-uniform branch; so do edge blocks where an operand has no vectors (odd
// leading dimensions: unaligned operands the planner does not copy). The guarded
// path in every edge block at every k-tile (the earlier form) cost about 5% of the
// time at N = 3583 and 4095 (realigned copies), whose last tile row and column put
// an edge block on most SMs' last wave.

#pragma once

#include "common.cuh"

template <typename T> struct Vec;
template <> struct Vec<float> { using type = float4; static constexpr int n = 4; };
template <> struct Vec<double> { using type = double2; static constexpr int n = 2; };

template <typename T> struct TileCfg;
// float: 128 x 128 tile, 8 x 8 per thread; double: 64 x 64, 4 x 4 (register budget).
template <> struct TileCfg<float> { static constexpr int BM = 128, BN = 128, MINB = 2; };
template <> struct TileCfg<double> { static constexpr int BM = 64, BN = 64, MINB = 2; };

constexpr int GEMM_THREADS = 256;
constexpr int GEMM_GROUP_M = 8;  // block rows per L2 swizzle group
// Descriptor of one fused product: offsets (elements) and coefficients of up to 4
// A terms, 4 B terms, 4 C destinations, and a bit mask of destinations written
// for the first time (stored, not accumulated: beta = 0 for them).
constexpr int DESC_LEN = 32;
// [0..4) a_off, [4..8) b_off, [8..12) c_off, [12..16) a_c, [16..20) b_c,
// [20..24) c_c, [24] first-write mask.

// A descriptor word, re-read at each use (volatile: not hoisted into a register
// that would live through the k-loop; it is an L1 hit).
__device__ __forceinline__ long long desc_word(const long long* p) {
#ifdef __CUDA_ARCH__
    long long v;
    asm volatile("ld.global.nc.s64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
#else  // a host build (tests/test_gemm_kernel_host.py)
    return *p;
#endif
}

// Dynamic shared memory: the block's on the GPU; in a host build (TSM_HOST_BUILD,
// the CPU tests) a buffer the test's shim supplies.
#if defined(__CUDA_ARCH__)
#define TSM_GEMM_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#elif defined(TSM_HOST_BUILD)
#define TSM_GEMM_DYN_SMEM(name) unsigned char* const name = tsm_host_dyn_smem()
#else
#define TSM_GEMM_DYN_SMEM(name) unsigned char* const name = nullptr
#endif

// Tile pid of C -> (block row pm, block column pn), grouped ("swizzled") so that
// consecutive blocks share rows of A and columns of B in L2.
template <int BM, int BN>
__device__ __forceinline__ void tile_coords(int pid, int M, int N, int& pm, int& pn) {
    const int gm = (M + BM - 1) / BM, gn = (N + BN - 1) / BN;
    const int per_group = GEMM_GROUP_M * gn;
    const int g = pid / per_group;
    const int first_m = g * GEMM_GROUP_M;
    const int rows = min(gm - first_m, GEMM_GROUP_M);
    const int r = pid - g * per_group;
    pm = first_m + r % rows;
    pn = r / rows;
}

// The split-K tail's second half: C = alpha * (sum over s of W[t][s]) + beta * C for
// tiles tile0 .. tile0 + ntiles - 1, the S partial sums added in a fixed order
// (deterministic). One thread per element, W read coalesced along tile rows.
template <typename T, int BM, int BN>
__global__ void __launch_bounds__(256)
gemm_splitk_reduce(const T* __restrict__ W, int S, int tile0, int ntiles, T* __restrict__ C,
                   int M, int N, long long rsc, long long csc, T alpha, T beta) {
    const long long total = (long long)ntiles * BM * BN;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(e / (BM * BN)), w = (int)(e % (BM * BN));
        int pm, pn;
        tile_coords<BM, BN>(tile0 + t, M, N, pm, pn);
        const int gi = pm * BM + w / BN, gj = pn * BN + w % BN;
        if (gi >= M || gj >= N) continue;
        const T* p = W + (long long)t * S * (BM * BN) + w;
        T sum = p[0];
        for (int s = 1; s < S; ++s) sum += p[(long long)s * (BM * BN)];
        T* c = C + (long long)gi * rsc + (long long)gj * csc;
        *c = (beta == (T)0) ? alpha * sum : fma(alpha, sum, beta * *c);
    }
}

// Y[r, c] = X[r, c] for c < cols, 0 for cols <= c < ldy (ldy a multiple of V): the
// realigned copy of an operand whose leading dimension ldx is not a multiple of 16
// bytes (_gemm._realigned), padding zeroed (edge blocks read it). Thread t of a row
// reads the V elements of its group one by one, lanes on consecutive groups (each
// load instruction of a warp covers 4 or 8 lines the next ones hit in L1), and
// writes them as one vector. Rows over blockIdx.y in steps of gridDim.y (<= 65535).
// cudaMemcpy2D did the same copy, without the zeros, 1.6x slower at 4095 x 4095.
template <typename T>
__global__ void __launch_bounds__(256)
realign_copy(const T* __restrict__ X, long long ldx, T* __restrict__ Y, long long ldy,
             int rows, int cols) {
    constexpr int V = Vec<T>::n;
    using VT = typename Vec<T>::type;
    const long long c0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (c0 >= ldy) return;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* x = X + r * ldx;
        T e[V];
#pragma unroll
        for (int j = 0; j < V; ++j) e[j] = c0 + j < cols ? __ldg(x + c0 + j) : (T)0;
        *reinterpret_cast<VT*>(Y + r * ldy + c0) = *reinterpret_cast<const VT*>(e);
    }
}

template <typename T>
__device__ __forceinline__ typename Vec<T>::type ldv(const T* p) {
    return __ldg(reinterpret_cast<const typename Vec<T>::type*>(p));
}

// W = X + s * Y over `outer` lines of `inner` contiguous elements (line strides ldx,
// ldy, ldw): the operand sums of the two-level hybrid Strassen (workspace W). inner %
// V == 0 and every base and stride 16-byte aligned (its blocks are multiples of 4 V
// elements). Blocks take whole lines (grid-stride over lines), threads the vectors
// of a line, two in flight per thread, about 12 instructions a vector: the sums run
// beside gemm_pipe in two 64-thread blocks per SM (so at most 32 registers), and
// every instruction they issue is taken from its FFMAs. One vector at a time behind
// a 64-bit division per vector (the previous version) left about 3.6 ms of the sums
// at N = 16384 outside the products' time (H100).
template <typename T>
__global__ void __launch_bounds__(256)
block_sum(const T* __restrict__ X, long long ldx, const T* __restrict__ Y, long long ldy, T s,
          T* __restrict__ W, long long ldw, int outer, int inner) {
    constexpr int V = Vec<T>::n;
    using VT = typename Vec<T>::type;
    const int iv = inner / V, bd = blockDim.x;
    auto sum = [s](const VT& a, const VT& b) {
        const T* xv = reinterpret_cast<const T*>(&a);
        const T* yv = reinterpret_cast<const T*>(&b);
        VT r;
        T* rv = reinterpret_cast<T*>(&r);
#pragma unroll
        for (int j = 0; j < V; ++j) rv[j] = fma(s, yv[j], xv[j]);
        return r;
    };
    for (int o = blockIdx.x; o < outer; o += gridDim.x) {
        const VT* __restrict__ x = reinterpret_cast<const VT*>(X + (long long)o * ldx);
        const VT* __restrict__ y = reinterpret_cast<const VT*>(Y + (long long)o * ldy);
        VT* __restrict__ w = reinterpret_cast<VT*>(W + (long long)o * ldw);
        int c = threadIdx.x;
        for (; c + bd < iv; c += 2 * bd) {  // two vectors in flight, no bounds tests
            const VT a0 = __ldg(x + c), a1 = __ldg(x + c + bd);
            const VT b0 = __ldg(y + c), b1 = __ldg(y + c + bd);
            w[c] = sum(a0, b0);
            w[c + bd] = sum(a1, b1);
        }
        if (c < iv) w[c] = sum(__ldg(x + c), __ldg(y + c));
    }
}

// One staged vector v of an operand term into the k-major shared tile S[k][pos]:
// stored (the first term, `first`) or added to what this thread stored before (the
// paper's X + dY, V + eW), negated when `ng`. A K_MAJOR operand's vector holds V
// consecutive k of one row (or column), scattered over V rows of S; otherwise V
// consecutive positions of one k, a single vector store.
template <bool K_MAJOR, typename T, typename VT, int V, int R, int C>
__device__ __forceinline__ void put_vec(T (&S)[R][C], int kk, int pos, const VT& v, bool ng, bool first) {
    const T* v0 = reinterpret_cast<const T*>(&v);
    if constexpr (K_MAJOR) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
            T& dst = S[kk + j][pos];
            const T x = ng ? -v0[j] : v0[j];
            dst = first ? x : dst + x;
        }
    } else {
        VT* dst = reinterpret_cast<VT*>(&S[kk][pos]);
        T o[V];
        if (first) {
#pragma unroll
            for (int j = 0; j < V; ++j) o[j] = ng ? -v0[j] : v0[j];
        } else {
            const VT old = *dst;
            const T* ov = reinterpret_cast<const T*>(&old);
#pragma unroll
            for (int j = 0; j < V; ++j) o[j] = ng ? ov[j] - v0[j] : ov[j] + v0[j];
        }
        *dst = *reinterpret_cast<const VT*>(o);
    }
}

// The row along m (n) an edge block reads for `start` (see "Edges" above): an operand
// contiguous along k reads one row, clamped to n_rows - 1; one contiguous along m (n)
// with vectors reads V rows from an aligned start, clamped to the last aligned start
// (the vector's last rows lie in the leading dimension's padding: ld >= n_rows
// rounded up to V, which alignment implies). Without vectors, edge blocks take the
// guarded path instead (start stays as it is).
template <bool K_MAJOR, bool VEC>
__device__ __forceinline__ int clamp_start(int start, int n_rows, int V) {
    if constexpr (!VEC) return start;
    else if constexpr (K_MAJOR) return min(start, n_rows - 1);
    else return min(start, (n_rows - 1) & ~(V - 1));
}

// Where V-vector v of an operand's tile (R rows along m or n, BK along k) sits: its
// row r and k. An operand contiguous along k (K_MAJOR) has its vectors run along k
// first; one contiguous along m (n), along the rows first.
template <bool K_MAJOR, int BK, int R, int V>
__device__ __forceinline__ void tile_vec(int v, int& r, int& kk) {
    if constexpr (K_MAJOR) { r = v / (BK / V); kk = (v % (BK / V)) * V; }
    else { kk = v / (R / V); r = (v % (R / V)) * V; }
}

// The epilogue of gemm_tiled and gemm_pipe: a thread's 2V x WN*V register block acc
// (rows {ty*V + i} and {BM/2 + ty*V + i}, columns {hj * BN/WN + tx*V + j}) into C:
// C = alpha * acc + beta * C (beta == 0 never reads C: NaN in out stays out), or, for
// a fused product (descriptor d), C_l = c_l * acc (+ C_l unless its first write) for
// NC blocks. 16-byte stores wherever a row of C starts aligned (with csc == 1, each
// row decides for itself: an odd rsc leaves one row in four aligned, not none).
// ROW_PTR: addresses formed from a row pointer (gemm_pipe) or from C each time
// (gemm_tiled). Either is the same arithmetic, but ptxas allocates the kernels'
// registers differently for them; each kernel keeps the SASS it was measured with.
template <typename T, int BM, int BN, int WN, int NC, bool FUSED, bool ROW_PTR>
__device__ __forceinline__ void store_block(const T (&acc)[2 * Vec<T>::n][WN * Vec<T>::n],
                                            T* __restrict__ C, const long long* __restrict__ d, int M, int N,
                                            int m0, int n0, int ty, int tx, long long rsc,
                                            long long csc, T alpha, T beta) {
    constexpr int V = Vec<T>::n;
    using VT = typename Vec<T>::type;
    const bool cvec = csc == 1;
    const int first = FUSED ? (int)d[24] : 0;
    if constexpr (ROW_PTR && FUSED) {
        // gemm_pipe's fused products: a whole tile with 16-byte rows (block-uniform)
        // takes a compact path: one loop over the NC blocks, not unrolled, whose body
        // stores (or reads 16 vectors, then adds and stores) a row group at a time. The
        // unrolled general code below is 8.7 K instructions for NC = 1 and 26 K for
        // NC = 4 (sm_90), run once per block: fetched cold, they cost more than the
        // stores themselves (H100: 49 products of 4096^3 took 165 ms with
        // four blocks of C each against 147 ms with one; with this path 148 and 145).
        // (The plain GEMM keeps the general code: its SASS is the one measured.)
        bool fast = cvec && m0 + BM <= M && n0 + BN <= N && rsc % V == 0;
#pragma unroll
        for (int t = 0; t < NC; ++t)
            fast = fast && (reinterpret_cast<unsigned long long>(C + (FUSED ? d[8 + t] : 0)) % 16) == 0;
        if (fast) {
            const long long r0 = (long long)(m0 + ty * V) * rsc + n0 + tx * V;
#pragma unroll 1
            for (int t = 0; t < NC; ++t) {
                T* const Ct = C + (FUSED ? d[8 + t] : 0) + r0;
                const T g = FUSED ? (T)d[20 + t] : alpha;
                const bool overwrite = FUSED ? ((first >> t) & 1) : (beta == (T)0);
                const T bt = FUSED ? (T)1 : beta;
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {
                    T* const base = Ct + (long long)(hi * (BM / 2)) * rsc;
                    if (overwrite) {
#pragma unroll
                        for (int i = 0; i < V; ++i)
#pragma unroll
                            for (int hj = 0; hj < WN; ++hj) {
                                const T* av = &acc[hi * V + i][hj * V];
                                T o[V];
#pragma unroll
                                for (int j = 0; j < V; ++j) o[j] = g * av[j];
                                *reinterpret_cast<VT*>(base + i * rsc + hj * (BN / WN)) =
                                    *reinterpret_cast<const VT*>(o);
                            }
                    } else {
                        VT old[V][WN];  // every load of the row group in flight at once
#pragma unroll
                        for (int i = 0; i < V; ++i)
#pragma unroll
                            for (int hj = 0; hj < WN; ++hj)
                                old[i][hj] = *reinterpret_cast<const VT*>(base + i * rsc + hj * (BN / WN));
#pragma unroll
                        for (int i = 0; i < V; ++i)
#pragma unroll
                            for (int hj = 0; hj < WN; ++hj) {
                                const T* av = &acc[hi * V + i][hj * V];
                                const T* ov = reinterpret_cast<const T*>(&old[i][hj]);
                                T o[V];
#pragma unroll
                                for (int j = 0; j < V; ++j) o[j] = fma(g, av[j], bt * ov[j]);
                                *reinterpret_cast<VT*>(base + i * rsc + hj * (BN / WN)) =
                                    *reinterpret_cast<const VT*>(o);
                            }
                    }
                }
            }
            return;
        }
    }
#pragma unroll
    for (int t = 0; t < NC; ++t) {
        T* Ct = C + (FUSED ? d[8 + t] : 0);
        const T g = FUSED ? (T)d[20 + t] : alpha;
        const bool overwrite = FUSED ? ((first >> t) & 1) : (beta == (T)0);
        const T bt = FUSED ? (T)1 : beta;
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
            for (int i = 0; i < V; ++i) {
                const int gi = m0 + hi * (BM / 2) + ty * V + i;
                if (gi >= M) continue;
                T* crow = Ct + (long long)gi * rsc;
                auto row = [&]() { return ROW_PTR ? crow : Ct + (long long)gi * rsc; };
                const bool vec_ok = cvec && (reinterpret_cast<unsigned long long>(row()) % 16) == 0;
#pragma unroll
                for (int hj = 0; hj < WN; ++hj) {
                    const int gj0 = n0 + hj * (BN / WN) + tx * V;
                    const T* av = &acc[hi * V + i][hj * V];
                    if (vec_ok && gj0 + V <= N) {
                        VT* p = reinterpret_cast<VT*>(row() + gj0);
                        T o[V];
                        if (overwrite) {
#pragma unroll
                            for (int j = 0; j < V; ++j) o[j] = g * av[j];
                        } else {
                            const VT old = *p;
                            const T* ov = reinterpret_cast<const T*>(&old);
#pragma unroll
                            for (int j = 0; j < V; ++j) o[j] = fma(g, av[j], bt * ov[j]);
                        }
                        *p = *reinterpret_cast<const VT*>(o);
                    } else {
#pragma unroll
                        for (int j = 0; j < V; ++j) {
                            const int gj = gj0 + j;
                            if (gj >= N) continue;
                            T* p = row() + (long long)gj * csc;
                            *p = overwrite ? g * av[j] : fma(g, av[j], bt * *p);
                        }
                    }
                }
            }
    }
}

template <typename T, bool A_K, bool B_K, bool VA, bool VB, int BK, int NA, int NB, int NC, bool FUSED,
          int OCC, int WN, bool SPLIT>
__global__ void __launch_bounds__(GEMM_THREADS, OCC)
gemm_tiled(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
           int M, int N, int K, long long lda, long long ldb, long long rsc, long long csc,
           T alpha, T beta, const long long* __restrict__ desc,
           int tile0, int ksplit, int kchunk, T* __restrict__ W)
{
    constexpr int V = Vec<T>::n;
    using VT = typename Vec<T>::type;
    // WN: V-wide column groups per thread, 2 (the square tile) or 4 (twice as wide).
    static_assert(WN == 2 || (WN == 4 && !FUSED), "WN: 2, or 4 for the plain GEMM");
    static_assert(!(SPLIT && FUSED), "split-K: plain GEMM only");
    constexpr int BM = TileCfg<T>::BM, BN = TileCfg<T>::BN * WN / 2;
    constexpr int PAD = V;  // keeps rows 16-byte aligned, moves transposed stores across banks
    constexpr int LDS_A = BM + PAD, LDS_B = BN + PAD;
    constexpr int TY = BM / (2 * V), TX = BN / (WN * V);
    static_assert(TY * TX == GEMM_THREADS, "thread grid must cover the tile");
    // Vectors of a tile, and per thread.
    constexpr int A_VECS = BM * BK / V, B_VECS = BN * BK / V;
    constexpr int LA = A_VECS / GEMM_THREADS, LB = B_VECS / GEMM_THREADS;
    static_assert(LA * GEMM_THREADS == A_VECS && LB * GEMM_THREADS == B_VECS, "load split");

    // Two shared buffers per operand: static up to 48 KB, dynamic beyond (the wide
    // tile at BK = 16 needs 49 KB; the launcher opts in).
    constexpr int SMEM_BYTES = 2 * BK * (LDS_A + LDS_B) * (int)sizeof(T);
    constexpr bool DYN = SMEM_BYTES > 48 * 1024;
    __shared__ __align__(16) T st_a[DYN ? 1 : 2 * BK * LDS_A];
    __shared__ __align__(16) T st_b[DYN ? 1 : 2 * BK * LDS_B];
    TSM_GEMM_DYN_SMEM(smem_raw);
    T* const sa = DYN ? reinterpret_cast<T*>(smem_raw) : st_a;
    T* const sb = DYN ? reinterpret_cast<T*>(smem_raw) + 2 * BK * LDS_A : st_b;
    T (*As)[BK][LDS_A] = reinterpret_cast<T (*)[BK][LDS_A]>(sa);
    T (*Bs)[BK][LDS_B] = reinterpret_cast<T (*)[BK][LDS_B]>(sb);

    // ---- product descriptor (Strassen): uniform per block. Only the A and B term
    // offsets are live through the k-loop (as pointers); the coefficients are signs
    // (+-1) kept as bits, and the C destinations are read again in the epilogue.
    const long long* d = FUSED ? desc + (long long)blockIdx.z * DESC_LEN : nullptr;
    unsigned neg = 0;  // bit t: A term t negated; bit 4 + t: B term t negated
    if constexpr (FUSED) {
#pragma unroll
        for (int i = 0; i < NA; ++i) neg |= (d[12 + i] < 0 ? 1u : 0u) << i;
#pragma unroll
        for (int i = 0; i < NB; ++i) neg |= (d[16 + i] < 0 ? 1u : 0u) << (4 + i);
    }

    // ---- block position, grouped ("swizzled") so that consecutive blocks share
    // rows of A and columns of B in L2.
    // Split-K tail (plain GEMM only): block b computes k-range (b % ksplit) of tile
    // tile0 + b / ksplit and stores its raw sums in W (gemm_splitk_reduce adds them).
    // The block's k-range starts the operands' k-axis and K becomes its length, so the
    // k-loop and its edge tests are the plain ones (and no register holds the range).
    int pm, pn;
    if constexpr (SPLIT) {
        tile_coords<BM, BN>(tile0 + (int)(blockIdx.x / ksplit), M, N, pm, pn);
        const int kb = (int)(blockIdx.x % ksplit) * kchunk;  // a multiple of BK
        A += A_K ? (long long)kb : (long long)kb * lda;
        B += B_K ? (long long)kb : (long long)kb * ldb;
        K = min(K - kb, kchunk);
    } else {
        tile_coords<BM, BN>((int)blockIdx.x, M, N, pm, pn);
    }
    const int m0 = pm * BM, n0 = pn * BN;
    const bool edge_guard = !(VA && VB) && !((m0 + BM <= M) && (n0 + BN <= N));
    const int tid = threadIdx.x;

    // ---- global -> register staging. Each thread moves LA vectors of A, LB of B.
    // A fused product's operand terms are staged one at a time (term t of A and of B
    // together) and summed in shared memory: the first term is stored, later ones
    // added in place by the same thread (each thread owns its elements, so no race
    // and no barrier). The term loads are spread over the k-step (see the main loop),
    // so a product with 2 or 4 terms holds no more staging registers than a plain one.
    constexpr int NT = NA > NB ? NA : NB;
    VT ra[LA], rb[LB];

    // Where vector l of this thread sits in the tile (tile_vec).
    auto a_pos = [&](int l, int& r, int& kk) { tile_vec<A_K, BK, BM, V>(tid + l * GEMM_THREADS, r, kk); };
    auto b_pos = [&](int l, int& c, int& kk) { tile_vec<B_K, BK, BN, V>(tid + l * GEMM_THREADS, c, kk); };

    // guard: the last partial k-tile, or any k-tile of an edge block if an operand is
    // read element by element (no vectors: those variants keep the guarded path,
    // which costs them less than clamping each element's address would).
    auto load_term = [&](int k0, bool guard, int t) {
        if (t < NA) {
#pragma unroll
            for (int l = 0; l < LA; ++l) {
                int r, kk;
                a_pos(l, r, kk);
                const int gk = k0 + kk;
                const int gi = guard ? m0 + r : clamp_start<A_K, VA>(m0 + r, M, V);
                const long long base = A_K ? (long long)gi * lda + gk : (long long)gi + (long long)gk * lda;
                const T* p = A + (FUSED ? desc_word(d + t) : 0) + base;
                if (!guard && VA) {
                    ra[l] = ldv<T>(p);
                } else {
                    T e[V];
#pragma unroll
                    for (int j = 0; j < V; ++j) {
                        const int ii = A_K ? gi : gi + j, kj = A_K ? gk + j : gk;
                        const bool ok = !guard || (ii < M && kj < K);
                        e[j] = ok ? __ldg(p + j) : (T)0;
                    }
                    if constexpr (V == 4) ra[l] = make_float4(e[0], e[1], e[2], e[3]);
                    else ra[l] = make_double2(e[0], e[1]);
                }
            }
        }
        if (t < NB) {
#pragma unroll
            for (int l = 0; l < LB; ++l) {
                int c, kk;
                b_pos(l, c, kk);
                const int gk = k0 + kk;
                const int gj = guard ? n0 + c : clamp_start<B_K, VB>(n0 + c, N, V);
                const long long base = B_K ? (long long)gk + (long long)gj * ldb : (long long)gk * ldb + gj;
                const T* p = B + (FUSED ? desc_word(d + 4 + t) : 0) + base;
                if (!guard && VB) {
                    rb[l] = ldv<T>(p);
                } else {
                    T e[V];
#pragma unroll
                    for (int j = 0; j < V; ++j) {
                        const int jj = B_K ? gj : gj + j, kj = B_K ? gk + j : gk;
                        const bool ok = !guard || (jj < N && kj < K);
                        e[j] = ok ? __ldg(p + j) : (T)0;
                    }
                    if constexpr (V == 4) rb[l] = make_float4(e[0], e[1], e[2], e[3]);
                    else rb[l] = make_double2(e[0], e[1]);
                }
            }
        }
    };

    // Put the staged term t into shared buffer `buf` (k-major): term 0 is stored,
    // later terms added to what this thread stored (the paper's X + dY, V + eW).
    auto put_term = [&](int buf, int t) {
        if (t < NA) {
            const bool ng = (neg >> t) & 1u;
#pragma unroll
            for (int l = 0; l < LA; ++l) {
                int r, kk;
                a_pos(l, r, kk);
                put_vec<A_K, T, VT, V>(As[buf], kk, r, ra[l], ng, t == 0);
            }
        }
        if (t < NB) {
            const bool ng = (neg >> (4 + t)) & 1u;
#pragma unroll
            for (int l = 0; l < LB; ++l) {
                int c, kk;
                b_pos(l, c, kk);
                put_vec<B_K, T, VT, V>(Bs[buf], kk, c, rb[l], ng, t == 0);
            }
        }
    };

    // ---- thread position in the compute grid: a warp covers 4 (ty) x 8 (tx), so its
    // fragment reads touch 4 A vectors and 8 B vectors: one wavefront each.
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int WX = TX / 8;  // warps along n
    const int ty = (warp / WX) * 4 + (lane >> 3);
    const int tx = (warp % WX) * 8 + (lane & 7);

    T acc[2 * V][WN * V];
#pragma unroll
    for (int i = 0; i < 2 * V; ++i)
#pragma unroll
        for (int j = 0; j < WN * V; ++j) acc[i][j] = (T)0;

    const int KT = (K + BK - 1) / BK;
    const bool k_partial = (K % BK) != 0;  // only the last k-range can end mid-tile

    if (KT > 0) {
        const bool g0 = edge_guard || (k_partial && KT == 1);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            load_term(0, g0, t);
            put_term(0, t);
        }
    }
    __syncthreads();

    for (int kt = 0; kt < KT; ++kt) {
        const int buf = kt & 1;
        const bool more = kt + 1 < KT;
        const bool gn = edge_guard || (k_partial && kt + 2 == KT);
        const int kn = (kt + 1) * BK;
        if (more) load_term(kn, gn, 0);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            T a[2 * V], b[WN * V];
            *reinterpret_cast<VT*>(&a[0]) = *reinterpret_cast<const VT*>(&As[buf][kk][ty * V]);
            *reinterpret_cast<VT*>(&a[V]) = *reinterpret_cast<const VT*>(&As[buf][kk][BM / 2 + ty * V]);
#pragma unroll
            for (int g = 0; g < WN; ++g)
                *reinterpret_cast<VT*>(&b[g * V]) =
                    *reinterpret_cast<const VT*>(&Bs[buf][kk][g * (BN / WN) + tx * V]);
#pragma unroll
            for (int i = 0; i < 2 * V; ++i)
#pragma unroll
                for (int j = 0; j < WN * V; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
            // Fused products: term t's loads are issued after k-slice t * BK / NT of
            // this step, once term t - 1 (issued a slice earlier) is put away.
#pragma unroll
            for (int t = 1; t < NT; ++t) {
                if (kk == t * BK / NT - 1 && more) {
                    put_term(buf ^ 1, t - 1);
                    load_term(kn, gn, t);
                }
            }
        }
        // The other buffer was last read in step kt - 1, before that step's barrier.
        if (more) put_term(buf ^ 1, NT - 1);
        __syncthreads();
    }

    if constexpr (SPLIT) {  // split-K tail: raw sums, whole tile, [row][col] in W
        T* w = W + (long long)blockIdx.x * (BM * BN);
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
            for (int i = 0; i < V; ++i)
#pragma unroll
                for (int hj = 0; hj < WN; ++hj)
                    *reinterpret_cast<VT*>(w + (hi * (BM / 2) + ty * V + i) * BN + hj * (BN / WN) + tx * V) =
                        *reinterpret_cast<const VT*>(&acc[hi * V + i][hj * V]);
        return;
    }

    // ---- epilogue (store_block)
    store_block<T, BM, BN, WN, NC, FUSED, false>(acc, C, d, M, N, m0, n0, ty, tx, rsc, csc, alpha,
                                                 beta);
}

// ============================================================================
// gemm_async<T, A_K, B_K, VA, VB, BM, BN, BK, STAGES, OCC>: the plain GEMM on a
// cp.async pipeline of STAGES shared-memory stages (v2 of the ladder; gemm_tiled
// with NA = NB = NC = 1 is v1).
//
// Every operand is copied into shared memory in its own layout, so no transpose and
// no staging registers: an operand contiguous along m (A) or n (B) becomes a k-major
// tile [k][BM + V]; one contiguous along k becomes a row-major tile [m][BK + V].
// The inner loop reads a k-major tile as 16-byte vectors along m (a thread's V
// consecutive rows) and a row-major tile as vectors along k (KV consecutive k of one
// row: a thread's rows are then ty + 16 i, so the 4 (A) or 8 (B) rows a warp reads
// sit BK + V elements apart, which spreads their vectors over distinct banks).
// cp.async with src-size 0 zero-fills outside the matrix (edge blocks only);
// without 16-byte alignment (VA / VB false: odd leading dimensions) each element is
// a 4- or 8-byte cp.async, consecutive threads on consecutive elements.

// Copies go through common.cuh's cp_async (src-size 0 zero-fills the destination).
// Programmatic dependent launch (sm_90): let the next kernel of the stream start once
// every block of this one has started, and wait for the previous kernel's completion
// (and its writes). Both do nothing in a launch without the PDL attribute, and are
// compiled out before sm_90 (and in a host build), where the launcher does not ask
// for PDL either.
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

template <typename T, bool A_K, bool B_K, bool VA, bool VB, int BM, int BN, int BK, int STAGES,
          int OCC>
__global__ void __launch_bounds__(GEMM_THREADS, OCC)
gemm_async(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,
           int M, int N, int K, long long lda, long long ldb, long long rsc, long long csc,
           T alpha, T beta)
{
    constexpr int V = Vec<T>::n;
    using VT = typename Vec<T>::type;
    constexpr int TM = BM / 16, TN = BN / 16;  // a thread's rows and columns
    constexpr int HM = TM / V, HN = TN / V;      // its V-wide groups (k-major tiles)
    static_assert(HM >= 1 && HN >= 1 && BK % V == 0, "tile shape");
    // Shared tiles, per stage: A k-major [BK][BM + V] or row-major [BM][BK + V].
    constexpr int A_ST = A_K ? BM * (BK + V) : BK * (BM + V);
    constexpr int B_ST = B_K ? BN * (BK + V) : BK * (BN + V);
    constexpr int LDA_S = A_K ? BK + V : BM + V, LDB_S = B_K ? BK + V : BN + V;
    // k values read per vector from a row-major tile: both row-major would need
    // 2 * (TM + TN) * V registers of fragments; half-width vectors keep it to 64.
    constexpr int KV = (A_K || B_K) ? (V / 2 > 0 ? V / 2 : 1) : V;
    constexpr int A_CH = BM * BK / V, B_CH = BN * BK / V;  // 16-byte chunks per tile
    static_assert(A_CH % GEMM_THREADS == 0 && B_CH % GEMM_THREADS == 0, "chunk split");

    TSM_GEMM_DYN_SMEM(smem_raw);
    T* As = reinterpret_cast<T*>(smem_raw);
    T* Bs = As + STAGES * A_ST;

    const int gm = (M + BM - 1) / BM, gn = (N + BN - 1) / BN;
    int pm, pn;
    {
        const int pid = blockIdx.x;
        const int per_group = GEMM_GROUP_M * gn;
        const int g = pid / per_group;
        const int first_m = g * GEMM_GROUP_M;
        const int rows = min(gm - first_m, GEMM_GROUP_M);
        const int r = pid - g * per_group;
        pm = first_m + r % rows;
        pn = r / rows;
    }
    const int m0 = pm * BM, n0 = pn * BN;
    const bool full_mn = (m0 + BM <= M) && (n0 + BN <= N);
    const int tid = threadIdx.x;
    const int KT = (K + BK - 1) / BK;

    // Without 16-byte alignment (VA / VB false) every element is its own 4- or 8-byte
    // cp.async, and thread t copies elements t, t + 256, ... of the tile in the
    // operand's contiguous order, so a warp's 32 copies read 32 consecutive elements
    // (a per-thread group of V consecutive elements would put 4 threads' reads 16
    // bytes apart: 4x the L1 wavefronts; measured 1.3x slower at N = 1025).
    auto load_stage = [&](int s, int k0) {
        const bool guard = !full_mn || (k0 + BK > K);
        T* as = As + s * A_ST;
        T* bs = Bs + s * B_ST;
        if constexpr (VA) {
#pragma unroll
            for (int l = 0; l < A_CH / GEMM_THREADS; ++l) {
                const int c = tid + l * GEMM_THREADS;
                int r, kk;  // chunk c covers (r .. r+V-1, kk) or (r, kk .. kk+V-1)
                if constexpr (A_K) { r = c / (BK / V); kk = (c % (BK / V)) * V; }
                else { kk = c / (BM / V); r = (c % (BM / V)) * V; }
                const int gi = m0 + r, gk = k0 + kk;
                T* dst = A_K ? as + r * LDA_S + kk : as + kk * LDA_S + r;
                const T* src = A + (A_K ? (long long)gi * lda + gk : (long long)gi + (long long)gk * lda);
                if (!guard) {
                    cp_async<16>(dst, src, true);
                } else {
#pragma unroll
                    for (int j = 0; j < V; ++j) {
                        const bool ok = A_K ? (gi < M && gk + j < K) : (gi + j < M && gk < K);
                        cp_async<sizeof(T)>(dst + j, ok ? src + j : A, ok);
                    }
                }
            }
        } else {
#pragma unroll
            for (int l = 0; l < A_CH * V / GEMM_THREADS; ++l) {
                const int e = tid + l * GEMM_THREADS;
                int r, kk;
                if constexpr (A_K) { r = e / BK; kk = e % BK; }
                else { kk = e / BM; r = e % BM; }
                const int gi = m0 + r, gk = k0 + kk;
                const bool ok = !guard || (gi < M && gk < K);
                T* dst = A_K ? as + r * LDA_S + kk : as + kk * LDA_S + r;
                const T* src = A + (A_K ? (long long)gi * lda + gk : (long long)gi + (long long)gk * lda);
                cp_async<sizeof(T)>(dst, ok ? src : A, ok);
            }
        }
        if constexpr (VB) {
#pragma unroll
            for (int l = 0; l < B_CH / GEMM_THREADS; ++l) {
                const int c = tid + l * GEMM_THREADS;
                int r, kk;
                if constexpr (B_K) { r = c / (BK / V); kk = (c % (BK / V)) * V; }
                else { kk = c / (BN / V); r = (c % (BN / V)) * V; }
                const int gj = n0 + r, gk = k0 + kk;
                T* dst = B_K ? bs + r * LDB_S + kk : bs + kk * LDB_S + r;
                const T* src = B + (B_K ? (long long)gk + (long long)gj * ldb : (long long)gk * ldb + gj);
                if (!guard) {
                    cp_async<16>(dst, src, true);
                } else {
#pragma unroll
                    for (int j = 0; j < V; ++j) {
                        const bool ok = B_K ? (gj < N && gk + j < K) : (gj + j < N && gk < K);
                        cp_async<sizeof(T)>(dst + j, ok ? src + j : B, ok);
                    }
                }
            }
        } else {
#pragma unroll
            for (int l = 0; l < B_CH * V / GEMM_THREADS; ++l) {
                const int e = tid + l * GEMM_THREADS;
                int r, kk;
                if constexpr (B_K) { r = e / BK; kk = e % BK; }
                else { kk = e / BN; r = e % BN; }
                const int gj = n0 + r, gk = k0 + kk;
                const bool ok = !guard || (gj < N && gk < K);
                T* dst = B_K ? bs + r * LDB_S + kk : bs + kk * LDB_S + r;
                const T* src = B + (B_K ? (long long)gk + (long long)gj * ldb : (long long)gk * ldb + gj);
                cp_async<sizeof(T)>(dst, ok ? src : B, ok);
            }
        }
    };

    const int lane = tid & 31, warp = tid >> 5;
    const int ty = (warp >> 1) * 4 + (lane >> 3);
    const int tx = (warp & 1) * 8 + (lane & 7);
    // Row of a thread's i-th row, column of its j-th column (epilogue and reads).
    auto row_of = [&](int i) { return A_K ? ty + 16 * i : (i / V) * (BM / HM) + ty * V + (i % V); };
    auto col_of = [&](int j) { return B_K ? tx + 16 * j : (j / V) * (BN / HN) + tx * V + (j % V); };

    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = (T)0;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) load_stage(s, s * BK);
        cp_async_commit();
    }

    for (int kt = 0; kt < KT; ++kt) {
        cp_async_wait<STAGES - 2>();
        // Tile kt has landed for every thread; and every thread is done with the
        // stage the prefetch below overwrites (it was computed in step kt - 1).
        __syncthreads();
        {
            const int nk = kt + STAGES - 1;
            if (nk < KT) load_stage(nk % STAGES, nk * BK);
            cp_async_commit();
        }
        const T* as = As + (kt % STAGES) * A_ST;
        const T* bs = Bs + (kt % STAGES) * B_ST;
#pragma unroll
        for (int kq = 0; kq < BK; kq += KV) {
            // Row-major tiles: KV k values of each row at once.
            T ar[A_K ? TM : 1][KV], br[B_K ? TN : 1][KV];
            if constexpr (A_K) {
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    const T* p = as + (ty + 16 * i) * LDA_S + kq;
                    if constexpr (KV == V) *reinterpret_cast<VT*>(ar[i]) = *reinterpret_cast<const VT*>(p);
                    else if constexpr (KV == 2) *reinterpret_cast<float2*>(ar[i]) = *reinterpret_cast<const float2*>(p);
                    else ar[i][0] = p[0];
                }
            }
            if constexpr (B_K) {
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const T* p = bs + (tx + 16 * j) * LDB_S + kq;
                    if constexpr (KV == V) *reinterpret_cast<VT*>(br[j]) = *reinterpret_cast<const VT*>(p);
                    else if constexpr (KV == 2) *reinterpret_cast<float2*>(br[j]) = *reinterpret_cast<const float2*>(p);
                    else br[j][0] = p[0];
                }
            }
#pragma unroll
            for (int q = 0; q < KV; ++q) {
                const int kk = kq + q;
                T a[TM], b[TN];
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    if constexpr (A_K) a[i] = ar[i][q];
                }
                if constexpr (!A_K) {
#pragma unroll
                    for (int h = 0; h < HM; ++h)
                        *reinterpret_cast<VT*>(&a[h * V]) =
                            *reinterpret_cast<const VT*>(as + kk * LDA_S + h * (BM / HM) + ty * V);
                }
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    if constexpr (B_K) b[j] = br[j][q];
                }
                if constexpr (!B_K) {
#pragma unroll
                    for (int h = 0; h < HN; ++h)
                        *reinterpret_cast<VT*>(&b[h * V]) =
                            *reinterpret_cast<const VT*>(bs + kk * LDB_S + h * (BN / HN) + tx * V);
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
            }
            // Row-major tiles: keep ptxas from hoisting the next group's KV-wide
            // fragment loads above these FFMAs (that needs more than 128 registers).
            if constexpr (A_K || B_K) asm volatile("" ::: "memory");
        }
    }
    cp_async_wait<0>();

    // Epilogue: C = alpha * acc + beta * C; beta == 0 never reads C.
    const bool overwrite = beta == (T)0;
    const bool vec_ok = !B_K && csc == 1 && rsc % V == 0
                        && (reinterpret_cast<unsigned long long>(C) % 16) == 0;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int gi = m0 + row_of(i);
        if (gi >= M) continue;
#pragma unroll
        for (int j0 = 0; j0 < TN; j0 += V) {
            const int gj0 = n0 + col_of(j0);
            if (!B_K && vec_ok && gj0 + V <= N) {
                VT* p = reinterpret_cast<VT*>(C + (long long)gi * rsc + gj0);
                T o[V];
                if (overwrite) {
#pragma unroll
                    for (int j = 0; j < V; ++j) o[j] = alpha * acc[i][j0 + j];
                } else {
                    const VT old = *p;
                    const T* ov = reinterpret_cast<const T*>(&old);
#pragma unroll
                    for (int j = 0; j < V; ++j) o[j] = fma(alpha, acc[i][j0 + j], beta * ov[j]);
                }
                *p = *reinterpret_cast<const VT*>(o);
            } else {
#pragma unroll
                for (int j = j0; j < j0 + V; ++j) {
                    const int gj = n0 + col_of(j);
                    if (gj >= N) continue;
                    T* p = C + (long long)gi * rsc + (long long)gj * csc;
                    *p = overwrite ? alpha * acc[i][j] : fma(alpha, acc[i][j], beta * *p);
                }
            }
        }
    }
}

// ============================================================================
// The wide tile's inner loop (128 x 256, 8 x 16 results a thread), shared by
// gemm_pipe and gemm_ws. wide_frag: a thread's fragments of k-step kk from the
// k-major tiles (rows {ty V + i} and {BM/2 + ty V + i}, columns {g BN/WN + tx V + j});
// wide_step: that step's FFMAs, ORDER 0 rows outer, 1 columns outer, 2 zig-zag
// (consecutive FFMAs share an operand at row ends too: ptxas marks more operand
// reuse; 1-1.5% faster on the H100).
template <int BM, int BN, int WN, int LDS_A, int LDS_B>
__device__ __forceinline__ void wide_frag(float (&a)[8], float (&b)[4 * WN], const float* as,
                                          const float* bs, int kk, int ty, int tx) {
    constexpr int V = 4;
    *reinterpret_cast<float4*>(&a[0]) = *reinterpret_cast<const float4*>(as + kk * LDS_A + ty * V);
    *reinterpret_cast<float4*>(&a[V]) = *reinterpret_cast<const float4*>(as + kk * LDS_A + BM / 2 + ty * V);
#pragma unroll
    for (int g = 0; g < WN; ++g)
        *reinterpret_cast<float4*>(&b[g * V]) =
            *reinterpret_cast<const float4*>(bs + kk * LDS_B + g * (BN / WN) + tx * V);
}
template <int ORDER, int R, int C>
__device__ __forceinline__ void wide_step(float (&acc)[R][C], const float (&a)[R], const float (&b)[C]) {
    if constexpr (ORDER == 0) {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int j = 0; j < C; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    } else if constexpr (ORDER == 1) {
#pragma unroll
        for (int j = 0; j < C; ++j)
#pragma unroll
            for (int i = 0; i < R; ++i) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    } else {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int jj = 0; jj < C; ++jj) {
                const int j = (i & 1) ? C - 1 - jj : jj;
                acc[i][j] = fma(a[i], b[j], acc[i][j]);
            }
    }
}
// A fused product's second terms (descriptor d, DESC_LEN layout): their offsets from
// the first terms and their signs.
template <int NA, int NB>
__device__ __forceinline__ void second_terms(const long long* d, long long& a_off, long long& b_off,
                                             bool& a_neg, bool& b_neg) {
    if constexpr (NA == 2) { a_off = d[1] - d[0]; a_neg = d[13] < 0; }
    if constexpr (NB == 2) { b_off = d[5] - d[4]; b_neg = d[17] < 0; }
}

// gemm_pipe<A_K, B_K, BK, STAGES, UNR, ORDER, NA, NB, NC, FUSED>: float32 GEMM on
// gemm_tiled's wide tile (128 x 256, 8 x 16 results per thread, one block of 8
// warps per SM) with a deeper pipeline (v3 of the ladder); the plain GEMM and the
// fused Strassen product with up to two terms per operand.
//
// Why. gemm_tiled's wide tile issues as many instructions as cuBLAS's 256 x 128
// kernel at N = 8192 (Nsight Compute: 19.34 G against 19.39 G) but ran 14% longer:
// per issued instruction its warps stalled 0.17 cycles on instruction fetch, 0.15
// on fixed-latency dependencies and 0.21 on dispatch, against cuBLAS's 0.01, 0.01
// and 0.10 (H100).
//
// How. An operand contiguous along m (A) or n (B) is copied into its k-major tile by
// cp.async (16 bytes, no registers), STAGES - 1 tiles ahead. An operand contiguous
// along k still needs a transpose on its way into the k-major tile: it is staged in
// registers, loaded half a k-tile into step kt and stored half a k-tile into step
// kt + 1 (for tile kt + 2), so its latency hides behind a whole k-tile. The
// fragments of step kk + 1 are read while step kk's FFMAs run (ptxas moves most of
// those reads back down, but the register room is there). Tile j of both operands
// lives in stage j % STAGES; one barrier per k-tile. ORDER 2 (zig-zag) orders each
// step's FFMAs so that consecutive ones share an operand at row ends too: ptxas
// then marks more operand reuse, and the kernel ran 1-1.5% faster than row by row.
// UNR < BK unrolls the k-steps partly (less code; measured slower). MIDBAR moves the
// barrier half a k-tile in (see the loop): the fused products run 3% faster with it
// and four stages; the plain GEMM the same.
//
// Fused products (FUSED, descriptor layout as gemm_tiled's; at most two terms per
// operand, the first with coefficient +1, which the planner checks): a k-contiguous
// operand loads every term into registers and stores their sum; an m- (n-) contiguous
// one copies term 2 into a second buffer of the stage, and once the stage has landed
// (half a k-tile before the barrier) each thread adds the vectors it copied (X + dY).
// M is added
// into NC blocks of C from registers (first writes store).
//
// Requires 16-byte vectors on both operands (the planner copies unaligned ones or
// takes gemm_tiled). Edges as gemm_tiled's: rows (columns) past the matrix read its
// last one (clamp_start), a partial last k-tile zero-fills (cp.async src-size 0, or
// the guarded register path).
template <bool A_K, bool B_K, int BK, int STAGES, int UNR = BK, int ORDER = 0, int NA = 1,
          int NB = 1, int NC = 1, bool FUSED = false, bool MIDBAR = false>
__global__ void __launch_bounds__(GEMM_THREADS, 1)
gemm_pipe(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
          int M, int N, int K, long long lda, long long ldb, long long rsc, long long csc,
          float alpha, float beta, const long long* __restrict__ desc)
{
    constexpr int V = 4, BM = 128, BN = 256, WN = 4;
    constexpr int LDS_A = BM + V, LDS_B = BN + V;
    static_assert(NA >= 1 && NA <= 2 && NB >= 1 && NB <= 2 && NC >= 1 && NC <= 4, "terms");
    static_assert(FUSED || (NA == 1 && NB == 1 && NC == 1), "terms: fused products only");
    // A second buffer per stage for the second term of a cp.async operand.
    constexpr int XA = (!A_K && NA == 2) ? 2 : 1, XB = (!B_K && NB == 2) ? 2 : 1;
    constexpr int A_ST = XA * BK * LDS_A, B_ST = XB * BK * LDS_B;  // floats per stage
    constexpr int LA = BM * BK / V / GEMM_THREADS, LB = BN * BK / V / GEMM_THREADS;
    static_assert(LA * GEMM_THREADS * V == BM * BK && LB * GEMM_THREADS * V == BN * BK, "load split");
    static_assert(STAGES >= 2 && BK % 2 == 0, "pipeline");
    TSM_GEMM_DYN_SMEM(smem_raw);
    float* const As = reinterpret_cast<float*>(smem_raw);
    float* const Bs = As + STAGES * A_ST;

    // Term offsets and signs (fused products): uniform per block.
    const long long* d = FUSED ? desc + (long long)blockIdx.z * DESC_LEN : nullptr;
    long long a_off = 0, b_off = 0;  // the second term's offset
    bool a_neg = false, b_neg = false;  // the second term's sign
    if constexpr (FUSED) {
        A += d[0];
        B += d[4];
        second_terms<NA, NB>(d, a_off, b_off, a_neg, b_neg);
        // The hybrid launches its products back to back with PDL: the next one may
        // start on SMs this one's last wave leaves idle; it waits before its epilogue
        // (below), the only place it touches what this one writes.
        pdl_launch_dependents();
    }

    int pm, pn;
    tile_coords<BM, BN>((int)blockIdx.x, M, N, pm, pn);
    const int m0 = pm * BM, n0 = pn * BN;
    const int tid = threadIdx.x;

    // Where vector l of this thread sits in the tile (tile_vec, as in gemm_tiled).
    auto a_pos = [&](int l, int& r, int& kk) { tile_vec<A_K, BK, BM, V>(tid + l * GEMM_THREADS, r, kk); };
    auto b_pos = [&](int l, int& c, int& kk) { tile_vec<B_K, BK, BN, V>(tid + l * GEMM_THREADS, c, kk); };
    // Each vector's address at k0 = 0 (rows clamped), and its k in the tile.
    const float* pa[LA];
    const float* pb[LB];
    int ka[LA], kb[LB];
#pragma unroll
    for (int l = 0; l < LA; ++l) {
        int r;
        a_pos(l, r, ka[l]);
        const int gi = clamp_start<A_K, true>(m0 + r, M, V);
        pa[l] = A + (A_K ? (long long)gi * lda + ka[l] : (long long)gi + (long long)ka[l] * lda);
    }
#pragma unroll
    for (int l = 0; l < LB; ++l) {
        int c;
        b_pos(l, c, kb[l]);
        const int gj = clamp_start<B_K, true>(n0 + c, N, V);
        pb[l] = B + (B_K ? (long long)kb[l] + (long long)gj * ldb : (long long)kb[l] * ldb + gj);
    }
    const long long sa = A_K ? 1 : lda, sb = B_K ? 1 : ldb;  // k-step of an address

    // Operands contiguous along m / n: cp.async into stage s (tile kt), term t into
    // buffer t of the stage. A vector past K (last k-tile) is zero-filled.
    auto issue_direct = [&](int s, int kt) {
        const int k0 = kt * BK;
        if constexpr (!A_K) {
#pragma unroll
            for (int t = 0; t < NA; ++t)
#pragma unroll
                for (int l = 0; l < LA; ++l) {
                    int r, kk;
                    a_pos(l, r, kk);
                    const bool ok = k0 + kk < K;
                    cp_async<16>(As + s * A_ST + (t * BK + kk) * LDS_A + r,
                         ok ? pa[l] + (long long)k0 * sa + (t ? a_off : 0) : A, ok);
                }
        }
        if constexpr (!B_K) {
#pragma unroll
            for (int t = 0; t < NB; ++t)
#pragma unroll
                for (int l = 0; l < LB; ++l) {
                    int c, kk;
                    b_pos(l, c, kk);
                    const bool ok = k0 + kk < K;
                    cp_async<16>(Bs + s * B_ST + (t * BK + kk) * LDS_B + c,
                         ok ? pb[l] + (long long)k0 * sb + (t ? b_off : 0) : B, ok);
                }
        }
    };
    // X + dY for the cp.async operands of stage s, on the vectors this thread copied
    // (landed: after cp_wait; no other thread touches them before the barrier).
    auto sum_direct = [&](int s) {
        auto add = [](float* x, const float* y, bool ng) {
            float4 u = *reinterpret_cast<const float4*>(x);
            const float4 w = *reinterpret_cast<const float4*>(y);
            if (ng) { u.x -= w.x; u.y -= w.y; u.z -= w.z; u.w -= w.w; }
            else { u.x += w.x; u.y += w.y; u.z += w.z; u.w += w.w; }
            *reinterpret_cast<float4*>(x) = u;
        };
        if constexpr (!A_K && NA == 2) {
#pragma unroll
            for (int l = 0; l < LA; ++l) {
                int r, kk;
                a_pos(l, r, kk);
                float* x = As + s * A_ST + kk * LDS_A + r;
                add(x, x + BK * LDS_A, a_neg);
            }
        }
        if constexpr (!B_K && NB == 2) {
#pragma unroll
            for (int l = 0; l < LB; ++l) {
                int c, kk;
                b_pos(l, c, kk);
                float* x = Bs + s * B_ST + kk * LDS_B + c;
                add(x, x + BK * LDS_B, b_neg);
            }
        }
    };
    constexpr bool SUM_DIRECT = (!A_K && NA == 2) || (!B_K && NB == 2);
    // Operands contiguous along k: a register stage (every term), stored transposed.
    float4 ra[A_K ? NA : 1][A_K ? LA : 1], rb[B_K ? NB : 1][B_K ? LB : 1];
    auto load_regs = [&](int kt) {
        const int k0 = kt * BK;
        const bool guard = k0 + BK > K;  // block-uniform: the last, partial k-tile
        auto ld = [&](const float* p, int gk) {
            if (!guard) return ldv<float>(p);
            float e[V];
#pragma unroll
            for (int j = 0; j < V; ++j) e[j] = gk + j < K ? __ldg(p + j) : 0.f;
            return make_float4(e[0], e[1], e[2], e[3]);
        };
        if constexpr (A_K) {
#pragma unroll
            for (int t = 0; t < NA; ++t)
#pragma unroll
                for (int l = 0; l < LA; ++l) ra[t][l] = ld(pa[l] + k0 + (t ? a_off : 0), k0 + ka[l]);
        }
        if constexpr (B_K) {
#pragma unroll
            for (int t = 0; t < NB; ++t)
#pragma unroll
                for (int l = 0; l < LB; ++l) rb[t][l] = ld(pb[l] + k0 + (t ? b_off : 0), k0 + kb[l]);
        }
    };
    auto term_sum = [](const float4 (&x)[2], int n, bool ng, int j) {
        const float* u = reinterpret_cast<const float*>(&x[0]);
        if (n == 1) return u[j];
        const float* w = reinterpret_cast<const float*>(&x[1]);
        return ng ? u[j] - w[j] : u[j] + w[j];
    };
    auto store_regs = [&](int s) {
        if constexpr (A_K) {
#pragma unroll
            for (int l = 0; l < LA; ++l) {
                int r, kk;
                a_pos(l, r, kk);
                float4 x[2] = {ra[0][l], ra[NA - 1][l]};
#pragma unroll
                for (int j = 0; j < V; ++j) As[s * A_ST + (kk + j) * LDS_A + r] = term_sum(x, NA, a_neg, j);
            }
        }
        if constexpr (B_K) {
#pragma unroll
            for (int l = 0; l < LB; ++l) {
                int c, kk;
                b_pos(l, c, kk);
                float4 x[2] = {rb[0][l], rb[NB - 1][l]};
#pragma unroll
                for (int j = 0; j < V; ++j) Bs[s * B_ST + (kk + j) * LDS_B + c] = term_sum(x, NB, b_neg, j);
            }
        }
    };

    const int lane = tid & 31, warp = tid >> 5;
    constexpr int TX = BN / (WN * V), WX = TX / 8;
    const int ty = (warp / WX) * 4 + (lane >> 3);
    const int tx = (warp % WX) * 8 + (lane & 7);

    float acc[2 * V][WN * V];
#pragma unroll
    for (int i = 0; i < 2 * V; ++i)
#pragma unroll
        for (int j = 0; j < WN * V; ++j) acc[i][j] = 0.f;

    const int KT = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) issue_direct(s, s);
        cp_async_commit();
    }
    if (KT > 0) {
        load_regs(0);
        store_regs(0);
    }
    if (KT > 1) load_regs(1);
    cp_async_wait<STAGES - 2>();
    if constexpr (SUM_DIRECT) {
        if (KT > 0) sum_direct(0);
    }
    __syncthreads();

    float a[2][2 * V], b[2][WN * V];
    auto frag = [&](int buf, const float* as, const float* bs, int kk) {
        wide_frag<BM, BN, WN, LDS_A, LDS_B>(a[buf], b[buf], as, bs, kk, ty, tx);
    };
    // One k-step's FFMAs on fragment buffer f.
    auto step = [&](int f) { wide_step<ORDER>(acc, a[f], b[f]); };

    if constexpr (!MIDBAR) {
        for (int kt = 0; kt < KT; ++kt) {
            const int s = kt % STAGES;
            // Stage (kt - 1) % STAGES was computed in step kt - 1, before the barrier.
            if (kt + STAGES - 1 < KT) issue_direct((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
            cp_async_commit();
            const float* as = As + s * A_ST;
            const float* bs = Bs + s * B_ST;
            frag(0, as, bs, 0);
#pragma unroll UNR
            for (int kk = 0; kk < BK; ++kk) {
                if (kk + 1 < BK) frag((kk + 1) & 1, as, bs, kk + 1);
                step(kk & 1);
                if (kk == BK / 2 - 1) {
                    // Tile kt + 1 into its stage, last read in step kt + 1 - STAGES (done:
                    // a barrier lies between), then tile kt + 2's loads.
                    if (kt + 1 < KT) store_regs((kt + 1) % STAGES);
                    if (kt + 2 < KT) load_regs(kt + 2);
                    // Fused: tile kt + 1's cp.async terms summed here, half a k-tile before
                    // the barrier, so that the other warps' FFMAs hide the reads.
                    if constexpr (SUM_DIRECT) {
                        cp_async_wait<STAGES - 2>();
                        if (kt + 1 < KT) sum_direct((kt + 1) % STAGES);
                    }
                }
            }
            cp_async_wait<STAGES - 2>();  // this thread's copies of tile kt + 1 have landed
            __syncthreads();
        }
    } else {
        // MIDBAR: the barrier sits half a k-tile in, right after tile kt + 1 is stored
        // (register stage) and has landed (cp.async, waited for here), so that the
        // last k-step of tile kt reads tile kt + 1's first fragments (no exposed
        // fragment read after a barrier), and the cp.async prefetch of tile
        // kt + STAGES - 1 goes out right after it, into the stage of tile kt - 1,
        // which every thread has finished by then. Groups committed before the wait
        // of step kt: tiles 0 .. kt + STAGES - 2, of which tile kt + 1 must be in:
        // STAGES - 3 may stay pending (STAGES >= 3).
        static_assert(!MIDBAR || STAGES >= 3, "MIDBAR: three stages or more");
        if (KT > 0) frag(0, As, Bs, 0);
        int s = 0;  // stage of tile kt
        for (int kt = 0; kt < KT; ++kt) {
            const int sn = s + 1 == STAGES ? 0 : s + 1;  // tile kt + 1
            const int sp = s == 0 ? STAGES - 1 : s - 1;  // tile kt - 1, then kt + STAGES - 1
            const float* as = As + s * A_ST;
            const float* bs = Bs + s * B_ST;
#pragma unroll UNR
            for (int kk = 0; kk < BK; ++kk) {
                if (kk + 1 < BK) frag((kk + 1) & 1, as, bs, kk + 1);
                else if (kt + 1 < KT) frag(0, As + sn * A_ST, Bs + sn * B_ST, 0);
                step(kk & 1);
                if (kk == BK / 2 - 1) {
                    if (kt + 1 < KT) store_regs(sn);
                    cp_async_wait<STAGES - 3>();
                    if constexpr (SUM_DIRECT) {
                        if (kt + 1 < KT) sum_direct(sn);
                    }
                    __syncthreads();
                    if (kt + STAGES - 1 < KT) issue_direct(sp, kt + STAGES - 1);
                    cp_async_commit();
                    if (kt + 2 < KT) load_regs(kt + 2);
                }
            }
            s = sn;
        }
        cp_async_wait<0>();
    }

    if constexpr (FUSED) pdl_wait();  // the previous product's C blocks are written
    store_block<float, BM, BN, WN, NC, FUSED, true>(acc, C, d, M, N, m0, n0, ty, tx, rsc, csc,
                                                    alpha, beta);
}

// gemm_ws<NA, NB, NC, FUSED, STAGES>: gemm_pipe's 128 x 256 tile and compute loop with
// the loads taken out of the compute warps (warp specialization). Two consumer
// warpgroups (threads 0-255, gemm_pipe's thread layout and FFMA order) only read
// fragments and issue FFMAs; a producer warpgroup (threads 256-383) fills the STAGES
// shared-memory stages: A (contiguous along k) through registers, its terms summed
// and transposed into the k-major tile; B (contiguous along n) by cp.async, a second
// term into a second buffer of the stage and summed there. Named barriers pair them:
// FULL[s] (the producers arrive once stage s holds its tile, the consumers wait) and
// EMPTY[s] (the consumers arrive when done with it, the producers wait before
// refilling it). Registers: setmaxnreg moves them to the consumers (RC a thread)
// from the producers (see WS_CONSUMER_REGS); that needs sm_90a (`__CUDA_ARCH_FEAT_SM90_ALL`), and
// without it the kernel compiles but spills (the launcher runs it on sm_90a only).
//
// Why: in gemm_pipe every warp runs its share of the loads, stores and (fused
// products) operand sums between its FFMAs, and the per-tile barrier keeps the
// warps of a scheduler in step, so the fixed-latency waits of that code do not hide
// (Nsight Compute, H100: issue slots 81% busy, cuBLAS 91%); and a fused
// product's second terms cost the compute warps 6-27%.
//
// Layout: A contiguous along k, B contiguous along n (C-ordered operands, 16-byte
// vectors; the launcher checks); the plain product also B contiguous along k
// (B_K: through registers, stored transposed; RC 208). A contiguous along m stays on
// gemm_pipe: a cp.async path for it spilled 8-16 bytes at every register split. Rows and columns past M, N read the last row
// (vector) and are not stored; with KPART a partial last k-tile is zero-filled
// (A's vectors by guarded scalar loads, B's rows by cp.async of size 0), without it
// K is a multiple of BK. One block per SM.
#ifndef TSM_HOST_BUILD
constexpr int WS_THREADS = 384;
// The block starts at 168 registers a thread (65536 / 384, rounded down to 8); what
// the producer warpgroup gives back must cover what the two consumer warpgroups
// take, or setmaxnreg.inc waits forever: 128 (168 - P) >= 256 (C - 168), so P =
// 168 - 2 (C - 168). The template's RC is C: 224 (P = 56) for the plain product;
// the fused ones take 216 (P = 72), where the producers of products with two terms
// in both operands stop spilling (24 bytes at 224; those ran 28-31% over the plain
// launch against 8-10% at 216: H100).
constexpr int WS_CONSUMER_REGS = 224;
__device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "n"(WS_THREADS) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "n"(WS_THREADS) : "memory");
}
template <int R>
__device__ __forceinline__ void regs_inc() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void regs_dec() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(R));
#endif
}

template <int NA = 1, int NB = 1, int NC = 1, bool FUSED = false, int STAGES = 4,
          int RC = WS_CONSUMER_REGS, bool KPART = false, bool B_K = false>
__global__ void __launch_bounds__(WS_THREADS, 1)
gemm_ws(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
        int M, int N, int K, long long lda, long long ldb, long long rsc, long long csc,
        float alpha, float beta, const long long* __restrict__ desc)
{
    constexpr int V = 4, BM = 128, BN = 256, BK = 16, WN = 4, PT = WS_THREADS - GEMM_THREADS;
    constexpr int LDS_A = BM + V, LDS_B = BN + V;
    constexpr int A_ST = BK * LDS_A, B_ST = BK * LDS_B;
    constexpr int XB = NB == 2 ? 2 : 1;  // B's second term: a second buffer a stage
    constexpr int RP = 168 - 2 * (RC - 168);  // the producers' registers (see WS_CONSUMER_REGS)
    static_assert(RP >= 24 && RC <= 256 && RC % 8 == 0, "register split");
    constexpr int QA = BM * BK / V / PT, QB = BN * BK / V / PT;  // vectors a producer thread
    static_assert(NA >= 1 && NA <= 2 && NB >= 1 && NB <= 2 && NC >= 1 && NC <= 4, "terms");
    static_assert(FUSED || (NA == 1 && NB == 1 && NC == 1), "terms: fused products only");
    static_assert(2 * STAGES + 1 <= 16, "named barriers");
    static_assert(QA * PT * V == BM * BK && QB * PT * V == BN * BK && PT == 128, "load split");
    static_assert(!B_K || !FUSED, "B contiguous along k: the plain product only");
    TSM_GEMM_DYN_SMEM(smem_raw);
    float* const As = reinterpret_cast<float*>(smem_raw);
    float* const Bs = As + STAGES * A_ST;  // stage s: XB buffers of B_ST

    const long long* d = FUSED ? desc + (long long)blockIdx.z * DESC_LEN : nullptr;
    long long a_off = 0, b_off = 0;
    bool a_neg = false, b_neg = false;
    if constexpr (FUSED) {
        A += d[0];
        B += d[4];
        second_terms<NA, NB>(d, a_off, b_off, a_neg, b_neg);
        pdl_launch_dependents();
    }
    int pm, pn;
    tile_coords<BM, BN>((int)blockIdx.x, M, N, pm, pn);
    const int m0 = pm * BM, n0 = pn * BN;
    const int tid = threadIdx.x;
    // KPART: K need not be a multiple of BK, the last k-tile is zero-filled (a
    // separate instantiation, for the plain product only: with its guards the fused
    // producers with two terms of B spill 8-12 bytes)
    const int KT = KPART ? (K + BK - 1) / BK : K / BK;

    if (tid >= GEMM_THREADS) {
        // ---------------------------------------------------------------- producers
        regs_dec<RP>();
        const int pt = tid - GEMM_THREADS;
        // A: vector pt + PT q of the tile: row pt / 4 + 32 q, k-vector pt % 4 (a
        // row's 64 bytes in one instruction). B: vector pt + PT q: k-row pt / 64 + 2 q,
        // column (pt % 64) V (a warp's 512 bytes contiguous).
        const float* const pa = A + (long long)min(m0 + pt / 4, M - 1) * lda + (pt % 4) * V;
        const int ra0 = pt / 4;
        const int gc = min(n0 + (pt % 64) * V, (N - 1) & ~(V - 1));
        const float* const pb = B + (long long)(pt / 64) * ldb + gc;
        float4 ra[NA][QA];
        auto load_a = [&](int kt) {
            const bool guard = KPART && kt * BK + BK > K;  // the partial last k-tile (uniform)
            const int kv = kt * BK + (pt % 4) * V;  // this thread's vector's first k
#pragma unroll
            for (int t = 0; t < NA; ++t)
#pragma unroll
                for (int q = 0; q < QA; ++q) {
                    // rows past M: the last row (clamped per q; pa's row is clamped too)
                    const long long dr = min(m0 + ra0 + 32 * q, M - 1) - min(m0 + ra0, M - 1);
                    const float* p = pa + dr * lda + (long long)kt * BK + (t ? a_off : 0);
                    if (!guard) {
                        ra[t][q] = ldv<float>(p);
                    } else {
                        float e[V];
#pragma unroll
                        for (int j = 0; j < V; ++j) e[j] = kv + j < K ? __ldg(p + j) : 0.f;
                        ra[t][q] = make_float4(e[0], e[1], e[2], e[3]);
                    }
                }
        };
        auto store_a = [&](int s) {
            float* const as = As + s * A_ST;
#pragma unroll
            for (int q = 0; q < QA; ++q) {
                float4 x = ra[0][q];
                if constexpr (NA == 2) {
                    const float4 y = ra[NA - 1][q];
                    if (a_neg) { x.x -= y.x; x.y -= y.y; x.z -= y.z; x.w -= y.w; }
                    else { x.x += y.x; x.y += y.y; x.z += y.z; x.w += y.w; }
                }
                const int r = ra0 + 32 * q, k = (pt % 4) * V;
                as[(k + 0) * LDS_A + r] = x.x;
                as[(k + 1) * LDS_A + r] = x.y;
                as[(k + 2) * LDS_A + r] = x.z;
                as[(k + 3) * LDS_A + r] = x.w;
            }
        };
        const int bo = (pt / 64) * LDS_B + (pt % 64) * V;  // this thread's vector in a stage
        auto issue_b = [&](int s, int kt) {
            float* const bs = Bs + s * XB * B_ST + bo;
#pragma unroll
            for (int t = 0; t < NB; ++t)
#pragma unroll
                for (int q = 0; q < QB; ++q) {
                    const bool ok = !KPART || kt * BK + 2 * q + pt / 64 < K;  // past K: zeros
                    cp_async<16>(bs + t * B_ST + 2 * q * LDS_B,
                         ok ? pb + (long long)(kt * BK + 2 * q) * ldb + (t ? b_off : 0) : B, ok);
                }
        };
        auto sum_b = [&](int s) {
            if constexpr (NB == 2) {
                float* const bs = Bs + s * XB * B_ST + bo;
#pragma unroll 2
                for (int q = 0; q < QB; ++q) {  // (unrolled fully, 64 registers spill)
                    float4* x = reinterpret_cast<float4*>(bs + 2 * q * LDS_B);
                    const float4 y = *reinterpret_cast<const float4*>(bs + B_ST + 2 * q * LDS_B);
                    float4 u = *x;
                    if (b_neg) { u.x -= y.x; u.y -= y.y; u.z -= y.z; u.w -= y.w; }
                    else { u.x += y.x; u.y += y.y; u.z += y.z; u.w += y.w; }
                    *x = u;
                }
            }
        };
        // B contiguous along k (plain product): through registers (vector pt + PT q:
        // column pt / 4 + 32 q, k-vector pt % 4), stored transposed as A is.
        float4 rb[B_K ? QB : 1];
        auto load_bk = [&](int kt) {
            if constexpr (B_K) {
                const bool guard = KPART && kt * BK + BK > K;
                const int kv = kt * BK + (pt % 4) * V;
#pragma unroll
                for (int q = 0; q < QB; ++q) {
                    const float* p = B + (long long)min(n0 + pt / 4 + 32 * q, N - 1) * ldb + kv;
                    if (!guard) {
                        rb[q] = ldv<float>(p);
                    } else {
                        float e[V];
#pragma unroll
                        for (int j = 0; j < V; ++j) e[j] = kv + j < K ? __ldg(p + j) : 0.f;
                        rb[q] = make_float4(e[0], e[1], e[2], e[3]);
                    }
                }
            }
        };
        auto store_bk = [&](int s) {
            if constexpr (B_K) {
                float* const bs = Bs + s * XB * B_ST;
#pragma unroll
                for (int q = 0; q < QB; ++q) {
                    const int c = pt / 4 + 32 * q, k = (pt % 4) * V;
                    bs[(k + 0) * LDS_B + c] = rb[q].x;
                    bs[(k + 1) * LDS_B + c] = rb[q].y;
                    bs[(k + 2) * LDS_B + c] = rb[q].z;
                    bs[(k + 3) * LDS_B + c] = rb[q].w;
                }
            }
        };
        if (KT > 0) {
            if constexpr (!B_K) issue_b(0, 0);
            cp_async_commit();
            load_a(0);
            if constexpr (B_K) load_bk(0);
        }
        for (int kt = 0; kt < KT; ++kt) {
            const int s = kt % STAGES;
            // Tile kt + 1's B (cp.async) into its stage (free once the consumers are
            // done with tile kt + 1 - STAGES), so that its copy overlaps this tile's
            // work.
            if (kt + 1 < KT) {
                const int s1 = (kt + 1) % STAGES;
                if (kt + 1 >= STAGES) named_sync(1 + STAGES + s1);
                if constexpr (!B_K) issue_b(s1, kt + 1);
            }
            cp_async_commit();
            // Tile kt: B's sums first (its copies, this thread's, have landed), then A
            // from registers, so that A's loads (issued at the end of step kt - 1) have
            // the sums' time to arrive: 1-3% faster than A first for the fused products
            // (H100).
            cp_async_wait<1>();
            sum_b(s);
            store_a(s);
            if constexpr (B_K) store_bk(s);
            named_arrive(1 + s);
            if (kt + 1 < KT) {
                load_a(kt + 1);
                if constexpr (B_K) load_bk(kt + 1);
            }
        }
        return;
    }

    // -------------------------------------------------------------------- consumers
    regs_inc<RC>();
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int TX = BN / (WN * V), WX = TX / 8;
    const int ty = (warp / WX) * 4 + (lane >> 3);
    const int tx = (warp % WX) * 8 + (lane & 7);
    float acc[2 * V][WN * V];
#pragma unroll
    for (int i = 0; i < 2 * V; ++i)
#pragma unroll
        for (int j = 0; j < WN * V; ++j) acc[i][j] = 0.f;
    float a[2][2 * V], b[2][WN * V];
    auto frag = [&](int buf, const float* as, const float* bs, int kk) {
        wide_frag<BM, BN, WN, LDS_A, LDS_B>(a[buf], b[buf], as, bs, kk, ty, tx);
    };
    auto step = [&](int f) { wide_step<2>(acc, a[f], b[f]); };  // gemm_pipe's ORDER 2
    for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        const float* as = As + s * A_ST;
        const float* bs = Bs + s * XB * B_ST;
        named_sync(1 + s);
        frag(0, as, bs, 0);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            if (kk + 1 < BK) frag((kk + 1) & 1, as, bs, kk + 1);
            step(kk & 1);
        }
        if (kt + STAGES < KT) named_arrive(1 + STAGES + s);
    }
    if constexpr (FUSED) pdl_wait();
    store_block<float, BM, BN, WN, NC, FUSED, true>(acc, C, d, M, N, m0, n0, ty, tx, rsc, csc,
                                                    alpha, beta);
}
#endif  // TSM_HOST_BUILD

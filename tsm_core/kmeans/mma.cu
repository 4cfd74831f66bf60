// k-means assignment on the tensor cores: nearest centre of every row with the
// distances kept in registers (never written to memory), for float32 rows (TF32
// products) and 16-bit rows (bfloat16 or float16 products), float32 accumulation.
//
//   kmeans_assign_mma   a block owns BM = 128 rows and visits its centre tiles of
//                       BN = 128 in turn: per tile a pipelined GEMM (cp.async ring
//                       of STAGES slabs of 32 words per row, mma.sync) and an
//                       epilogue that folds the tile's distances into each row's
//                       running (best, second, third) values and (best, second)
//                       indices. Four warps as 2 x 2, a warp tile of 64 x 64.
//   kmeans_mma_merge    the rows' results from G blocks that split the centres
//                       (large d: the G blocks of a row tile run together and read
//                       X's tile once from DRAM between them).
//   kmeans_pair_decide  float64 decision between two centres for the rows the margin
//                       rule sent back (float32 rows).
//   kmeans_full_decide  float64 decision against every centre for the rows whose
//                       three best lie within the bound.
//   kmeans_exact_mind   exact distances of rows to their labels' centres.
//
// Word view: a row is read as 32-bit words (one float, or two 16-bit values), so
// that both m16n8k8 (TF32) and m16n8k16 (16-bit) read their fragments at words
// (g, t) and (g, t + 4) of 8-word steps: with rows LDS = 36 words apart the 32
// lanes hit 32 distinct banks.
//
// Distances are d_j = ||c'_j||^2 - 2 x'.c'_j (+ ||x'||^2 for the distance itself),
// x' = x - mu and c' = c - mu for a shift mu (float32 rows: the mean of the centres,
// subtracted here as the fragments are read; 16-bit rows: stored shifted by the
// caller). The shift leaves distances unchanged and shrinks the products' rounding,
// which scales with ||x'|| ||c'||.
//
// Margin rule (MARGIN = 1, float32 rows): with B = ea cm ||x'|| + eb cm^2 (cm^2 =
// max_j ||c'_j||^2, from kmeans_mma_centres) a bound on twice the largest error of a
// computed d_j (the launcher derives ea and eb: docs/guide/kmeans.md), a row is
// certain when d_second - d_best > B; when d_third - d_best > B only its two best
// centres can be nearest (a pair: decided in float64 by kmeans_pair_decide), else
// it goes to the full list (decided in float64 by kmeans_full_decide). Flagged rows are
// not written here: their labels and distances come from those decisions.
#include "common.cuh"

#define MMA_BM 128
#define MMA_BN 128
#define MMA_KW 32                // words of a row per pipeline slab
#define MMA_LDS (MMA_KW + 4)     // shared row stride in words (conflict-free fragments)
#define MMA_THREADS 128

struct Top3 {
    float b1, b2, b3;
    int i1, i2;
};

__device__ __forceinline__ void top_init(Top3& s) {
    s.b1 = s.b2 = s.b3 = __int_as_float(0x7f800000);
    s.i1 = s.i2 = 0x7fffffff;
}

// Insert candidate (v, j); on equal values the smaller index ranks first. FULL = 0
// keeps the best only (no margin rule: b2, b3 and i2 stay unused).
template <int FULL = 1>
__device__ __forceinline__ void top_insert(Top3& s, float v, int j) {
    if constexpr (!FULL) {
        if (v < s.b1 || (v == s.b1 && j < s.i1)) {
            s.b1 = v;
            s.i1 = j;
        }
        return;
    }
    if (v < s.b1 || (v == s.b1 && j < s.i1)) {
        s.b3 = s.b2;
        s.b2 = s.b1;
        s.i2 = s.i1;
        s.b1 = v;
        s.i1 = j;
    } else if (v < s.b2 || (v == s.b2 && j < s.i2)) {
        s.b3 = s.b2;
        s.b2 = v;
        s.i2 = j;
    } else if (v < s.b3) {
        s.b3 = v;
    }
}

// Insert where the thread's candidates come in increasing j (its own columns of
// the tiles, in order): an equal value never ranks above an earlier one, so strict
// comparisons keep the smaller index first without comparing indices.
template <int FULL>
__device__ __forceinline__ void top_push(Top3& s, float v, int j) {
    if constexpr (!FULL) {
        const bool lt = v < s.b1;
        s.b1 = lt ? v : s.b1;
        s.i1 = lt ? j : s.i1;
        return;
    }
    if (v < s.b3) {
        if (v < s.b2) {
            s.b3 = s.b2;
            if (v < s.b1) {
                s.b2 = s.b1;
                s.i2 = s.i1;
                s.b1 = v;
                s.i1 = j;
            } else {
                s.b2 = v;
                s.i2 = j;
            }
        } else {
            s.b3 = v;
        }
    }
}

template <int FULL = 1>
__device__ __forceinline__ void top_merge(Top3& s, const Top3& o) {
    top_insert<FULL>(s, o.b1, o.i1);
    if constexpr (FULL) {
        top_insert(s, o.b2, o.i2);
        top_insert(s, o.b3, 0x7fffffff);  // cannot rank above o.b2 once that is in
    }
}

__device__ __forceinline__ Top3 top_shfl_xor(const Top3& s, int m) {
    Top3 o;
    o.b1 = __shfl_xor_sync(0xffffffffu, s.b1, m);
    o.b2 = __shfl_xor_sync(0xffffffffu, s.b2, m);
    o.b3 = __shfl_xor_sync(0xffffffffu, s.b3, m);
    o.i1 = __shfl_xor_sync(0xffffffffu, s.i1, m);
    o.i2 = __shfl_xor_sync(0xffffffffu, s.i2, m);
    return o;
}

__device__ __forceinline__ unsigned tf32_rna(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// ldmatrix.x4: four 8 x 8 matrices of 16-bit values (8 x 4 words); lane l gives the
// shared address of row l % 8 of matrix l / 8 and gets word (l / 4, l % 4) of each.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
#if __CUDA_ARCH__ >= 750
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#else
    r[0] = r[1] = r[2] = r[3] = addr;  // never launched below sm_80
#endif
}

// 16-bit value (low or high half of a word) as float
template <int TIN>
__device__ __forceinline__ float half_to_float(unsigned short h) {
    if constexpr (TIN == 1) {
        return __uint_as_float(((unsigned)h) << 16);  // bfloat16: the top half of a float
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
        return f;
    }
}

template <int TIN>
__device__ __forceinline__ void mma_16x8(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
    if constexpr (TIN == 0) {
        asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else if constexpr (TIN == 1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#else
    d[0] += __uint_as_float(a[0]) * __uint_as_float(b0);  // never launched below sm_80
#endif
}

// One 16-byte chunk of a slab: `bytes` (0..16) valid bytes at src, zeros after. A
// full chunk is one 16-byte copy; an edge chunk (the end of a row) copies only its
// valid 4-byte words, so no copy reaches past the row's last element, which may be
// the last of its allocation.
__device__ __forceinline__ void slab_copy(unsigned* dst, const unsigned* src, int bytes) {
    if (bytes >= 16) {
        cp_async<16>(dst, src, 16);
        return;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int b = bytes - 4 * q;
        cp_async<4>(dst + q, b > 0 ? (const void*)(src + q) : (const void*)src, b > 0 ? (b < 4 ? b : 4) : 0);
    }
}

// The end of a row: its label, distance and the changed flag, or a place on the
// pair / full list under the margin rule. Returns 1 where the label changed.
template <int MARGIN>
__device__ __forceinline__ int mma_finish(int r, const Top3& s, float xx, float ea, float eb, float cm2,
                                          int* __restrict__ labels, float* __restrict__ mind,
                                          const int* prev, int* __restrict__ lists, int* __restrict__ counts,
                                          int cap) {
    if constexpr (MARGIN) {
        const float B = fmaf(ea * sqrtf(cm2), sqrtf(fmaxf(xx, 0.f)), eb * cm2);
        if (!(s.b2 - s.b1 > B)) {
            if (s.b3 - s.b1 > B) {
                const int e = atomicAdd(counts, 1);  // a pair: rows [0, cap) of lists
                if (e < cap) {
                    lists[3 * e] = r;
                    lists[3 * e + 1] = s.i1;
                    lists[3 * e + 2] = s.i2;
                }
            } else {
                const int e = atomicAdd(counts + 1, 1);  // full list: after the pairs
                if (e < cap) lists[3 * cap + e] = r;
            }
            return 0;
        }
    }
    const int lab = s.i1 == 0x7fffffff ? 0 : s.i1;
    const int old = prev != nullptr ? prev[r] : lab;
    labels[r] = lab;
    mind[r] = fmaxf(xx + s.b1, 0.f);
    return old != lab;
}

// Grid: G * ceil(n / BM) blocks, G consecutive blocks per row tile (block b: row
// tile b / G, centre tiles b % G, b % G + G, ..). X: n rows of dw words, row stride
// ldw words (16-byte aligned), `d` elements per row. Cs: the shifted centres, k rows
// of ldw_c words (zero past d). cn: ||c'_j||^2 (k floats). mu: the shift (float32
// rows: dpad floats, zero past d; unused for 16-bit rows). With G > 1 the block
// writes its rows' Top3 to part[(row * G + g)] and ||x'||^2 to xsq (g = 0); the
// merge kernel finishes them.
template <int TIN, int MARGIN, int STAGES>
__global__ void __launch_bounds__(MMA_THREADS)
kmeans_assign_mma(const unsigned* __restrict__ X, i64 ldw, int n, int d, const unsigned* __restrict__ Cs,
                  int ldw_c, const float* __restrict__ cn, const float* __restrict__ mu, int k, int G,
                  float ea, float eb, const float* __restrict__ cm2, int* labels, float* __restrict__ mind, const int* prev,
                  int* __restrict__ changed, int* __restrict__ lists, int* __restrict__ counts, int cap,
                  Top3* __restrict__ part, float* __restrict__ xsq) {
    constexpr int EPW = TIN == 0 ? 1 : 2;  // elements per word
    extern __shared__ __align__(16) unsigned smem[];
    unsigned* Xs = smem;                                  // [STAGES][BM][LDS]
    unsigned* Ws = smem + STAGES * MMA_BM * MMA_LDS;      // [STAGES][BN][LDS]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    const int g = lane >> 2, t = lane & 3;
    const int rt = blockIdx.x / G, grp = blockIdx.x % G;
    const int r0 = rt * MMA_BM;
    const int dw = (d + EPW - 1) / EPW;
    const int nk = (dw + MMA_KW - 1) / MMA_KW;
    const int ntile = (k + MMA_BN - 1) / MMA_BN;
    const int ntl = ntile > grp ? (ntile - grp + G - 1) / G : 0;  // this block's centre tiles
    const int total = ntl * nk;

    // One slab: X rows r0.. and centres of tile jt, words kc*32 .. +32 (16-byte copies,
    // zero-filled past n, k and d).
    auto load = [&](int s, int buf) {
        const int jt = grp + (s / nk) * G, kc = s % nk;
        const int w0 = kc * MMA_KW;
        unsigned* xs = Xs + buf * MMA_BM * MMA_LDS;
        unsigned* ws = Ws + buf * MMA_BN * MMA_LDS;
#pragma unroll
        for (int i = 0; i < (MMA_BM * MMA_KW / 4) / MMA_THREADS; ++i) {
            const int c = tid + i * MMA_THREADS;
            const int row = c >> 3, q = c & 7;
            const int w = w0 + q * 4;
            const int e = w * EPW;  // first element of the chunk
            int bytes = (d - e) * (4 / EPW);
            bytes = bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes);
            const int rr = r0 + row;
            slab_copy(xs + row * MMA_LDS + q * 4, X + (i64)(rr < n ? rr : 0) * ldw + w, rr < n ? bytes : 0);
        }
#pragma unroll
        for (int i = 0; i < (MMA_BN * MMA_KW / 4) / MMA_THREADS; ++i) {
            const int c = tid + i * MMA_THREADS;
            const int row = c >> 3, q = c & 7;
            const int w = w0 + q * 4;
            const int e = w * EPW;
            int bytes = (d - e) * (4 / EPW);
            bytes = bytes < 0 ? 0 : (bytes > 16 ? 16 : bytes);
            const int cc = jt * MMA_BN + row;
            slab_copy(ws + row * MMA_LDS + q * 4, Cs + (i64)(cc < k ? cc : 0) * ldw_c + w, cc < k ? bytes : 0);
        }
    };

    float acc[4][8][4];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.f;
    Top3 top[4][2];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        top_init(top[mi][0]);
        top_init(top[mi][1]);
    }
    float xs2[4][2];
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) xs2[mi][0] = xs2[mi][1] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < total) load(s, s);
        cp_async_commit();
    }
    for (int s = 0; s < total; ++s) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        {
            const int sn = s + STAGES - 1;
            if (sn < total) load(sn, sn % STAGES);
            cp_async_commit();
        }
        const int buf = s % STAGES;
        // ldmatrix.x4 addresses: lane l gives row l % 8 of matrix l / 8; A's matrices are
        // (rows +0 / +8) x (words +0 / +4), B's (words +0 / +4) x (centres +0 / +8).
        const int lr = lane & 7, lm = lane >> 3;
        const unsigned xa = smem_u32(Xs + buf * MMA_BM * MMA_LDS +
                                     (wm * 64 + lr + (lm & 1) * 8) * MMA_LDS + (lm >> 1) * 4);
        const unsigned wa = smem_u32(Ws + buf * MMA_BN * MMA_LDS +
                                     (wn * 64 + lr + (lm >> 1) * 8) * MMA_LDS + (lm & 1) * 4);
        const int kc = s % nk;
        const bool norms = wn == 0 && s < nk;  // the first centre tile: ||x'||^2 on the side
#pragma unroll 2
        for (int kk = 0; kk < MMA_KW / 8; ++kk) {
            unsigned a[4][4], b[8][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) ldsm_x4(a[mi], xa + (mi * 16 * MMA_LDS + kk * 8) * 4);
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                unsigned r[4];
                ldsm_x4(r, wa + (np * 16 * MMA_LDS + kk * 8) * 4);
                b[2 * np][0] = r[0];
                b[2 * np][1] = r[1];
                b[2 * np + 1][0] = r[2];
                b[2 * np + 1][1] = r[3];
            }
            if constexpr (TIN == 0) {
                // x' = x - mu (the MMA reads x' truncated to TF32); fragment words are
                // (row g | g + 8, column t | t + 4) of the step.
                const int col = kc * MMA_KW + kk * 8 + t;
                const float m0 = __ldg(mu + col), m1 = __ldg(mu + col + 4);
#pragma unroll
                for (int mi = 0; mi < 4; ++mi) {
                    const float v0 = __uint_as_float(a[mi][0]) - m0, v1 = __uint_as_float(a[mi][1]) - m0;
                    const float v2 = __uint_as_float(a[mi][2]) - m1, v3 = __uint_as_float(a[mi][3]) - m1;
                    a[mi][0] = __float_as_uint(v0);
                    a[mi][1] = __float_as_uint(v1);
                    a[mi][2] = __float_as_uint(v2);
                    a[mi][3] = __float_as_uint(v3);
                    if (norms) {
                        xs2[mi][0] = fmaf(v0, v0, fmaf(v2, v2, xs2[mi][0]));
                        xs2[mi][1] = fmaf(v1, v1, fmaf(v3, v3, xs2[mi][1]));
                    }
                }
            } else if (norms) {
#pragma unroll
                for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const float lo = half_to_float<TIN>((unsigned short)(a[mi][q] & 0xffffu));
                        const float hi = half_to_float<TIN>((unsigned short)(a[mi][q] >> 16));
                        xs2[mi][q & 1] = fmaf(lo, lo, fmaf(hi, hi, xs2[mi][q & 1]));
                    }
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni) mma_16x8<TIN>(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
        if (kc == nk - 1) {  // the tile's distances into the running minima
            const int jt = grp + (s / nk) * G;
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) {
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const int j = jt * MMA_BN + wn * 64 + ni * 8 + 2 * t + q;
                    const float cj = j < k ? __ldg(cn + j) : __int_as_float(0x7f800000);
#pragma unroll
                    for (int mi = 0; mi < 4; ++mi) {
                        top_push<MARGIN>(top[mi][0], fmaf(-2.f, acc[mi][ni][q], cj), j);
                        top_push<MARGIN>(top[mi][1], fmaf(-2.f, acc[mi][ni][2 + q], cj), j);
                    }
                }
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 8; ++ni)
#pragma unroll
                    for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.f;
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring is free: reuse it for the cross-warp merge

    // Lanes t = 0..3 share rows: merge them, then the two warps (wn) of a row.
#pragma unroll
    for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            top_merge<MARGIN>(top[mi][h], top_shfl_xor(top[mi][h], 1));
            top_merge<MARGIN>(top[mi][h], top_shfl_xor(top[mi][h], 2));
            xs2[mi][h] += __shfl_xor_sync(0xffffffffu, xs2[mi][h], 1);
            xs2[mi][h] += __shfl_xor_sync(0xffffffffu, xs2[mi][h], 2);
        }
    Top3* red = reinterpret_cast<Top3*>(smem);                     // [2][BM]
    float* xq = reinterpret_cast<float*>(red + 2 * MMA_BM);        // [BM]
    if (t == 0) {
#pragma unroll
        for (int mi = 0; mi < 4; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wm * 64 + mi * 16 + h * 8 + g;
                red[wn * MMA_BM + row] = top[mi][h];
                if (wn == 0) xq[row] = xs2[mi][h];
            }
    }
    __syncthreads();
    int ch = 0;
    {
        const int row = tid;  // MMA_THREADS == MMA_BM
        const int r = r0 + row;
        if (r < n) {
            Top3 s = red[row];
            top_merge<MARGIN>(s, red[MMA_BM + row]);
            const float xx = xq[row];
            if (G == 1) {
                ch = mma_finish<MARGIN>(r, s, xx, ea, eb, MARGIN ? *cm2 : 0.f, labels, mind, prev, lists, counts, cap);
            } else {
                part[(i64)r * G + grp] = s;
                if (grp == 0) xsq[r] = xx;
            }
        }
    }
    if (__syncthreads_or(ch) && tid == 0) *changed = 1;  // one store per block
}

// Rows split over G centre groups: merge their Top3 in group order, then finish.
template <int MARGIN>
__global__ void __launch_bounds__(256)
kmeans_mma_merge(const Top3* __restrict__ part, const float* __restrict__ xsq, int n, int G, float ea,
                 float eb, const float* __restrict__ cm2, int* labels, float* __restrict__ mind, const int* prev, int* __restrict__ changed,
                 int* __restrict__ lists, int* __restrict__ counts, int cap) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    int ch = 0;
    if (r < n) {
        Top3 s = part[(i64)r * G];
        for (int q = 1; q < G; ++q) top_merge<MARGIN>(s, part[(i64)r * G + q]);
        ch = mma_finish<MARGIN>(r, s, xsq[r], ea, eb, MARGIN ? *cm2 : 0.f, labels, mind, prev, lists, counts, cap);
    }
    if (__syncthreads_or(ch) && threadIdx.x == 0) *changed = 1;
}

// The pairs of the margin rule: a warp per pair (row, i1, i2), float64 distances of
// the float32 row to both (unshifted) centres; the smaller wins, the smaller index
// on a tie. Grid-stride up to the pair count, which is read here (no host trip).
__global__ void __launch_bounds__(256)
kmeans_pair_decide(const float* __restrict__ X, i64 ldx, int d, const float* __restrict__ C,
                   const int* __restrict__ lists, const int* __restrict__ counts, int cap, int* labels,
                   float* __restrict__ mind, const int* prev, int* __restrict__ changed) {
    const int lane = threadIdx.x & 31;
    const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int nwarps = (gridDim.x * blockDim.x) >> 5;
    const int np = min(counts[0], cap);
    int ch = 0;
    for (int e = gw; e < np; e += nwarps) {
        const int r = lists[3 * e], i1 = lists[3 * e + 1], i2 = lists[3 * e + 2];
        const float* x = X + (i64)r * ldx;
        const float* c1 = C + (i64)i1 * d;
        const float* c2 = C + (i64)i2 * d;
        double s1 = 0.0, s2 = 0.0;
        for (int l = lane; l < d; l += 32) {
            const double xv = (double)x[l];
            const double u = xv - (double)c1[l], v = xv - (double)c2[l];
            s1 = fma(u, u, s1);
            s2 = fma(v, v, s2);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
            s2 += __shfl_xor_sync(0xffffffffu, s2, o);
        }
        const bool second = s2 < s1 || (s2 == s1 && i2 < i1);
        const int lab = second ? i2 : i1;
        if (lane == 0) {
            const int old = prev != nullptr ? prev[r] : lab;
            labels[r] = lab;
            mind[r] = (float)(second ? s2 : s1);
            ch |= old != lab;
        }
    }
    if (__syncthreads_or(ch) && threadIdx.x == 0) *changed = 1;
}

// The full list of the margin rule (rows whose third-best centre is also within
// the bound): float64 distances by direct differences to every centre; the
// smallest wins, the smaller index on a tie. A block takes FD_ROWS listed rows (two
// a warp) and visits the centres 32 at a time (a lane a centre), d in slabs of
// FD_DK through shared memory, so that a centre slab read from L2 serves FD_ROWS
// rows. Grid-stride over the list up to its count, read here (no host trip).
// Block 0 adds the two list counts to stats (pairs, full; 64-bit), when given.
#define FD_ROWS 16
#define FD_DK 32
__global__ void __launch_bounds__(256)
kmeans_full_decide(const float* __restrict__ X, i64 ldx, int d, const float* __restrict__ C, int k,
                   const int* __restrict__ lists, const int* __restrict__ counts, int cap, int* labels,
                   float* __restrict__ mind, const int* prev, int* __restrict__ changed,
                   unsigned long long* __restrict__ stats) {
    __shared__ float xs[FD_ROWS][FD_DK];
    __shared__ float cs[32][FD_DK + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nf = min(counts[1], cap);
    const int* rows = lists + 3 * (i64)cap;
    int ch = 0;
    for (int g0 = blockIdx.x * FD_ROWS; g0 < nf; g0 += gridDim.x * FD_ROWS) {
        double best0 = __longlong_as_double(0x7ff0000000000000ll), best1 = best0;
        int lab0 = 0, lab1 = 0;
        for (int j0 = 0; j0 < k; j0 += 32) {
            double s0 = 0.0, s1 = 0.0;
            for (int l0 = 0; l0 < d; l0 += FD_DK) {
                __syncthreads();  // the previous slab is consumed
                for (int t = threadIdx.x; t < FD_ROWS * FD_DK; t += 256) {
                    const int rr = t / FD_DK, ll = t % FD_DK, e = g0 + rr;
                    xs[rr][ll] = (e < nf && l0 + ll < d) ? X[(i64)rows[e] * ldx + l0 + ll] : 0.f;
                }
                for (int t = threadIdx.x; t < 32 * FD_DK; t += 256) {
                    const int cc = t / FD_DK, ll = t % FD_DK;
                    cs[cc][ll] = (j0 + cc < k && l0 + ll < d) ? C[(i64)(j0 + cc) * d + l0 + ll] : 0.f;
                }
                __syncthreads();
#pragma unroll 8
                for (int ll = 0; ll < FD_DK; ++ll) {
                    const double c = (double)cs[lane][ll];
                    const double u = (double)xs[2 * warp][ll] - c, v = (double)xs[2 * warp + 1][ll] - c;
                    s0 = fma(u, u, s0);
                    s1 = fma(v, v, s1);
                }
            }
            // The warp's smallest of its 32 centres (smaller index on ties), then the
            // running best: earlier tiles hold smaller indices, so only a strictly
            // smaller value replaces it.
            int j = j0 + lane;
            if (j >= k) s0 = s1 = __longlong_as_double(0x7ff0000000000000ll);
            int ja = j, jb = j;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const double oa = __shfl_xor_sync(0xffffffffu, s0, o), ob = __shfl_xor_sync(0xffffffffu, s1, o);
                const int pa = __shfl_xor_sync(0xffffffffu, ja, o), pb = __shfl_xor_sync(0xffffffffu, jb, o);
                if (oa < s0 || (oa == s0 && pa < ja)) { s0 = oa; ja = pa; }
                if (ob < s1 || (ob == s1 && pb < jb)) { s1 = ob; jb = pb; }
            }
            if (s0 < best0) { best0 = s0; lab0 = ja; }
            if (s1 < best1) { best1 = s1; lab1 = jb; }
        }
        if (lane == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int e = g0 + 2 * warp + h;
                if (e < nf) {
                    const int r = rows[e], lab = h ? lab1 : lab0;
                    const int old = prev != nullptr ? prev[r] : lab;
                    labels[r] = lab;
                    mind[r] = (float)(h ? best1 : best0);
                    ch |= old != lab;
                }
            }
        }
    }
    if (__syncthreads_or(ch) && threadIdx.x == 0) *changed = 1;
    if (stats != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
        stats[0] += (unsigned long long)min(counts[0], cap);
        stats[1] += (unsigned long long)nf;
    }
}

// mind[i] = ||x_i - c_labels[i]||^2 by direct differences (float32 differences of
// the row as stored and the float32 centre, squares summed in float64), a warp a
// row, grid-stride: the exact distances of a fit's final assignment. XT: 0 float32
// rows, 1 float16 rows (bits).
template <int XT>
__global__ void __launch_bounds__(256)
kmeans_exact_mind(const void* __restrict__ Xv, i64 ldx, int n, int d, const float* __restrict__ C,
                  const int* __restrict__ labels, float* __restrict__ mind) {
    const int lane = threadIdx.x & 31;
    const int nw = (gridDim.x * blockDim.x) >> 5;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < n; r += nw) {
        const float* c = C + (i64)labels[r] * d;
        double s = 0.0;
        if constexpr (XT == 0) {
            const float* x = (const float*)Xv + (i64)r * ldx;
            for (int l = lane; l < d; l += 32) {
                const float u = x[l] - c[l];
                s = fma((double)u, (double)u, s);
            }
        } else {
            const unsigned short* x = (const unsigned short*)Xv + (i64)r * ldx;
            for (int l = lane; l < d; l += 32) {
                float xv;
                asm("cvt.f32.f16 %0, %1;\n" : "=f"(xv) : "h"(x[l]));
                const float u = xv - c[l];
                s = fma((double)u, (double)u, s);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) mind[r] = (float)s;
    }
}

// ------------------------------------------------------------------ per-call preparation

// mu[c] = the mean of the centres' column c (float64 sum in centre order), zero for
// c in [d, dpad). A thread per column.
__global__ void kmeans_mma_mu(const float* __restrict__ C, int k, int d, int dpad, float* __restrict__ mu) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dpad) return;
    double s = 0.0;
    if (c < d)
        for (int j = 0; j < k; ++j) s += (double)C[(i64)j * d + c];
    mu[c] = c < d ? (float)(s / k) : 0.f;
}

// Block per centre: its shifted row c' = c - mu in the kernel's word format (float32,
// or two bfloat16 / float16 per word, round to nearest even), zero past d up to ldw_c
// words; cn = ||c'||^2 of the values as stored (float64 tree sum: fixed order); cm2 =
// max over the centres (an integer max on the bits of a non-negative float: the
// same result in any order; *cm2 is zeroed by the launcher).
template <int TIN>
__global__ void __launch_bounds__(128)
kmeans_mma_centres(const float* __restrict__ C, int k, int d, const float* __restrict__ mu,
                   unsigned* __restrict__ Cs, int ldw_c, float* __restrict__ cn, float* __restrict__ cm2) {
    constexpr int EPW = TIN == 0 ? 1 : 2;
    __shared__ double red[128];
    const int j = blockIdx.x, tid = threadIdx.x;
    const float* c = C + (i64)j * d;
    double s = 0.0;
    for (int w = tid; w < ldw_c; w += 128) {
        unsigned word = 0u;
#pragma unroll
        for (int h = 0; h < EPW; ++h) {
            const int e = w * EPW + h;
            if (e < d) {
                const float v = (float)((double)c[e] - (double)mu[e]);
                if constexpr (TIN == 0) {
                    word = tf32_rna(v);  // the MMA reads it exactly
                    const float back = __uint_as_float(word);
                    s += (double)back * (double)back;
                } else {
                    unsigned short b;
                    float back;
                    if constexpr (TIN == 1) {
                        const unsigned u = __float_as_uint(v);
                        b = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
                        back = __uint_as_float(((unsigned)b) << 16);
                    } else {
                        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(b) : "f"(v));
                        asm("cvt.f32.f16 %0, %1;\n" : "=f"(back) : "h"(b));
                    }
                    word |= ((unsigned)b) << (16 * h);
                    s += (double)back * (double)back;
                }
            }
        }
        Cs[(i64)j * ldw_c + w] = word;
    }
    red[tid] = s;
    __syncthreads();
    for (int h = 64; h > 0; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        __syncthreads();
    }
    if (tid == 0) {
        const float v = (float)red[0];
        cn[j] = v;
        atomicMax(reinterpret_cast<int*>(cm2), __float_as_int(v));
    }
}

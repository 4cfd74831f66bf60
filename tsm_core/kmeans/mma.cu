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
//   kmeans_assign_wg    the same for rows of at most 128 words on the warpgroup
//                       MMA (sm_90a), the epilogue beside the next tile's MMAs;
//                       for float32 rows also as three bfloat16 products (TIN = 3:
//                       x' c' ~ xh ch + xh cl + xl ch with x' = xh + xl, c' = ch + cl
//                       split into bfloat16 pairs), 16 bits of each operand at 1.5
//                       times the cost of one TF32 product.
//   kmeans_mma_merge    the rows' results from G blocks that split the centres
//                       (large d: the G blocks of a row tile run together and read
//                       X's tile once from DRAM between them).
//   kmeans_pair_decide  float64 decision between two centres for the rows the margin
//                       rule sent back (float32 rows).
//   kmeans_full_decide  float64 decision against every centre for the rows whose
//                       three best lie within the bound.
//   kmeans_exact_mind   exact distances of rows to their labels' centres.
//   kmeans_long_*       the long-row route (longrows.py): shifted, TF32-rounded rows
//                       (_center) or 16-bit rows' norms (_sqnorm) for cuBLAS's
//                       products, the bfloat16 split of listed rows (_split), and
//                       the fold of the products into each row's best centres (_top).
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
// Screen (MARGIN = 2, TF32 products of float32 rows): each row keeps its best distance
// and index and the second-best distance only (no branch per value); a row with
// d_second - d_best <= B is listed (lists[0, cap), counts[0]) and not written, for
// the caller to assign again with the "float32" kernel (TSM_KMEANS_SCREEN).
#include "common.cuh"
#include "wgmma.cuh"

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
    if constexpr (FULL == 2) {  // best (value, index) and the second value
        const bool lt = v < s.b1;
        s.b2 = fminf(s.b2, fmaxf(s.b1, v));
        s.b1 = lt ? v : s.b1;
        s.i1 = lt ? j : s.i1;
        return;
    }
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
    if constexpr (FULL == 2) {  // the second of the union: the larger best or a second
        const float b2 = fminf(fminf(s.b2, o.b2), fmaxf(s.b1, o.b1));
        top_insert<0>(s, o.b1, o.i1);
        s.b2 = b2;
        return;
    }
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

// Two floats as bfloat16 (round to nearest even), lo in the low half.
__device__ __forceinline__ unsigned bf16x2_rn(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
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
    if constexpr (MARGIN == 2) {
        const float B = fmaf(ea * sqrtf(cm2), sqrtf(fmaxf(xx, 0.f)), eb * cm2);
        if (!(s.b2 - s.b1 > B)) {
            const int e = atomicAdd(counts, 1);
            if (e < cap) lists[e] = r;
            return 0;
        }
    } else if constexpr (MARGIN) {
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

// ------------------------------------------------------------------ wgmma (sm_90a)
// kmeans_assign_wg: the same assignment for short rows (at most 128 words: d <= 128
// float32, d <= 256 16-bit) on the warpgroup MMA. A block of two warpgroups owns 128
// rows; each warp holds its 16 rows' A fragments for the whole row in registers
// (NS k-steps of 8 words, loaded once from global memory, shifted by mu for float32
// rows), so only the centres stream: whole centre tiles (128 centres x NS*8 words,
// the core-matrix layout a no-swizzle K-major descriptor reads) through a STAGES
// ring of cp.async copies. Each warpgroup multiplies its 64 rows by a tile into one
// of two accumulator sets (64 x 128, 64 floats a thread) while it folds the previous
// tile's distances from the other set into its rows' running minima, so the
// epilogue runs beside the tensor cores. (A fold is always of a tile whose MMAs were
// waited for before the next tile's were issued: ptxas serialises the MMAs where an
// accumulator is read while a wait_group<1> might leave its MMA in flight.) Rows are
// finished as in kmeans_assign_mma.
// (The descriptor, fences and waits: include/wgmma.cuh.)

// Keeps the compiler from moving reads or writes of `d` across a point of the
// asynchronous MMA's life.
__device__ __forceinline__ void km_pin(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for A fragments held in registers: a wgmma reads them asynchronously, so
// they must stay live (unmodified, their registers not reused) until its wait.
template <int NS, int NL>
__device__ __forceinline__ void km_pin_frags(unsigned (&a)[NS][4], unsigned (&al)[NL][4]) {
#pragma unroll
    for (int s = 0; s < NS; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[s][i])::"memory");
#pragma unroll
    for (int s = 0; s < NL; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(al[s][i])::"memory");
}

#define KM_WG_D                                                                                       \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),   \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),          \
    "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),        \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),        \
    "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),        \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),        \
    "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),        \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),        \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define KM_WG_DLIST                                                                                   \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
    "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "  \
    "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "  \
    "%59, %60, %61, %62, %63}"

// d (+)= A (64 x one k-step, this warp's 16 rows in a[], the mma.sync A fragment) *
// B (one k-step x 128, K-major in shared memory at descriptor db); acc = 0: d = A B.
template <int TIN>
__device__ __forceinline__ void km_wgmma(float (&d)[64], const unsigned (&a)[4], unsigned long long db, int acc) {
#if defined(TSM_WGMMA)
    if constexpr (TIN == 0) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 " KM_WG_DLIST
                     ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                     : KM_WG_D
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
    } else if constexpr (TIN == 1 || TIN == 3) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " KM_WG_DLIST
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                     : KM_WG_D
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
    } else {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " KM_WG_DLIST
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                     : KM_WG_D
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
    }
#else
    (void)d;
    (void)a;
    (void)db;
    (void)acc;
#endif
}

#define WG_BM 128
#define WG_BN 128
#define WG_THREADS 256

// The tile's distances (accumulators d, centres jt * 128 ..; their squared norms cns
// in shared memory) into the running minima of this thread's rows g and g + 8:
// value (n8, q) is row q / 2, centre n8 * 8 + 2 t + q % 2, so a thread meets its
// centres in increasing order.
template <int MARGIN>
__device__ __forceinline__ void km_fold(const float (&d)[64], int jt, int t, const float* cns, Top3 (&top)[2]) {
#pragma unroll
    for (int n8 = 0; n8 < 16; ++n8)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int jl = n8 * 8 + 2 * t + q;
            const int j = jt * WG_BN + jl;
            const float cj = cns[jl];  // +inf past k
            top_push<MARGIN>(top[0], fmaf(-2.f, d[n8 * 4 + q], cj), j);
            top_push<MARGIN>(top[1], fmaf(-2.f, d[n8 * 4 + 2 + q], cj), j);
        }
}

// Centre tile jt into ring stage buf (PL planes of 128 centres x NS * 8 words, the
// core-matrix layout a no-swizzle K-major descriptor reads: chunk c = (plane, centre
// row, k group) at word p PLANE + ((row / 8) KG + kg) 32 + 4 (row % 8); zeros past k
// and past Cs's row) and its norms (cn holds whole tiles, +inf past k) into slot
// `slot` of their ring after the STAGES stages.
template <int PL, int NS, int STAGES>
__device__ __forceinline__ void km_wg_load(unsigned* smem, const unsigned* __restrict__ Cs, int ldw_c, int ldw_p,
                                           const float* __restrict__ cn, int k, int tid, int jt, int buf, int slot) {
    constexpr int KG = NS * 2;
    constexpr int PLANE = WG_BN * NS * 8;
    constexpr int STAGE = PL * PLANE;
    constexpr int CHUNKS = PL * WG_BN * KG;
#pragma unroll
    for (int i = 0; i < (CHUNKS + WG_THREADS - 1) / WG_THREADS; ++i) {
        const int c = tid + i * WG_THREADS;
        if (CHUNKS % WG_THREADS == 0 || c < CHUNKS) {
            const int p = PL == 1 ? 0 : c / (WG_BN * KG);
            const int cr = PL == 1 ? c : c % (WG_BN * KG);
            const int row = cr / KG, kg = cr % KG;
            const int cc = jt * WG_BN + row;
            const bool ok = cc < k && kg * 4 < ldw_p;
            unsigned* dst = smem + buf * STAGE + p * PLANE + ((row >> 3) * KG + kg) * 32 + (row & 7) * 4;
            cp_async<16>(dst, Cs + (i64)(ok ? cc : 0) * ldw_c + (ok ? p * ldw_p + kg * 4 : 0), ok ? 16 : 0);
        }
    }
    if (tid < WG_BN / 4)
        cp_async<16>(smem + STAGES * STAGE + slot * WG_BN + tid * 4, cn + jt * WG_BN + tid * 4, 16);
}

// One tile's MMAs into acc: this warpgroup's 64 rows (A fragments a, and al, the low
// bfloat16 parts, for float32 rows as three bfloat16 products) by the tile at shared
// address st; committed as one group.
template <int TIN, int NS>
__device__ __forceinline__ void km_wg_mmas(float (&acc)[64], const unsigned (&a)[NS][4],
                                           const unsigned (&al)[TIN == 3 ? NS : 1][4], unsigned st) {
    constexpr int KG = NS * 2;
    constexpr int PLANE = WG_BN * NS * 8;
    constexpr unsigned LBO = 128, SBO = KG * 128;  // bytes between core matrices: k, n
    wg_fence();
    if constexpr (TIN == 3) {
        // per k-step the two small products, then xh ch; one base descriptor plus
        // each step's offset (shared addresses < 256 KiB: the 14-bit field never carries)
        const unsigned long long d0 = wg_desc(st, LBO, SBO);
#pragma unroll
        for (int s = 0; s < NS; ++s) {
            const unsigned long long dh = d0 + (unsigned long long)((s * 2 * LBO) >> 4);
            km_wgmma<TIN>(acc, al[s], dh, s);
            km_wgmma<TIN>(acc, a[s], dh + (unsigned long long)((PLANE * 4) >> 4), 1);
            km_wgmma<TIN>(acc, a[s], dh, 1);
        }
    } else {
#pragma unroll
        for (int s = 0; s < NS; ++s) km_wgmma<TIN>(acc, a[s], wg_desc(st + s * 2 * LBO, LBO, SBO), s);
    }
    wg_commit();
}

// This warp's A fragments of its two rows (ra and ra + 8: words (g | g + 8, t | t + 4)
// of each step), their squared norms added into xs2. word(r, w) gives word w of row
// ra (r = 0) or ra + 8 (r = 1), zero past the row's end or past n: float32 rows are
// shifted by mu (zero past d) and, for TIN 3, split into bfloat16 hi and lo (al);
// RNA (the TF32 screen): TF32 rows rounded to nearest, not truncated by the MMA.
template <int TIN, int NS, bool RNA, typename Word>
__device__ __forceinline__ void km_wg_frags(unsigned (&a)[NS][4], unsigned (&al)[TIN == 3 ? NS : 1][4],
                                            float (&xs2)[2], const float* __restrict__ mu, int t, Word word) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if constexpr (TIN == 3) {
                // elements e, e + 1 of both rows (word t + 4h of the 16-bit step s)
                const int e = s * 16 + 2 * t + 8 * h;
                float v[2][2];
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const float m = __ldg(mu + e + q);  // zero past d
                    v[0][q] = __uint_as_float(word(0, e + q)) - m;
                    v[1][q] = __uint_as_float(word(1, e + q)) - m;
                    xs2[0] = fmaf(v[0][q], v[0][q], xs2[0]);
                    xs2[1] = fmaf(v[1][q], v[1][q], xs2[1]);
                }
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const unsigned hi = bf16x2_rn(v[r][0], v[r][1]);
                    a[s][2 * h + r] = hi;
                    al[s][2 * h + r] = bf16x2_rn(v[r][0] - __uint_as_float(hi << 16),
                                                 v[r][1] - __uint_as_float(hi & 0xffff0000u));
                }
                continue;
            }
            const int w = s * 8 + t + 4 * h;
            unsigned va = word(0, w), vb = word(1, w);
            if constexpr (TIN == 0) {
                const float m = __ldg(mu + w);  // zero past d
                const float xa = __uint_as_float(va) - m;
                const float xb = __uint_as_float(vb) - m;
                xs2[0] = fmaf(xa, xa, xs2[0]);
                xs2[1] = fmaf(xb, xb, xs2[1]);
                va = RNA ? tf32_rna(xa) : __float_as_uint(xa);  // rounded: half the error
                vb = RNA ? tf32_rna(xb) : __float_as_uint(xb);
            } else {
                const float a0 = half_to_float<TIN>((unsigned short)(va & 0xffffu));
                const float a1 = half_to_float<TIN>((unsigned short)(va >> 16));
                const float b0 = half_to_float<TIN>((unsigned short)(vb & 0xffffu));
                const float b1 = half_to_float<TIN>((unsigned short)(vb >> 16));
                xs2[0] = fmaf(a1, a1, fmaf(a0, a0, xs2[0]));
                xs2[1] = fmaf(b1, b1, fmaf(b0, b0, xs2[1]));
            }
            a[s][2 * h] = va;
            a[s][2 * h + 1] = vb;
        }
    }
}

template <int TIN, int MARGIN, int NS, int STAGES>
__global__ void __launch_bounds__(WG_THREADS, 1)
kmeans_assign_wg(const unsigned* __restrict__ X, i64 ldw, int n, int d, const unsigned* __restrict__ Cs,
                 int ldw_c, const float* __restrict__ cn, const float* __restrict__ mu, int k, float ea,
                 float eb, const float* __restrict__ cm2, int* labels, float* __restrict__ mind, const int* prev,
                 int* __restrict__ changed, int* __restrict__ lists, int* __restrict__ counts, int cap) {
    constexpr bool X3 = TIN == 3;          // float32 rows as three bfloat16 products
    constexpr int EPW = TIN == 1 || TIN == 2 ? 2 : 1;  // elements of X a word
    constexpr int PL = X3 ? 2 : 1;         // centre planes: the values (or hi, lo)
    constexpr int DW = NS * 8;             // words of a plane's row the MMAs read
    constexpr int PLANE = WG_BN * DW;      // words of one plane of a centre tile
    constexpr int STAGE = PL * PLANE;      // words of one centre tile
    static_assert(STAGES <= 3, "the norms' ring has STAGES + 1 <= 4 slots");
    extern __shared__ __align__(128) unsigned smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * WG_BM;
    const int dw = (d + EPW - 1) / EPW;
    const int ntile = (k + WG_BN - 1) / WG_BN;
    const int ldw_p = ldw_c / PL;          // words of a plane in a row of Cs
    const unsigned sbase = smem_u32(smem);

    // Tile jt's centres into stage buf, its norms into slot jt % 4 of their own ring, one
    // slot more than the tiles': the fold of tile jt - 1 reads its norms after tile
    // jt + STAGES - 1's copies are issued.
    auto load = [&](int jt, int buf) { km_wg_load<PL, NS, STAGES>(smem, Cs, ldw_c, ldw_p, cn, k, tid, jt, buf, jt & 3); };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ntile) load(s, s);
        cp_async_commit();
    }

    // This warp's rows: ra = r0 + 16 warp + g and ra + 8 (warps 0-3: warpgroup 0's 64
    // rows, 4-7: warpgroup 1's). A fragments: words (g | g + 8, t | t + 4) of each step.
    const int ra = r0 + warp * 16 + g, rb = ra + 8;
    unsigned a[NS][4];
    unsigned al[X3 ? NS : 1][4];  // X3: the low bfloat16 parts
    float xs2[2] = {0.f, 0.f};
    km_wg_frags<TIN, NS, MARGIN == 2>(a, al, xs2, mu, t, [&](int r, int w) -> unsigned {
        const int row = r ? rb : ra;
        return row < n && w < dw ? __ldg(X + (i64)row * ldw + w) : 0u;
    });

    Top3 top[2];
    top_init(top[0]);
    top_init(top[1]);
    float acc0[64], acc1[64];
    // Warpgroup wg's 64 rows multiply the whole tile: B is the tile (all 128 centres).
    // Tile jt: its copies landed and every warpgroup is done with tile jt - 1 (its
    // MMAs were waited for), so that stage takes tile jt + STAGES - 1; then tile jt's
    // MMAs are issued, tile jt - 1's distances folded while they run, and waited for.
    auto cnorm = [&](int jt) -> const float* { return (const float*)smem + STAGES * STAGE + (jt & 3) * WG_BN; };
    auto issue = [&](float (&acc)[64], int jt) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        if (jt + STAGES - 1 < ntile) load(jt + STAGES - 1, (jt + STAGES - 1) % STAGES);
        cp_async_commit();
        km_wg_mmas<TIN, NS>(acc, a, al, sbase + (unsigned)((jt % STAGES) * STAGE) * 4u);
    };
    for (int jt = 0; jt < ntile; jt += 2) {
        issue(acc0, jt);
        if (jt > 0) km_fold<MARGIN>(acc1, jt - 1, t, cnorm(jt - 1), top);
        wg_wait<0>();
        km_pin(acc0);
        if (jt + 1 < ntile) {
            issue(acc1, jt + 1);
            km_fold<MARGIN>(acc0, jt, t, cnorm(jt), top);
            wg_wait<0>();
            km_pin(acc1);
        }
    }
    if (ntile & 1)
        km_fold<MARGIN>(acc0, ntile - 1, t, cnorm(ntile - 1), top);
    else if (ntile > 0)
        km_fold<MARGIN>(acc1, ntile - 1, t, cnorm(ntile - 1), top);
    cp_async_wait<0>();

    // The four lanes of a row (t = 0..3) hold all its centres: merge them.
    int ch = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        top_merge<MARGIN>(top[h], top_shfl_xor(top[h], 1));
        top_merge<MARGIN>(top[h], top_shfl_xor(top[h], 2));
        xs2[h] += __shfl_xor_sync(0xffffffffu, xs2[h], 1);
        xs2[h] += __shfl_xor_sync(0xffffffffu, xs2[h], 2);
        const int r = h ? rb : ra;
        if (t == 0 && r < n)
            ch |= mma_finish<MARGIN>(r, top[h], xs2[h], ea, eb, MARGIN ? *cm2 : 0.f, labels, mind, prev, lists,
                                     counts, cap);
    }
    if (__syncthreads_or(ch) && tid == 0) *changed = 1;
}

// kmeans_assign_wgp: kmeans_assign_wg made persistent, one block an SM striding over
// the 128-row tiles. A block's (row tile, centre tile) steps form one sequence: the
// centre ring runs on across its row tiles, so the last tile of a row tile is folded,
// and its rows finished, beside the next row tile's first MMAs. The next row tile's
// rows are copied into a shared buffer in slices, one beside each centre tile of the
// current row tile (the last STAGES - 2 steps excepted), so no block waits for its
// rows from DRAM; a row tile's start waits for them as the ring waits for its tiles
// and reads its A fragments from the buffer.
// The same products in the same order as kmeans_assign_wg: bit-identical results.
#define WGP_PAD 4  // words of padding a row in the rows buffer (spreads the fragment reads' banks)

template <int TIN, int MARGIN, int NS, int STAGES>
__global__ void __launch_bounds__(WG_THREADS, 1)
kmeans_assign_wgp(const unsigned* __restrict__ X, i64 ldw, int n, int d, const unsigned* __restrict__ Cs,
                  int ldw_c, const float* __restrict__ cn, const float* __restrict__ mu, int k, float ea,
                  float eb, const float* __restrict__ cm2, int* labels, float* __restrict__ mind, const int* prev,
                  int* __restrict__ changed, int* __restrict__ lists, int* __restrict__ counts, int cap) {
    constexpr bool X3 = TIN == 3;
    constexpr int EPW = TIN == 1 || TIN == 2 ? 2 : 1;
    constexpr int PL = X3 ? 2 : 1;
    constexpr int DW = NS * 8;
    constexpr int PLANE = WG_BN * DW;
    constexpr int STAGE = PL * PLANE;
    static_assert(STAGES >= 2 && STAGES <= 3, "the norms' ring has STAGES + 1 <= 4 slots");
    constexpr int RW = X3 ? NS * 16 : NS * 8;  // words of a row the A fragments read
    constexpr int RWP = RW + WGP_PAD;         // words a row in the rows buffer
    constexpr int RCH = WG_BM * (RW / 4);     // 16-byte chunks of a row tile
    extern __shared__ __align__(128) unsigned smem[];
    unsigned* rbuf = smem + STAGES * STAGE + 4 * WG_BN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int dw = (d + EPW - 1) / EPW;
    const int ntile = (k + WG_BN - 1) / WG_BN;
    const int nrt = (n + WG_BM - 1) / WG_BM;
    const int ldw_p = ldw_c / PL;
    const unsigned sbase = smem_u32(smem);
    const int rt0 = blockIdx.x, rstep = gridDim.x;
    if (rt0 >= nrt || ntile == 0) return;
    const int nsteps = ((nrt - 1 - rt0) / rstep + 1) * ntile;
    // Steps of a row tile that copy slices of the next one's rows: all but the last
    // STAGES - 2, whose groups the ring's wait may leave in flight (where there are
    // fewer steps, all of them, and a row tile's start waits for every copy).
    const int nsl = ntile > STAGES - 2 ? ntile - (STAGES - 2) : ntile;

    // Step s's centre tile jt into stage buf and its norms into slot s % 4.
    auto load = [&](int s, int jt, int buf) { km_wg_load<PL, NS, STAGES>(smem, Cs, ldw_c, ldw_p, cn, k, tid, jt, buf, s & 3); };
    // Chunks [c0, c1) of row tile rt's rows into the rows buffer (zeros past n and dw).
    auto rows = [&](int rt, int c0, int c1) {
        for (int c = c0 + tid; c < c1; c += WG_THREADS) {
            const int row = c / (RW / 4), w0 = (c % (RW / 4)) * 4;
            const int r = rt * WG_BM + row;
            const int bytes = r < n ? max(0, min(16, (dw - w0) * 4)) : 0;
            slab_copy(rbuf + row * RWP + w0, bytes > 0 ? X + (i64)r * ldw + w0 : X, bytes);
        }
    };
    auto cnorm = [&](int s) -> const float* { return (const float*)smem + STAGES * STAGE + (s & 3) * WG_BN; };

    rows(rt0, 0, RCH);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nsteps) load(s, s % ntile, s);
        cp_async_commit();
    }

    unsigned a[NS][4];
    unsigned al[X3 ? NS : 1][4];
    float xs2[2] = {0.f, 0.f}, xs2n[2] = {0.f, 0.f};
    // This warp's A fragments from the rows buffer (as kmeans_assign_wg reads them from
    // X, shifted by mu for float32 rows), their squared norms into xn.
    auto build = [&](float (&xn)[2]) {
        const unsigned* rA = rbuf + (warp * 16 + g) * RWP;
        xn[0] = xn[1] = 0.f;
        km_wg_frags<TIN, NS, MARGIN == 2>(a, al, xn, mu, t, [&](int r, int w) -> unsigned { return rA[r * 8 * RWP + w]; });
    };
    cp_async_wait<0>();
    __syncthreads();
    build(xs2);

    Top3 top[2];
    top_init(top[0]);
    top_init(top[1]);
    int ch = 0;
    // The rows of row tile rt: merge the four lanes' minima, then finish each row.
    auto finish = [&](int rt) {
        const int ra = rt * WG_BM + warp * 16 + g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            top_merge<MARGIN>(top[h], top_shfl_xor(top[h], 1));
            top_merge<MARGIN>(top[h], top_shfl_xor(top[h], 2));
            xs2[h] += __shfl_xor_sync(0xffffffffu, xs2[h], 1);
            xs2[h] += __shfl_xor_sync(0xffffffffu, xs2[h], 2);
            const int r = ra + 8 * h;
            if (t == 0 && r < n)
                ch |= mma_finish<MARGIN>(r, top[h], xs2[h], ea, eb, MARGIN ? *cm2 : 0.f, labels, mind, prev,
                                         lists, counts, cap);
            top_init(top[h]);
        }
    };
    float acc0[64], acc1[64];
    auto issue = [&](float (&acc)[64], int s, int i, int jt) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        if (s + STAGES - 1 < nsteps) {
            int jl = jt + STAGES - 1;
            while (jl >= ntile) jl -= ntile;
            load(s + STAGES - 1, jl, (s + STAGES - 1) % STAGES);
        }
        // This step's slice of the block's next row tile (read into registers at this
        // row tile's start, before the barrier above): over its first nsl steps, so that
        // the last slice is older than the groups a ring wait may leave in flight.
        const int rtn = rt0 + (i + 1) * rstep;
        if (rtn < nrt && jt < nsl) rows(rtn, (int)((i64)jt * RCH / nsl), (int)((i64)(jt + 1) * RCH / nsl));
        cp_async_commit();
        km_wg_mmas<TIN, NS>(acc, a, al, sbase + (unsigned)((s % STAGES) * STAGE) * 4u);
    };
    // Step s (row tile i of this block, centre tile jt): (a new row tile's fragments,)
    // its MMAs into accI, the previous step's distances (accF) folded while they run
    // (and that row tile finished where it was its last step), then the wait for the
    // MMAs.
    int i = 0, jt = 0;
    auto step = [&](float (&accI)[64], float (&accF)[64], int s) {
        if (jt == 0 && s > 0) {
            if (nsl < ntile || STAGES == 2)
                cp_async_wait<STAGES - 2>();  // the last slice's group is older than these
            else
                cp_async_wait<0>();
            __syncthreads();
            build(xs2n);
        }
        issue(accI, s, i, jt);
        if (s > 0) {
            km_fold<MARGIN>(accF, jt == 0 ? ntile - 1 : jt - 1, t, cnorm(s - 1), top);
            if (jt == 0) {
                finish(rt0 + (i - 1) * rstep);
                xs2[0] = xs2n[0];
                xs2[1] = xs2n[1];
            }
        }
        wg_wait<0>();
        km_pin(accI);
        if (++jt == ntile) {
            jt = 0;
            ++i;
        }
    };
    for (int s = 0; s < nsteps; s += 2) {
        step(acc0, acc1, s);
        if (s + 1 < nsteps) step(acc1, acc0, s + 1);
    }
    // The last step's distances and its row tile (i, jt: one past the last step).
    if (nsteps & 1)
        km_fold<MARGIN>(acc0, ntile - 1, t, cnorm(nsteps - 1), top);
    else
        km_fold<MARGIN>(acc1, ntile - 1, t, cnorm(nsteps - 1), top);
    finish(rt0 + (i - 1) * rstep);
    cp_async_wait<0>();
    if (__syncthreads_or(ch) && tid == 0) *changed = 1;
}

// kmeans_assign_ws: kmeans_assign_wgp with the copies taken out of the compute warps
// (warp specialization) and no block-wide barrier in its loop; persistent, one block
// an SM striding over the 128-row tiles. Two consumer warpgroups (threads 0-255:
// rows 64 w .. 64 w + 63 of each 128-row tile, as in kmeans_assign_wg) issue the MMAs
// and fold the distances; one thread of a producer warpgroup (threads 256-383)
// copies with cp.async.bulk: each centre tile, laid out beforehand in the order its
// shared stage takes (kmeans_wg_tiles), and its norms as one contiguous copy each;
// each warpgroup's next 64 rows as one copy of whole rows (row stride ldw words, at
// most RW; the last row's words rounded up to 16 bytes lie inside X: the launcher
// checks). mbarriers pair them: FULL[b] (the stage's bytes landed), EMPTY[b] (the 256
// consumer threads are done with it: its MMAs waited for, its norms folded),
// RFULL[w] / REMPTY[w] for warpgroup w's rows buffer (emptied once its 128 threads
// built their A fragments). Each thread arrives itself, with values computed from
// what it read as operands (mbar_arrive_after). So one warpgroup's fold runs beside
// the other's MMAs (one accumulator set each), and a row tile's rows arrive during
// the previous one. setmaxnreg gives the consumers WS_KM_REGS registers a thread.
// The same products in the same order per thread as kmeans_assign_wg:
// bit-identical results.
#define WS_KM_THREADS 384
#define WS_KM_REGS 240  // consumers; the producers keep 168 - 2 (240 - 168) = 24

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#if defined(TSM_WGMMA)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
#if defined(TSM_WGMMA)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#if defined(TSM_WGMMA)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// The same, after this thread's shared-memory loads have returned: an arrive does not
// wait for loads still in flight (SASS: a SYNCS.ARRIVE right after LDS into
// registers not yet read), and operands an asm does not use vanish before ptxas. So
// `dep`, computed from every word the thread loaded, is first stored to its scratch
// word (the store cannot issue before the loads it depends on return; the arrive's
// release orders it after the store).
__device__ __forceinline__ void mbar_arrive_after(unsigned bar, unsigned scratch, float dep) {
#if defined(TSM_WGMMA)
    asm volatile("{\nst.shared.f32 [%1], %2;\nmbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
                 "r"(scratch), "f"(dep)
                 : "memory");
#endif
}
// Wait for the completion of the phase of parity `parity` (a fresh barrier counts
// its phase before the first as complete for parity 1).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#if defined(TSM_WGMMA)
    asm volatile("{\n.reg .pred P1;\nKM_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra KM_DONE;\nbra KM_WAIT;\nKM_DONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
#endif
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared
// dst, completing that many bytes of barrier bar's transaction count.
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
#if defined(TSM_WGMMA)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}
template <int R>
__device__ __forceinline__ void km_regs_inc() {
#if defined(TSM_WGMMA)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void km_regs_dec() {
#if defined(TSM_WGMMA)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}

// Centre tiles in the order kmeans_assign_ws's stages take them: tile jt at word
// jt * STAGE of Ct, in km_wg_load's layout (zeros past k and past a plane's words).
template <int PL, int NS>
__global__ void __launch_bounds__(256)
kmeans_wg_tiles(const unsigned* __restrict__ Cs, int ldw_c, int k, int ntile, unsigned* __restrict__ Ct) {
    constexpr int KG = NS * 2;
    constexpr int PLANE = WG_BN * NS * 8;
    constexpr int STAGE = PL * PLANE;
    constexpr int CHUNKS = PL * WG_BN * KG;
    const int ldw_p = ldw_c / PL;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (i64)ntile * CHUNKS;
         i += (i64)gridDim.x * blockDim.x) {
        const int jt = (int)(i / CHUNKS), c = (int)(i % CHUNKS);
        const int p = PL == 1 ? 0 : c / (WG_BN * KG);
        const int cr = PL == 1 ? c : c % (WG_BN * KG);
        const int row = cr / KG, kg = cr % KG;
        const int cc = jt * WG_BN + row;
        const bool ok = cc < k && kg * 4 < ldw_p;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (ok) v = *reinterpret_cast<const uint4*>(Cs + (i64)cc * ldw_c + p * ldw_p + kg * 4);
        *reinterpret_cast<uint4*>(Ct + (i64)jt * STAGE + p * PLANE + ((row >> 3) * KG + kg) * 32 + (row & 7) * 4) = v;
    }
}

template <int TIN, int MARGIN, int NS, int STAGES>
__global__ void __launch_bounds__(WS_KM_THREADS, 1)
kmeans_assign_ws(const unsigned* __restrict__ X, i64 ldw, int n, int d, const unsigned* __restrict__ Ct,
                 const float* __restrict__ cn, const float* __restrict__ mu, int k, float ea, float eb,
                 const float* __restrict__ cm2, int* labels, float* __restrict__ mind, const int* prev,
                 int* __restrict__ changed, int* __restrict__ lists, int* __restrict__ counts, int cap) {
    constexpr bool X3 = TIN == 3;
    constexpr int EPW = TIN == 1 || TIN == 2 ? 2 : 1;
    constexpr int PL = X3 ? 2 : 1;
    constexpr int DW = NS * 8;
    constexpr int PLANE = WG_BN * DW;
    constexpr int STAGE = PL * PLANE;          // words of a centre tile
    constexpr int RW = X3 ? NS * 16 : NS * 8;  // most words a row in the rows buffers
    extern __shared__ __align__(128) unsigned smem[];
    // stages | their norms (STAGES x 128) | two rows buffers (64 x RW) | barriers | 256 words
    unsigned* rbuf0 = smem + STAGES * (STAGE + WG_BN);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(rbuf0 + 2 * 64 * RW);
    const unsigned scratch = smem_u32(bars + 2 * STAGES + 4) + 4u * (threadIdx.x & 255);  // a word a consumer
    const unsigned sbase = smem_u32(smem);
    const unsigned bfull = smem_u32(bars), bempty = bfull + 8 * STAGES;
    const unsigned brfull = bfull + 16 * STAGES, brempty = brfull + 16;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int dw = (d + EPW - 1) / EPW;
    const int ntile = (k + WG_BN - 1) / WG_BN;
    const int nrt = (n + WG_BM - 1) / WG_BM;
    const int rt0 = blockIdx.x, rstep = gridDim.x;
    if (tid == 0) {
        for (int b = 0; b < STAGES; ++b) {
            mbar_init(bfull + 8 * b, 1);
            mbar_init(bempty + 8 * b, 256);
        }
        for (int w = 0; w < 2; ++w) {
            mbar_init(brfull + 8 * w, 1);
            mbar_init(brempty + 8 * w, 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (rt0 >= nrt || ntile == 0) return;

    if (warp >= 8) {  // the producer warpgroup: one thread copies
        km_regs_dec<168 - 2 * (WS_KM_REGS - 168)>();
        if (tid != 256) return;
        int s = 0;
        for (int i = 0, rt = rt0; rt < nrt; ++i, rt += rstep) {
            for (int w = 0; w < 2; ++w) {
                mbar_wait(brempty + 8 * w, (i & 1) ^ 1);
                const int r = rt * WG_BM + 64 * w;
                const int rows = min(64, max(0, n - r));
                // whole rows, the last one's words rounded up to 16 bytes (launcher: inside X)
                const unsigned bytes = rows ? (unsigned)(((rows - 1) * ldw + ((dw + 3) & ~3)) * 4) : 0u;
                mbar_expect(brfull + 8 * w, bytes);
                if (bytes) bulk_copy(smem_u32(rbuf0 + w * 64 * RW), X + (i64)r * ldw, bytes, brfull + 8 * w);
            }
            for (int jt = 0; jt < ntile; ++jt, ++s) {
                const int b = s % STAGES;
                mbar_wait(bempty + 8 * b, ((s / STAGES) & 1) ^ 1);
                mbar_expect(bfull + 8 * b, (unsigned)(STAGE + WG_BN) * 4u);
                bulk_copy(sbase + (unsigned)(b * STAGE) * 4u, Ct + (i64)jt * STAGE, STAGE * 4u, bfull + 8 * b);
                bulk_copy(sbase + (unsigned)(STAGES * STAGE + b * WG_BN) * 4u, cn + jt * WG_BN, WG_BN * 4u,
                          bfull + 8 * b);
            }
        }
        return;
    }
    km_regs_inc<WS_KM_REGS>();
    const int wg = warp >> 2, g = lane >> 2, t = lane & 3;
    const unsigned* rA = rbuf0 + wg * 64 * RW + ((warp & 3) * 16 + g) * (int)ldw;
    const int nsteps = ((nrt - 1 - rt0) / rstep + 1) * ntile;
    unsigned a[NS][4];
    unsigned al[X3 ? NS : 1][4];
    float xs2[2] = {0.f, 0.f};
    // Row tile i's A fragments from this warpgroup's rows buffer (zero past n and dw),
    // then the buffer handed back to the producer.
    auto build = [&](int i, int rt, float (&xn)[2]) {
        mbar_wait(brfull + 8 * wg, i & 1);
        __syncwarp();
        const int ra = rt * WG_BM + wg * 64 + (warp & 3) * 16 + g;
        xn[0] = xn[1] = 0.f;
        km_wg_frags<TIN, NS, MARGIN == 2>(a, al, xn, mu, t, [&](int r, int w) -> unsigned {
            return ra + 8 * r < n && w < dw ? rA[r * 8 * (int)ldw + w] : 0u;
        });
        // every thread, after its own loads (xn sums every word it read)
        mbar_arrive_after(brempty + 8 * wg, scratch, xn[0] + xn[1]);
    };
    Top3 top[2];
    top_init(top[0]);
    top_init(top[1]);
    int ch = 0;
    auto finish = [&](int rt) {
        const int ra = rt * WG_BM + warp * 16 + g;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            top_merge<MARGIN>(top[h], top_shfl_xor(top[h], 1));
            top_merge<MARGIN>(top[h], top_shfl_xor(top[h], 2));
            xs2[h] += __shfl_xor_sync(0xffffffffu, xs2[h], 1);
            xs2[h] += __shfl_xor_sync(0xffffffffu, xs2[h], 2);
            const int r = ra + 8 * h;
            if (t == 0 && r < n)
                ch |= mma_finish<MARGIN>(r, top[h], xs2[h], ea, eb, MARGIN ? *cm2 : 0.f, labels, mind, prev,
                                         lists, counts, cap);
            top_init(top[h]);
        }
    };
    auto cnorm = [&](int s) -> const float* { return (const float*)smem + STAGES * STAGE + (s % STAGES) * WG_BN; };
    // Stage of step s handed back by every thread: its MMAs were waited for, and its
    // fold's results computed (they compare every distance, and so every norm the
    // thread read, against b1 and b3).
    auto release = [&](int s) {
        mbar_arrive_after(bempty + 8 * (s % STAGES), scratch, (top[0].b1 + top[0].b3) + (top[1].b1 + top[1].b3));
    };
    build(0, rt0, xs2);
    float acc[64];
    int i = 0, jt = 0;
    // Step s (row tile i, centre tile jt): (a new row tile's fragments,) its MMAs once
    // its stage landed and the wait for them, then its distances folded, its stage
    // released (that row tile finished where it was its last step). One accumulator
    // set: the other warpgroup's MMAs run beside this one's fold (measured faster at
    // d >= 64 than folding the previous tile beside this one's own MMAs with two sets).
    for (int s = 0; s < nsteps; ++s) {
        if (jt == 0 && s > 0) build(i, rt0 + i * rstep, xs2);
        mbar_wait(bfull + 8 * (s % STAGES), (s / STAGES) & 1);
        __syncwarp();  // the lanes leave the wait's loop apart; wgmma is .aligned
        km_wg_mmas<TIN, NS>(acc, a, al, sbase + (unsigned)((s % STAGES) * STAGE) * 4u);
        wg_wait<0>();
        km_pin(acc);
        km_pin_frags(a, al);
        km_fold<MARGIN>(acc, jt, t, cnorm(s), top);
        release(s);
        if (++jt == ntile) {
            finish(rt0 + i * rstep);
            jt = 0;
            ++i;
        }
    }
    if (__any_sync(0xffffffffu, ch) && lane == 0) *changed = 1;
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

// The TF32 screen's listed rows gathered for their second pass: row e of out (ldo
// words apart) = row idx[e] of X (ldx words apart, 16-byte aligned; d floats, whole
// 16-byte units then the tail's words, so no read passes the row's last element);
// prev_out[e] = prev[idx[e]] where prev is given. A warp per row.
__global__ void __launch_bounds__(256)
kmeans_gather_rows(const float* __restrict__ X, i64 ldx, const int* __restrict__ idx, int m, int d,
                   float* __restrict__ out, int ldo, const int* __restrict__ prev, int* __restrict__ prev_out) {
    const int lane = threadIdx.x & 31;
    const int nw = (gridDim.x * blockDim.x) >> 5;
    const int d4 = d >> 2;
    for (int e = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; e < m; e += nw) {
        const int i = idx[e];
        const float* x = X + (i64)i * ldx;
        float* o = out + (i64)e * ldo;
        for (int c = lane; c < d4; c += 32)
            reinterpret_cast<float4*>(o)[c] = __ldg(reinterpret_cast<const float4*>(x) + c);
        if (lane < (d & 3)) o[4 * d4 + lane] = __ldg(x + 4 * d4 + lane);
        if (prev != nullptr && lane == 0) prev_out[e] = prev[i];
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
    if constexpr (TIN == 3) {
        // the bfloat16 split c' = ch + cl: ch's words, then cl's (ldw_c / 2 each);
        // the norm is of c' in float32, which the split products approximate.
        const int ldw_p = ldw_c / 2;
        for (int w = tid; w < ldw_p; w += 128) {
            float v[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int e = 2 * w + h;
                v[h] = e < d ? (float)((double)c[e] - (double)mu[e]) : 0.f;
                s += (double)v[h] * (double)v[h];
            }
            const unsigned hi = bf16x2_rn(v[0], v[1]);
            Cs[(i64)j * ldw_c + w] = hi;
            Cs[(i64)j * ldw_c + ldw_p + w] =
                bf16x2_rn(v[0] - __uint_as_float(hi << 16), v[1] - __uint_as_float(hi & 0xffff0000u));
        }
    } else
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

// ------------------------------------------------------------------ long rows on cuBLAS
// Rows longer than the warpgroup kernels take (d > 128 float32 words), "tf32" and
// "float32" (longrows.py): cuBLAS forms the dot products of blocks of rows with the
// centres; these kernels prepare its operands and fold its products.

// Xs row r = x'_r = x_r - mu rounded to nearest TF32 (zero from d to ldxs words),
// xx[r] = ||x'_r||^2 (float32, of the unrounded values). X's rows 16-byte aligned
// (ldx a multiple of 4); mu has ldxs entries (zero past d). A warp per row.
__global__ void __launch_bounds__(256)
kmeans_long_center(const float* __restrict__ X, i64 ldx, int rows, int d, const float* __restrict__ mu,
                   float* __restrict__ Xs, int ldxs, float* __restrict__ xx) {
    const int lane = threadIdx.x & 31;
    const int nw = (gridDim.x * blockDim.x) >> 5;
    const int q4 = ldxs >> 2;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const float* x = X + (i64)r * ldx;
        float4* o = reinterpret_cast<float4*>(Xs + (i64)r * ldxs);
        float s = 0.f;
        for (int q = lane; q < q4; q += 32) {
            const int c = 4 * q;
            float v[4];
            if (c + 3 < d) {
                const float4 t = __ldg(reinterpret_cast<const float4*>(x) + q);
                v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
            } else {
#pragma unroll
                for (int h = 0; h < 4; ++h) v[h] = c + h < d ? __ldg(x + c + h) : 0.f;
            }
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                v[h] = c + h < d ? v[h] - mu[c + h] : 0.f;
                s = fmaf(v[h], v[h], s);
            }
            o[q] = make_float4(__uint_as_float(tf32_rna(v[0])), __uint_as_float(tf32_rna(v[1])),
                               __uint_as_float(tf32_rna(v[2])), __uint_as_float(tf32_rna(v[3])));
        }
        for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0) xx[r] = s;
    }
}

// Rows listed by the TF32 pass, for three bfloat16 products on cuBLAS: row e of W
// (ldw 16-bit values apart, as 32-bit words) = [xh | xh | xl] of row idx[e] of X,
// x' = x - mu in float32, xh = x' and xl = x' - xh rounded to nearest bfloat16, each
// part dp values (dp even; zero past d), zero from 3 dp to ldw; xx[e] = ||x'||^2.
// Against centre rows [ch | cl | ch] the product is xh.ch + xh.cl + xl.ch. A warp
// per row, two values a lane step.
__global__ void __launch_bounds__(256)
kmeans_long_split(const float* __restrict__ X, i64 ldx, int d, int dp, const int* __restrict__ idx, int m,
                  const float* __restrict__ mu, unsigned* __restrict__ W, int ldw, float* __restrict__ xx) {
    const int lane = threadIdx.x & 31;
    const int nw = (gridDim.x * blockDim.x) >> 5;
    const int hw = dp >> 1, rw = ldw >> 1;
    for (int e = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; e < m; e += nw) {
        const float* x = X + (i64)idx[e] * ldx;
        unsigned* o = W + (i64)e * rw;
        float s = 0.f;
        for (int w = lane; w < hw; w += 32) {
            const int c = 2 * w;
            const float v0 = c < d ? __ldg(x + c) - mu[c] : 0.f;
            const float v1 = c + 1 < d ? __ldg(x + c + 1) - mu[c + 1] : 0.f;
            s = fmaf(v0, v0, s);
            s = fmaf(v1, v1, s);
            const unsigned hi = bf16x2_rn(v0, v1);
            o[w] = hi;
            o[hw + w] = hi;
            o[2 * hw + w] = bf16x2_rn(v0 - __uint_as_float(hi << 16), v1 - __uint_as_float(hi & 0xffff0000u));
        }
        for (int w = 3 * hw + lane; w < rw; w += 32) o[w] = 0u;
        for (int q = 16; q; q >>= 1) s += __shfl_xor_sync(0xffffffffu, s, q);
        if (lane == 0) xx[e] = s;
    }
}

// The rows' nearest centres from cuBLAS's dot products: s_rj = the sum over planes
// p (in order) of P[p * pstride + r * k + j], v_j = cn_j - 2 s_rj, the best (smaller
// index on ties) and, under MARGIN 2, the second value; row g = idx[r] where idx is
// given, else r0 + r. mma_finish writes the row (label, mind = max(xx[r] + v_best,
// 0), the changed flag against prev) or, under MARGIN 2 within the bound B, lists g
// instead. A warp per row.
template <int MARGIN>
__global__ void __launch_bounds__(256)
kmeans_long_top(const float* __restrict__ P, int planes, i64 pstride, int rows, int k,
                const float* __restrict__ cn, const float* __restrict__ xx, const int* __restrict__ idx, int r0,
                float ea, float eb, const float* __restrict__ cm2, int* labels, float* __restrict__ mind,
                const int* prev, int* __restrict__ changed, int* __restrict__ lists, int* __restrict__ counts,
                int cap) {
    const int lane = threadIdx.x & 31;
    const int nw = (gridDim.x * blockDim.x) >> 5;
    const float c2 = MARGIN ? *cm2 : 0.f;
    int ch = 0;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const float* p = P + (i64)r * k;
        Top3 s;
        top_init(s);
        for (int j = lane; j < k; j += 32) {
            float t = p[j];
            for (int q = 1; q < planes; ++q) t += p[q * pstride + j];
            top_push<MARGIN>(s, fmaf(-2.f, t, cn[j]), j);
        }
        for (int m = 16; m; m >>= 1) top_merge<MARGIN>(s, top_shfl_xor(s, m));
        if (lane == 0) {
            const int g = idx != nullptr ? idx[r] : r0 + r;
            ch |= mma_finish<MARGIN>(g, s, xx[r], ea, eb, c2, labels, mind, prev, lists, counts, cap);
        }
    }
    if (__any_sync(0xffffffffu, ch) && lane == 0) *changed = 1;
}

// xx[r] = ||x_r||^2 of 16-bit rows (TIN 1 bfloat16, 2 float16; dw words of two values,
// rows ldw words apart), float32 sums. A warp per row.
template <int TIN>
__global__ void __launch_bounds__(256)
kmeans_long_sqnorm(const unsigned* __restrict__ X, i64 ldw, int rows, int dw, float* __restrict__ xx) {
    const int lane = threadIdx.x & 31;
    const int nw = (gridDim.x * blockDim.x) >> 5;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const unsigned* x = X + (i64)r * ldw;
        float s = 0.f;
        for (int w = lane; w < dw; w += 32) {
            const unsigned u = __ldg(x + w);
            const float lo = half_to_float<TIN>((unsigned short)(u & 0xffffu));
            const float hi = half_to_float<TIN>((unsigned short)(u >> 16));
            s = fmaf(lo, lo, s);
            s = fmaf(hi, hi, s);
        }
        for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0) xx[r] = s;
    }
}

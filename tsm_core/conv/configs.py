"""The convolution family's kernel contract and tuning space, as data: the launch's
limits and descriptor fields (mirrors of conv.cu's), the tile configurations
(``CONFIGS``) and the model's relative efficiencies of their tiles (H100)."""

from __future__ import annotations

from dataclasses import dataclass

FAMILY = "conv"
MAX_SLOTS = 5
MAX_PARTS = 6  # tsm_conv::MAX_PARTS
NF = 15 + 4 * MAX_PARTS  # tsm_conv::NF
(F_KIND, F_SRC, F_CIN, F_K, F_M, F_W, F_BIAS, F_TAB, F_TILE0, F_MTILES, F_NPARTS,
 F_SPLITS, F_KCHUNK, F_WS, F_CNT, F_PART0) = range(16)
MAX_SPLITS = 8
KIND_1X1, KIND_POOL, KIND_RXR = 0, 1, 2
KIND_MAXPOOL = 4  # tsm_conv::KIND_MAXPOOL_ (3 is the async kernel's own vector 1x1)
KIND_RXRT = 5  # an R x R segment on the tensor-core tiles with K tap-major (`tap_major`)


@dataclass(frozen=True)
class TileConfig:
    """One instantiation of ``conv_gemm_relu``: tile BM x BN, K step BK, TM x TN per thread,
    MINB blocks per SM promised to the compiler (its register cap)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    minb: int
    stages: int = 0  # > 0: conv_gemm_relu_async, a cp.async pipeline this deep (no split-K)
    spill_ok: int = 0  # spill bytes ptxas may use (measured faster all the same; see CONFIGS)
    tc: bool = False  # with stages: conv_gemm_relu_tc, the products on the tensor cores (3xTF32)
    deep: bool = False  # a deeper-K twin of a register-staged tile: its tag ends in d<BK>
    kw: int = 1  # register-staged: K groups splitting each step inside the block (tag w<KW>)

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn) * self.kw

    @property
    def splittable(self) -> bool:
        """Whether the kernel can cut a segment's K in chunks (split-K): the register-staged
        tiles and the 64-row tensor-core ones."""
        return not self.stages or (self.tc and self.bm == 64)

    @property
    def tag(self) -> str:
        """Short name, as ``TSM_CONV_TILE`` takes it: ``128x64``, or ``a128x128`` (async;
        ``a64x128b3`` for three blocks per SM)."""
        blocks = f"b{self.minb}" if self.stages and self.minb != 2 else ""
        kind = "t" if self.tc else "a" if self.stages else ""
        depth = f"d{self.bk}" if self.deep else ""
        groups = f"w{self.kw}" if self.kw > 1 else ""
        return f"{kind}{self.bm}x{self.bn}{blocks}{depth}{groups}"

    @property
    def name(self) -> str:
        if self.stages:
            kernel = "conv_gemm_relu_tc" if self.tc else "conv_gemm_relu_async"
            return (f"{kernel}<{self.bm}, {self.bn}, {self.bk}, {self.stages}, "
                    f"{self.minb}>")
        kw = f", {self.kw}" if self.kw > 1 else ""
        return f"conv_gemm_relu<{self.bm}, {self.bn}, {self.bk}, {self.tm}, {self.tn}, {self.minb}{kw}>"


# Candidates, largest first. Registers on sm_90 (compile_report): 167, 127, 122, 79, 128;
# none spills (128x128 capped at 128 registers, two blocks per SM, spills ~250 B:
# it runs one block of 8 warps per SM instead). The larger tiles read fewer bytes of
# shared memory per FMA; the smaller ones make enough blocks for small batches (a
# batch-1 Inception block at 7x7 has 49 GEMM columns), and the smallest steps 16
# deep in K: at batch 1 a block is bound by the latency of each K step's loads, so
# fewer, deeper steps finish sooner.
CONFIGS = (
    TileConfig(128, 128, 8, 8, 8, 1),
    TileConfig(128, 64, 8, 8, 4, 2),
    TileConfig(64, 128, 8, 4, 8, 2),
    TileConfig(64, 64, 8, 4, 4, 3),
    TileConfig(32, 32, 16, 4, 4, 8),
    # Deeper twins of the small tiles, for launches bound by the latency of their K
    # steps (batch 1: Table 6's K = 192 is 12 steps of 16; half as many steps of 32).
    TileConfig(64, 64, 16, 4, 4, 3, deep=True),
    TileConfig(32, 32, 32, 4, 4, 6, deep=True),
    # The small tiles with each K step split among KW thread groups inside the block
    # (conv_gemm_relu's KW): batch-1 launches of a few dozen blocks, where a thread's
    # FMAs run one after another (Table 6: 56 blocks of 64 threads, 4.4 cycles an
    # instruction, 12 us; Nsight Compute).
    TileConfig(32, 32, 64, 4, 4, 2, kw=4),
    TileConfig(64, 64, 16, 4, 4, 1, kw=2),
    # cp.async pipelines (conv_gemm_relu_async): two blocks of 8 warps per SM at 128
    # registers, no split-K; for launches of a wave or more.
    TileConfig(128, 128, 8, 8, 8, 2, stages=4),
    TileConfig(64, 128, 16, 4, 8, 2, stages=4),
    # Three blocks per SM: at 80 registers ptxas spills about 100 bytes, yet the 1x1
    # launches ran 14-17% faster than with two blocks (3b and 4e at batch 128; the
    # 3x3 launches 1-3% slower). The tuner picks it where it wins.
    TileConfig(64, 128, 16, 4, 8, 3, stages=4, spill_ok=128),
    # The cp.async pipeline with 3xTF32 products on the tensor cores
    # (conv_gemm_relu_tc): weights pre-split in fragment order (tc_frag_weights), B's
    # rows padded by 8 floats, stages in dynamic shared memory (tc_smem_bytes: 49 to
    # 50 KB in the first two). Other depths and K steps ran within 2% of these or
    # slower (3b, batches 32 and 128, H100). NVRTC 12.9 spills 8 bytes in the first
    # two at 128 registers; nvcc 13.0 (and the device's NVRTC 13) none.
    TileConfig(128, 128, 8, 8, 8, 2, stages=4, spill_ok=8, tc=True),
    TileConfig(64, 128, 16, 4, 8, 2, stages=3, spill_ok=8, tc=True),
    # Three blocks per SM, as a64x128b3 (the 1x1 launches): BK = 8, 80 registers,
    # 8 bytes of spills with nvcc 13 as well.
    TileConfig(64, 128, 8, 4, 8, 3, stages=4, spill_ok=8, tc=True),
)
# Relative speed of a block-tile's FMAs: the median over a sweep of every Inception
# block at batch 32 and 128, each launch with each configuration forced (H100,
# `python -m tsm_apps.inception.bench --sweep`), of modelled / measured time,
# relative to 128x128 (a64x128: its BK = 16 form, estimated from a smaller sweep).
# The model's pick lost 7% in total against the measured best
# over that sweep (up to 25% on one launch), hence the tuning of large launches.
_EFFICIENCY = {"128x128": 1.0, "128x64": 1.11, "64x128": 0.94, "64x64": 1.03, "32x32": 0.62,
               "64x64d16": 1.03, "32x32d32": 0.62,  # as their twins (not swept; the tuner picks)
               "32x32w4": 0.62, "64x64w2": 1.03,
               "a128x128": 1.45, "a64x128": 1.15, "a64x128b3": 1.15,
               # the t-tiles: their FMA twins' times 1.25 (H100: the tuner's
               # t-picks ran 1.22-1.27x faster than its a-picks per block).
               "t128x128": 1.8, "t64x128": 1.45, "t64x128b3": 1.45}


def all_names() -> list:
    """Every kernel instantiation the launcher can pick (for compile checks)."""
    return [c.name for c in CONFIGS]


TC_ROWS = 128  # tc_frag_weights pads M to whole tiles of the largest t-tile (BM)
TC_DEPTH = 16  # ... and K to whole stages of the deepest one (BK)


# Whether the tensor-core configurations are candidates of the model and the tuner
# (``TSM_CONV_TC=0`` leaves them out, for a float32-FMA-only run). On the H100
# the tuner picked them for every launch at batch 32 and 128, 1.2-1.3x
# faster than the FMA tiles' picks in device time, errors against float64 up to 8e-6
# (cuDNN's 1.3e-6). ``TSM_CONV_TILE=t128x128`` forces one.
TC_CANDIDATES = True

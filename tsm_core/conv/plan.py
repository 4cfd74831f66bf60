"""Planning a convolution group's launch without a GPU: K chunks (split-K), the
weights and gather tables in the layout each kernel reads, and the model that picks
a tile configuration (``choose_config``) where the group is not tuned."""

from __future__ import annotations

import numpy as np

from tsm_core.conv.configs import (_EFFICIENCY, CONFIGS, KIND_RXR, KIND_RXRT, TC_CANDIDATES,
                                   TC_DEPTH, TC_ROWS, TileConfig)
from tsm_core.runtime import config as _config
from tsm_core.runtime import device as _device

def split_k(k: int, bk: int, splits: int) -> tuple:
    """(chunks, chunk length) for K = k cut in at most `splits` chunks of a multiple of bk."""
    if k <= 0:  # a max-pool segment: one block per tile, no K steps
        return 1, bk
    splits = max(1, min(int(splits), -(-k // bk)))
    chunk = -(-(-(-k // splits)) // bk) * bk
    return -(-k // chunk), chunk


def pad_rows4(wt: np.ndarray) -> np.ndarray:
    """(K, M) weights with zero columns appended up to a multiple of 4: the layout
    ``conv_gemm_relu_async`` reads (row stride (M + 3) // 4 * 4)."""
    K, M = wt.shape
    out = np.zeros((K, -(-M // 4) * 4), np.float32)
    out[:, :M] = wt
    return out


def tc_frag_weights(wt: np.ndarray) -> np.ndarray:
    """(K, M) float32 weights as the tensor-core tiles read them: split into TF32 hi
    and lo parts once (as ``tf32_low`` in common.cuh splits an operand: hi the value
    itself, which the MMA truncates; lo the rest, biased by half a TF32 unit so the
    MMA's truncation rounds it) and laid out in mma.m16n8k8 A-fragment order.

    Flat float32 array of (Kp / 8) x (Mp / 16) fragments of 256 floats (Kp = K up to a
    multiple of TC_DEPTH, Mp = M up to a multiple of TC_ROWS, zero-filled): fragment
    (kg, mg) covers rows k = 8 kg .. 8 kg + 7 and m = 16 mg .. 16 mg + 15; lane
    l = 4 g + t holds W[8 kg + t][16 mg + g], W[.. + t][.. + g + 8], W[.. + t + 4][.. + g],
    W[.. + t + 4][.. + g + 8], hi parts at 4 l .. 4 l + 3 and lo parts at 128 + 4 l ...
    The fragments of one k-group are consecutive in m, so a tile's stage copies
    BK / 8 runs of BM * 16 floats.
    """
    wt = np.asarray(wt, np.float32)
    K, M = wt.shape
    Kp, Mp = -(-K // TC_DEPTH) * TC_DEPTH, -(-M // TC_ROWS) * TC_ROWS
    w = np.zeros((Kp, Mp), np.float32)
    w[:K, :M] = wt
    bits = w.view(np.uint32)
    hi = (bits & np.uint32(0xFFFFE000)).view(np.float32)
    with np.errstate(invalid="ignore"):
        lo = ((w - hi).view(np.uint32) + np.uint32(0x1000)).astype(np.uint32)
    lo[w == 0] = 0  # a zero (padding) stays zero in both parts
    # (kg, t4, t, mg, h, g) with k = 8 kg + 4 t4 + t and m = 16 mg + 8 h + g
    def frag(a):
        a = a.reshape(Kp // 8, 2, 4, Mp // 16, 2, 8)
        # -> (kg, mg, g, t, [a0 a1 a2 a3] = (t4, h) in order (0,0) (0,1) (1,0) (1,1))
        return a.transpose(0, 3, 5, 2, 1, 4).reshape(Kp // 8, Mp // 16, 128)
    out = np.empty((Kp // 8, Mp // 16, 256), np.uint32)
    out[..., :128] = frag(bits)
    out[..., 128:] = frag(lo)
    return out.reshape(-1).view(np.float32)


def tap_major(seg) -> bool:
    """Whether the tensor-core tiles run R x R segment `seg` with K in tap-major order
    (k = tap * Cin + ci, kernel kind KIND_RXRT): Cin a multiple of every t-tile's BK
    (TC_DEPTH), so that a k-tile is one tap. Its gather then costs a table entry
    per stage instead of one per element (conv.cu, conv_load_stage)."""
    return seg.kind == KIND_RXR and seg.cin % TC_DEPTH == 0


def tap_major_order(cin: int, r: int) -> np.ndarray:
    """Row k' = tap * Cin + ci of the tap-major order is row ci * R*R + tap of the
    channel-major one (`_segments`' weights, `packed_taps`): the permutation."""
    tap, ci = np.divmod(np.arange(cin * r * r), cin)
    return ci * r * r + tap


def layout_weights(seg, layout: str) -> np.ndarray:
    """A segment's (K, M) weights as a kernel reads them: "plain"; "pad4", rows padded
    with zeros to a multiple of 4 (the async kernel's 16-byte copies); "tc", split and
    in fragment order (`tc_frag_weights`), K tap-major where `tap_major`."""
    if layout == "tc":
        wt = seg.wt[tap_major_order(seg.cin, seg.r)] if tap_major(seg) else seg.wt
        return tc_frag_weights(wt)
    return {"plain": lambda a: a, "pad4": pad_rows4}[layout](seg.wt)


def segment_table(seg, cfg, H: int, W: int):
    """The gather table of R x R segment `seg` for tile `cfg` at H x W (None for other
    kinds): `packed_taps` for the cp.async tiles (tap-major on the tensor-core tiles
    where `tap_major`), `gather_table` for the register ones."""
    if seg.kind != KIND_RXR:
        return None
    if not cfg.stages:
        return gather_table(seg.cin, seg.r, H, W)
    return packed_taps(seg.cin, seg.r, H, W, tap_major=bool(cfg.tc) and tap_major(seg))


def segment_kind(seg, cfg) -> int:
    """The kernel's kind of `seg` on tile `cfg` (KIND_RXRT where `tap_major`)."""
    return KIND_RXRT if cfg.tc and tap_major(seg) else seg.kind


def tc_smem_bytes(cfg) -> int:
    """Dynamic shared memory of a tensor-core tile's launch: STAGES stages of A (hi and
    lo parts, BK x 2 BM floats) and B (BK x (BN + 8) floats)."""
    return cfg.stages * cfg.bk * (2 * cfg.bm + cfg.bn + 8) * 4


def packed_taps(cin: int, r: int, H: int, W: int, tap_major: bool = False) -> np.ndarray:
    """(Cin*R*R,) int32: (ci*H*W + dy*W + dx) << 6 | (ky*R + kx), the R x R gather of
    ``conv_gemm_relu_async`` (one load per k; the tap index selects the pixel's
    inside-the-image bit), k channel-major (k = ci*R*R + tap) or, with `tap_major`,
    tap-major (`tap_major_order`). Raises ValueError where it cannot be packed (see
    async_ok)."""
    if r * r > 64:
        raise ValueError(f"R = {r}: the async kernel's tap mask holds R*R <= 64 taps")
    k = np.arange(cin * r * r)
    ci, tap = np.divmod(k, r * r)
    ky, kx = np.divmod(tap, r)
    off = ci * H * W + (ky - r // 2) * W + (kx - r // 2)
    if off.size and np.abs(off).max() >= 2**25:
        raise ValueError("input channels x H x W too large for the packed 26-bit offsets")
    packed = ((off << 6) | tap).astype(np.int32)
    return packed[tap_major_order(cin, r)] if tap_major else packed


def async_ok(segments, H: int, W: int) -> bool:
    """Whether ``conv_gemm_relu_async`` can run these segments: R*R <= 64 and
    Cin*H*W < 2**25 for every R x R convolution (its packed gather table)."""
    return all(s.kind != KIND_RXR or (s.r * s.r <= 64 and (s.cin + 1) * H * W < 2**25)
               for s in segments)


def gather_table(cin: int, r: int, H: int, W: int) -> np.ndarray:
    """(Cin*R*R, 4) int32 rows {ci*H*W + dy*W + dx, dy, dx, 0} of an R x R convolution."""
    k = np.arange(cin * r * r)
    ci, rem = np.divmod(k, r * r)
    dy, dx = np.divmod(rem, r)
    dy, dx = dy - r // 2, dx - r // 2
    tab = np.zeros((k.size, 4), np.int64)
    tab[:, 0] = ci * H * W + dy * W + dx
    tab[:, 1], tab[:, 2] = dy, dx
    if np.abs(tab).max(initial=0) >= 2**31:
        raise ValueError("input channels x H x W too large for 32-bit gather offsets")
    return tab.astype(np.int32)


def tc_candidates() -> bool:
    """Whether the tensor-core configurations take part in the model's pick and tuning."""
    return _config.flag("TSM_CONV_TC", default=TC_CANDIDATES)


def candidates(segments, H: int, W: int, allow_tc: bool = True) -> list:
    """The configurations the model and the tuner choose among for these segments at
    H x W: all of `CONFIGS`, less the async ones where `async_ok` fails and the
    tensor-core ones unless the device runs them (`allow_tc`) and `tc_candidates`."""
    ok_async = async_ok(segments, H, W)
    tc = allow_tc and tc_candidates()
    return [c for c in CONFIGS if (ok_async or not c.stages) and (tc or not c.tc)]


def _tc_ok(device: int) -> bool:
    """Whether the device runs the tensor-core configurations (mma.tf32: sm_80 and up)."""
    return _device.attribute("ComputeCapabilityMajor", device) >= 8


def choose_config(segments, ncols: int, sm_count: int, allow_async: bool = True,
                  allow_tc: bool = True) -> TileConfig:
    """The candidate with the least modelled time (a model, not a measurement).

    Per SM: ceil(blocks / SMs) block-tiles of BM*BN*K FMAs, at 128 FMA lanes times
    the tile's efficiency, times the fraction of the four schedulers the resident
    warps can keep busy (a lone 64-thread block feeds only two). Small batches so
    pick small tiles (more SMs busy), large batches large ones.
    ``TSM_CONV_TILE=BMxBN`` (e.g. ``128x64``, ``a128x128``) forces a candidate, for
    tuning sweeps. `allow_async`: whether the async configurations may run (`async_ok`);
    `allow_tc`: whether the tensor-core ones may (`_tc_ok`).
    """
    forced = _config.text("TSM_CONV_TILE")
    if forced:
        for cfg in CONFIGS:
            if cfg.tag == forced:
                if cfg.stages and not allow_async:
                    raise ValueError(f"TSM_CONV_TILE={forced!r}: the async kernel cannot run "
                                     "this group (see async_ok)")
                if cfg.tc and not allow_tc:
                    raise ValueError(f"TSM_CONV_TILE={forced!r}: the tensor-core tiles need "
                                     "compute capability 8.0 or later")
                return cfg
        raise ValueError(f"TSM_CONV_TILE={forced!r}: not one of {[c.tag for c in CONFIGS]}")
    best, best_t = None, None
    for cfg in CONFIGS:
        if (cfg.stages and not allow_async) or (cfg.tc and not (allow_tc and tc_candidates())):
            continue
        ntile = -(-ncols // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in segments)
        work = sum(-(-s.m // cfg.bm) * ntile * s.k for s in segments) / max(blocks, 1)
        per_sm = -(-blocks // sm_count)
        resident = min(per_sm, cfg.minb)
        busy = min(1.0, resident * cfg.threads / 32 / 4)
        t = per_sm * cfg.bm * cfg.bn * work / (128 * _EFFICIENCY[cfg.tag] * busy)
        if best_t is None or t < best_t * 0.999:
            best, best_t = cfg, t
    return best

"""Grouped same-padding convolutions with bias and ReLU, one launch per group
(``conv/conv.cu``): the engine under ``apps/inception``.

Public names (re-exported lazily by ``tsm_core``): ``ConvGroup``, ``ConvSpec``,
``MaxPoolSpec``.

A `ConvGroup` is a list of `ConvSpec` convolutions (stride 1, odd R x R kernel,
padding R // 2, optionally a 3x3 stride-1 max-pool of the input first) and
`MaxPoolSpec` max-pools, each reading an NCHW float32 tensor named by a slot and
writing into a channel slice of other named tensors (relu(conv + bias) for a
convolution, the pooled input for a max-pool). Calling the group with those
tensors runs all of it in ONE kernel launch:

- 1x1 convolutions that read the same slot become one GEMM over their
  concatenated weights (the rows split into parts, each stored in its own
  destination slice);
- R x R convolutions are implicit GEMMs: the input patch is gathered while a
  shared-memory tile is loaded (no im2col buffer);
- a pooled convolution max-pools while loading its GEMM tile; a `MaxPoolSpec`
  writes the pooled tensor instead (no GEMM), for a plain 1x1 in a later launch:
  four times faster at large batches (the Inception block uses this form);
- bias and ReLU are applied in the epilogue, which writes straight into the
  destination's channel slice (a concatenation costs nothing);
- where the launch would leave SMs idle (small batches), K is cut into chunks
  (split-K) and the last block of each tile adds the partials in a fixed order,
  in the same launch (`ConvGroup.choose_splits`).

Tiles: BM x BN per block from `CONFIGS`: the register-staged kernel's 128x128 down
to 32x32 (8x8 or 4x4 per thread, split-K), and the cp.async kernel's a128x128 /
a64x128 / a64x128b3 (two or three blocks per SM, no split-K). The first call at a
size times them all and keeps the fastest (`ConvGroup.autotune`; with
``TSM_CONV_TUNE=0``, `choose_config`'s model picks).

NaN: the max-pool and ReLU use fmaxf, which returns the other operand of a NaN
(torch propagates it); finite inputs give the same results.

Slots: a call binds up to five CUDA tensors (CuPy arrays, C-contiguous NCHW
float32) by name; descriptors (weights, biases, gather tables, tile map, split-K
workspace and counters) live in device memory, built once per (device, batch, H, W)
and reused, so a call uploads nothing; the launch's argument block is built once
too. The split-K workspace and the argument block are per group: one group must
not run on two streams, or from two host threads, at once.
"""
from __future__ import annotations

import numpy as np

from tsm_core.batched import api as _batched
# The family's names as they were all in this module (apps, tests and benches read
# them here): configs, specs, plan and tune re-exported.
from tsm_core.conv.configs import (CONFIGS, F_BIAS, F_CIN, F_CNT, F_K, F_KCHUNK, F_KIND, F_M,
                                   F_MTILES, F_NPARTS, F_PART0, F_SPLITS, F_SRC, F_TAB,
                                   F_TILE0, F_W, F_WS, FAMILY, KIND_1X1, KIND_MAXPOOL,
                                   KIND_POOL, KIND_RXR, KIND_RXRT, MAX_PARTS, MAX_SLOTS,
                                   MAX_SPLITS, NF, TileConfig, all_names)  # noqa: F401
from tsm_core.conv.plan import (_tc_ok, async_ok, candidates, choose_config, gather_table,
                                layout_weights, packed_taps, pad_rows4, segment_kind,
                                segment_table, split_k, tap_major, tap_major_order,
                                tc_candidates, tc_frag_weights, tc_smem_bytes)  # noqa: F401
from tsm_core.conv.specs import ConvSpec, MaxPoolSpec, _segments  # noqa: F401
from tsm_core.conv.tune import TUNE_AGREE, TUNE_MIN_COLUMNS, launch_ms, rel_diff
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config as _config
from tsm_core.runtime.device import sm_count as _sm_count
from tsm_core.runtime.launch import func_ptr
from tsm_core.runtime.log import get_logger

__all__ = ["ConvGroup", "ConvSpec", "MaxPoolSpec", "TileConfig"]

_log = get_logger(__name__)

class ConvGroup:
    """Several same-padding convolutions + bias + ReLU on NCHW float32, one launch.

    Parameters
    ----------
    specs : list of ConvSpec
        At most 4 distinct slot names among their inputs and outputs.
    channels : dict, optional
        Channel count of each destination slot's tensor (default: the highest channel
        any spec writes there); needed when other launches fill the rest of it.
    config : TileConfig or None
        Force a tile configuration (default: `choose_config` per batch and image size).
    tune : bool or None
        Time every configuration on the first call at a size of at least
        TUNE_MIN_COLUMNS GEMM columns and keep the fastest (`autotune`). Default:
        on unless ``TSM_CONV_TUNE=0``.

    Raises
    ------
    ValueError
        No specs, more than `MAX_SLOTS` distinct slot names, or ``channels`` for a
        slot that is not a destination or with fewer channels than the group writes
        there. Calling the group raises ValueError for tensors that disagree with it
        (`check`).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core import ConvGroup
    >>> from tsm_core.conv.api import ConvSpec
    >>> rng = np.random.default_rng(0)
    >>> w1, b1 = rng.standard_normal((8, 4, 1, 1)), rng.standard_normal(8)
    >>> w3, b3 = rng.standard_normal((6, 4, 3, 3)), rng.standard_normal(6)
    >>> g = ConvGroup([ConvSpec(w1, b1, "x", ("y", 0)), ConvSpec(w3, b3, "x", ("y", 8))])
    >>> g.slots
    ('x', 'y')
    >>> for line in g.describe(1, 8, 8).splitlines()[1:]:  # the plan; no GPU needed
    ...     print(line)
      3x3 implicit GEMM on x: M=6 K=36 -> y[8:]
      1x1 on x: M=8 K=4 -> y[0:]

    With a GPU, calling the group with CuPy arrays runs it in one launch:

    >>> import cupy as cp  # doctest: +SKIP
    >>> x = cp.random.standard_normal((2, 4, 8, 8), dtype=cp.float32)  # doctest: +SKIP
    >>> y = cp.empty((2, 14, 8, 8), cp.float32)  # doctest: +SKIP
    >>> g({"x": x, "y": y})  # doctest: +SKIP
    """

    def __init__(self, specs, *, channels: dict | None = None, config: TileConfig | None = None,
                 tune: bool | None = None):
        specs = list(specs)
        if not specs:
            raise ValueError("a ConvGroup needs at least one convolution")
        names = []
        for sp in specs:
            for n in [sp.src] + [s for s, _, _ in sp.dst]:
                if n not in names:
                    names.append(n)
        if len(names) > MAX_SLOTS:
            raise ValueError(f"at most {MAX_SLOTS} tensors per group; got {names}")
        self.specs = specs
        self.slots = tuple(names)
        self.segments = _segments(specs)
        self.config = config
        self.tune = tune  # None: TSM_CONV_TUNE decides (default on)
        # Channels each slot must have at least (inputs exactly Cin).
        self._need = {}
        for sp in specs:
            for s, o, r in sp.dst:
                self._need[s] = max(self._need.get(s, 0), o + r)
        for s, c in (channels or {}).items():
            if s not in self._need or c < self._need[s]:
                raise ValueError(f"channels[{s!r}] = {c}: not a destination, or fewer channels "
                                 f"than the group writes ({self._need.get(s)})")
            self._need[s] = int(c)
        self._cin = {sp.src: sp.cin for sp in specs}
        self._weights = {}  # device -> [(wt, bias, table) per segment] kept alive
        self._plans = {}  # (device, n, H, W) -> plan(): kernel, descriptors, grid, ...
        self._launches = {}  # (device, n, H, W) -> _GroupLaunch of that plan
        self._checked = {}  # slot layouts seen -> (n, H, W): `_dims`

    @property
    def flops_per_pixel(self) -> int:
        """2 * K * M summed over segments: FLOPs per output pixel of one image."""
        return sum(2 * s.k * s.m for s in self.segments)

    def describe(self, n: int, H: int, W: int, sm_count: int | None = None) -> str:
        """The launch in words: segments (GEMM shapes, parts) and its tile: the one in use
        where this size has run on the current GPU (tuned, or forced), else the model's
        pick (for the current GPU's SM count, or an H100's 132 where there is no GPU)."""
        from tsm_core.runtime.arrays import has_gpu

        cfg, how = None, "the model's pick"
        if self.tuning_wanted(n, H, W):
            how += "; the first call at this size tunes it"
        tc = True  # an H100's, where there is no GPU
        if has_gpu():
            import cupy

            tc = _tc_ok(cupy.cuda.Device().id)
        if sm_count is None:
            sm_count = 132
            if has_gpu():
                dev = cupy.cuda.Device().id
                sm_count = _sm_count(dev)
                p = self._plans.get((dev, n, H, W))
                if p is not None:
                    cfg, how = p[4], "in use"
        if cfg is None and self.config is not None:
            cfg, how = self.config, "forced"
        if cfg is None:
            cfg = choose_config(self.segments, n * H * W, sm_count, async_ok(self.segments, H, W),
                                tc)
        desc = self.descriptors(n, H, W, cfg)
        names = {KIND_1X1: "1x1", KIND_POOL: "maxpool3x3+1x1", KIND_RXR: "conv",
                 KIND_MAXPOOL: "maxpool3x3"}
        lines = [f"one launch, tile {cfg.tag} ({cfg.bm}x{cfg.bn}x{cfg.bk}, {cfg.threads} threads"
                 f"{f', cp.async {cfg.stages} stages' if cfg.stages else ''}"
                 f"{', 3xTF32 tensor cores' if cfg.tc else ''}; {how}), "
                 f"{self.grid_size(desc, n, H, W, cfg)} blocks for N*H*W = {n * H * W} columns:"]
        for seg in self.segments:
            kind = names[seg.kind] if seg.kind != KIND_RXR else f"{seg.r}x{seg.r} implicit GEMM"
            if segment_kind(seg, cfg) == KIND_RXRT:
                kind += " (K tap-major)"
            parts = ", ".join(f"{slot}[{off}:]" for _, slot, off in seg.parts)
            lines.append(f"  {kind} on {seg.src}: M={seg.m} K={seg.k} -> {parts}")
        return "\n".join(lines)

    def _device_weights(self, dev: int, layout: str = "plain"):
        """Per segment (weights, bias) on GPU `dev`, the weights in `layout`: "plain"
        (K, M); "pad4", rows padded with zeros to a multiple of 4 (the async kernel's
        16-byte copies); "tc", split and in fragment order (`tc_frag_weights`)."""
        import cupy

        w = self._weights.get((dev, layout))
        if w is None:
            w = [(cupy.asarray(layout_weights(s, layout)), cupy.asarray(s.bias))
                 for s in self.segments]
            self._weights[dev, layout] = w
        return w

    @staticmethod
    def weight_layout(cfg: TileConfig) -> str:
        """The `_device_weights` layout `cfg`'s kernel reads."""
        return "tc" if cfg.tc else "pad4" if cfg.stages else "plain"

    def descriptors(self, n: int, H: int, W: int, cfg: TileConfig, pointers=None,
                    splits=None) -> np.ndarray:
        """The (segments, NF) int64 descriptor table of a batch of n H x W images.

        `pointers`: per segment (weights, bias, gather table, split-K workspace,
        split-K counters) device addresses; zeros when None (for inspection and the
        CPU emulation in the tests). `splits`: K chunks per segment (default 1 each).
        """
        ncols = n * H * W
        ntile = -(-ncols // cfg.bn)
        desc = np.zeros((len(self.segments), NF), np.int64)
        tile0 = 0
        for i, seg in enumerate(self.segments):
            mt = -(-seg.m // cfg.bm)
            one = splits is None or not cfg.splittable
            sp, chunk = split_k(seg.k, cfg.bk, 1 if one else splits[i])
            row = desc[i]
            row[F_KIND] = segment_kind(seg, cfg)
            row[F_SRC] = self.slots.index(seg.src)
            row[F_CIN], row[F_K], row[F_M] = seg.cin, seg.k, seg.m
            if pointers is not None:
                row[F_W], row[F_BIAS], row[F_TAB], row[F_WS], row[F_CNT] = pointers[i]
            row[F_TILE0], row[F_MTILES] = tile0, mt
            row[F_SPLITS], row[F_KCHUNK] = sp, chunk
            row[F_NPARTS] = len(seg.parts)
            for j, (first, slot, off) in enumerate(seg.parts):
                row[F_PART0 + 4 * j: F_PART0 + 4 * j + 4] = (
                    first, self.slots.index(slot), self._need[slot], off)
            tile0 += mt * ntile * sp
        if tile0 >= 2**31:
            raise ValueError("batch too large: more than 2**31 - 1 tiles")
        return desc

    @staticmethod
    def grid_size(desc: np.ndarray, n: int, H: int, W: int, cfg: TileConfig) -> int:
        last = desc[-1]
        return int(last[F_TILE0] + last[F_MTILES] * last[F_SPLITS] * -(-(n * H * W) // cfg.bn))

    def choose_splits(self, n: int, H: int, W: int, cfg: TileConfig, sm_count: int) -> list:
        """K chunks per segment: 1 unless the launch would leave most SMs idle.

        With fewer blocks than SMs each block's time is its K steps' latency
        (batch 1); cutting K in s chunks gives s times the blocks, each s times
        shorter, for the price of a partial-tile round trip through L2. Chunks keep
        at least 8 K steps. ``TSM_CONV_SPLITK=s`` forces s (for tests and tuning).
        """
        ntile = -(-(n * H * W) // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in self.segments)
        if not cfg.splittable:  # every segment in one chunk
            want = [1] * len(self.segments)
        elif _config.raw("TSM_CONV_SPLITK") is not None:
            want = [_config.integer("TSM_CONV_SPLITK")] * len(self.segments)
        else:
            s = 1 if blocks >= sm_count else min(MAX_SPLITS, max(1, (2 * sm_count) // blocks))
            want = [min(s, max(1, seg.k // (8 * cfg.bk))) for seg in self.segments]
        return [split_k(seg.k, cfg.bk, w)[0] for seg, w in zip(self.segments, want)]

    def split_variants(self, n: int, H: int, W: int, cfg: TileConfig, sm_count: int) -> list:
        """The K chunkings the tuner times for `cfg`: `choose_splits`'s first, then, for
        a `splittable` tile whose launch is less than a wave (fewer blocks than SMs
        times the blocks an SM holds), every segment cut in s = 1, 2, 3, 4, 6, 8
        chunks of at least two K steps. Such a launch is bound by the latency of its
        blocks' serial work, which the model's rule of at least 8 steps a chunk
        leaves alone."""
        out = [self.choose_splits(n, H, W, cfg, sm_count)]
        if not cfg.splittable or _config.raw("TSM_CONV_SPLITK") is not None:
            return out
        ntile = -(-(n * H * W) // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in self.segments)
        if blocks >= sm_count * cfg.minb:
            return out
        for s in (1, 2, 3, 4, 6, 8):
            sp = [split_k(seg.k, cfg.bk, min(s, max(1, seg.k // (2 * cfg.bk))))[0]
                  for seg in self.segments]
            if sp not in out and all(max(sp) != max(o) for o in out[1:]):  # one per label
                out.append(sp)
        return out

    def tune_label(self, cfg: TileConfig, splits, n: int, H: int, W: int, sm_count: int) -> str:
        """`autotune`'s name for `cfg` with K chunks `splits` (None: the model's) at n
        H x W images: the tag, or ``tag/kS`` (S the most chunks of a segment) where
        the chunks are not `choose_splits`'s."""
        base = self.choose_splits(n, H, W, cfg, sm_count)
        return cfg.tag if splits is None or list(splits) == base else f"{cfg.tag}/k{max(splits)}"

    def plan(self, n: int, H: int, W: int):
        """(kernel, descriptor array, grid, block, config, kept arrays, K chunks per segment,
        dynamic shared memory bytes)
        for n H x W images, made on first use and kept: the model's configuration
        (`choose_config`), or the measured fastest where a call has tuned it."""
        import cupy

        dev = cupy.cuda.Device().id
        key = (dev, n, H, W)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self._build(
                self.config or choose_config(self.segments, n * H * W, _sm_count(dev),
                                             async_ok(self.segments, H, W), _tc_ok(dev)), n, H, W)
        return p

    def _build(self, cfg: TileConfig, n: int, H: int, W: int, splits=None):
        import cupy

        dev = cupy.cuda.Device().id
        biggest = max(list(self._need.values()) + list(self._cin.values())) * n * H * W
        if biggest >= 2**31:
            raise ValueError(f"tensors of {biggest} elements: the kernel indexes with 32 bits "
                             "(split the batch)")
        if splits is None:
            splits = self.choose_splits(n, H, W, cfg, _sm_count(dev))
        ntile = -(-(n * H * W) // cfg.bn)
        keep, ptrs = [], []
        for seg, sp, (wt, bias) in zip(self.segments, splits,
                                       self._device_weights(dev, self.weight_layout(cfg))):
            tab = ws = cnt = 0
            if seg.kind == KIND_RXR:
                t = cupy.asarray(segment_table(seg, cfg, H, W))
                keep.append(t)
                tab = t.data.ptr
            if sp > 1:
                tiles = -(-seg.m // cfg.bm) * ntile
                w = cupy.empty(tiles * sp * cfg.bm * cfg.bn, np.float32)
                c = cupy.zeros(tiles, np.int32)  # the kernel leaves them at zero again
                keep += [w, c]
                ws, cnt = w.data.ptr, c.data.ptr
            ptrs.append((wt.data.ptr, bias.data.ptr, tab, ws, cnt))
        desc = self.descriptors(n, H, W, cfg, ptrs, splits)
        grid = self.grid_size(desc, n, H, W, cfg)
        kern = _compile.get_kernel(FAMILY, cfg.name)
        smem = tc_smem_bytes(cfg) if cfg.tc else 0
        if smem > 48 * 1024 and getattr(kern, "max_dynamic_shared_size_bytes", 0) < smem:
            kern.max_dynamic_shared_size_bytes = smem
        return (kern, cupy.asarray(desc), (grid,), (cfg.threads,), cfg, keep, tuple(splits), smem)

    def tuning_wanted(self, n: int, H: int, W: int) -> bool:
        """Whether a first call at this size times the candidates (see `autotune`)."""
        if self.config is not None or _config.raw("TSM_CONV_TILE") is not None or \
                _config.raw("TSM_CONV_SPLITK") is not None:
            return False
        if not (self.tune if self.tune is not None else _config.flag("TSM_CONV_TUNE")):
            return False
        return n * H * W >= TUNE_MIN_COLUMNS

    def autotune(self, tensors: dict, reps: int = 5):
        """Time every candidate configuration (`candidates`) on `tensors` and keep the
        fastest for their size (the way ``torch.backends.cudnn.benchmark`` picks cuDNN's
        algorithm).

        Runs on the current stream and writes the group's outputs, as the kept
        configuration computes them. Each candidate's outputs are compared with the
        first's (`rel_diff`): one that differs by more than TUNE_AGREE is left out with
        a RuntimeWarning and not timed. Each configuration is timed with the K chunks
        of `split_variants`; returns {label: median ms}, the label the configuration's
        tag for `choose_splits`'s chunking and ``tag/kS`` for the others (S the most
        chunks of a segment). Called by the
        first call at a size of at least TUNE_MIN_COLUMNS columns (N*H*W) unless
        tuning is off (``ConvGroup(tune=False)`` or ``TSM_CONV_TUNE=0``); below that,
        and with a forced configuration, the model's choice stands.
        """
        import cupy

        n, H, W = self.check(tensors)
        dev = cupy.cuda.Device().id
        args_tail = [tensors[s] for s in self.slots]
        args_tail += [args_tail[0]] * (MAX_SLOTS - len(args_tail))
        times, best, best_tag, ref, first = {}, None, None, None, None
        stream = cupy.cuda.get_current_stream()
        written = [tensors[s] for s in self._need]
        sms = _sm_count(dev)
        tries = [(cfg, sp, self.tune_label(cfg, sp, n, H, W, sms))
                 for cfg in candidates(self.segments, H, W, _tc_ok(dev))
                 for sp in self.split_variants(n, H, W, cfg, sms)]
        for cfg, sp, tag in tries:
            p = self._build(cfg, n, H, W, sp)
            kern, desc, grid, block = p[:4]
            args = (desc, np.int32(len(self.segments)), *args_tail, np.int32(n), np.int32(H),
                    np.int32(W))
            if ref is not None:  # poison what the group writes: a skipped element shows
                for slot, c0, c1 in self._written_channels():
                    tensors[slot][:, c0:c1] = np.nan
            kern(grid, block, args, shared_mem=p[7])  # warm-up (and the module load)
            # Every candidate must compute what the first did: one that disagrees is
            # left out, with a warning (a safety net for configurations new to a GPU).
            if ref is None:
                ref, first = [w.copy() for w in written], tag
            else:
                diff = max((rel_diff(w, r) for w, r in zip(written, ref)), default=0.0)
                if not diff <= TUNE_AGREE:
                    import warnings

                    warnings.warn(f"ConvGroup.autotune: {tag} differs from {first} "
                                  f"by {diff:.2e} (relative): left out", RuntimeWarning,
                                  stacklevel=2)
                    continue
            times[tag] = launch_ms(lambda: kern(grid, block, args, shared_mem=p[7]), stream, reps)
            if best is None or times[tag] < times[best_tag]:
                best, best_tag = p, tag
        self._plans[dev, n, H, W] = best
        self._launches.pop((dev, n, H, W), None)
        # The outputs as the kept plan computes them (the last candidate run may have
        # been one left out).
        best[0](best[2], best[3], (best[1], np.int32(len(self.segments)), *args_tail,
                                   np.int32(n), np.int32(H), np.int32(W)), shared_mem=best[7])
        return times

    def _written_channels(self) -> list:
        """(slot, first channel, end channel) of every channel range the group writes."""
        out = []
        for seg in self.segments:
            for i, (row, slot, off) in enumerate(seg.parts):
                end = seg.parts[i + 1][0] if i + 1 < len(seg.parts) else seg.m
                out.append((slot, off, off + end - row))
        return out

    def check(self, tensors: dict):
        """(n, H, W) of the bound tensors; ValueError if any disagrees with the group."""
        n = H = W = None
        for name in self.slots:
            t = tensors.get(name)
            if t is None:
                raise ValueError(f"tensor for slot {name!r} missing")
            if t.ndim != 4 or t.dtype != np.float32 or not t.flags.c_contiguous:
                raise ValueError(f"slot {name!r}: need a C-contiguous 4-D float32 array; "
                                 f"got shape {t.shape}, {t.dtype}")
            if n is None:
                n, _, H, W = t.shape
            elif (t.shape[0], t.shape[2], t.shape[3]) != (n, H, W):
                raise ValueError(f"slot {name!r} has shape {t.shape}; batch and image size "
                                 f"must be {(n, H, W)} in every slot")
            c = t.shape[1]
            if name in self._cin and c != self._cin[name]:
                raise ValueError(f"slot {name!r} has {c} channels; its convolutions read {self._cin[name]}")
            if name in self._need and c != self._need[name]:
                raise ValueError(f"slot {name!r} has {c} channels; the group writes {self._need[name]}")
        return n, H, W

    def _dims(self, tensors: dict):
        """`check`, remembered per layout: (shape, strides, dtype) of every slot's array
        decide the result, so a layout seen before costs three attribute reads a slot."""
        try:
            sig = tuple([(t.shape, t.strides, t.dtype)
                         for t in map(tensors.__getitem__, self.slots)])
        except (KeyError, AttributeError):  # check says what is wrong
            return self.check(tensors)
        dims = self._checked.get(sig)
        if dims is None:
            dims = self.check(tensors)
            if len(self._checked) >= 16:
                self._checked.clear()
            self._checked[sig] = dims
        return dims

    def launcher(self, device: int, n: int, H: int, W: int):
        """The launch of this size on `device` (called as ``launch(ptrs, stream)``: raw
        device pointers, one per slot in `slots` order, and a raw stream), or None if
        the group has not run this size there yet (its tuned plan and argument block
        come with the first call). For callers that have validated their tensors
        themselves: the Inception block's torch path, with no DLPack views per call."""
        return self._launches.get((device, n, H, W))

    def __call__(self, tensors: dict, *, checked: bool = False):
        """Run the group on `tensors` (slot name -> CuPy array), on the current stream.

        `checked=True` skips `check` (the caller has validated the shapes already:
        the Inception forward does, once per call, for both of its groups). A group
        is launched through ``cuLaunchKernel`` with an argument block built once per
        size (its slot pointers rewritten per call): CuPy's kernel call spent 10 us
        of host time packing the ten arguments, a third of a batch-1 call (H100 host).
        """
        if checked:
            t0 = tensors[self.slots[0]]
            n, H, W = t0.shape[0], t0.shape[2], t0.shape[3]
        else:
            n, H, W = self._dims(tensors)
        if n * H * W == 0:
            return
        import cupy

        key = (cupy.cuda.runtime.getDevice(), n, H, W)
        launch = self._launches.get(key)
        if launch is None:
            if key not in self._plans and self.tuning_wanted(n, H, W):
                self.autotune(tensors)
            launch = self._launches[key] = _GroupLaunch(self.plan(n, H, W), len(self.segments),
                                                         n, H, W)
        launch([tensors[s].data.ptr for s in self.slots], cupy.cuda.get_current_stream().ptr)


class _GroupLaunch:
    """One plan's launch: the kernel handle, the grid and an argument block built once;
    a call writes the slots' pointers into it and calls ``cuLaunchKernel`` (CuPy's
    driver binding; CuPy's kernel call where that is missing). Like the split-K
    workspace, the block is per group: one group must not be called from two host
    threads at once."""

    __slots__ = ("plan", "fptr", "grid", "block", "smem", "slots", "vals", "ptrs", "addr", "args")

    def __init__(self, plan, nseg: int, n: int, H: int, W: int):
        import ctypes

        self.plan = plan  # keeps the descriptors and workspaces alive
        kern, desc, grid, block = plan[:4]
        self.fptr = func_ptr(kern)
        self.grid, self.block, self.smem = grid[0], block[0], plan[7]
        self.slots = [ctypes.c_void_p(0) for _ in range(MAX_SLOTS)]
        self.vals = (ctypes.c_void_p(desc.data.ptr), ctypes.c_int(nseg), *self.slots,
                     ctypes.c_int(n), ctypes.c_int(H), ctypes.c_int(W))
        self.ptrs = (ctypes.c_void_p * len(self.vals))(*[ctypes.addressof(v) for v in self.vals])
        self.addr = ctypes.addressof(self.ptrs)
        self.args = (desc, np.int32(nseg), np.int32(n), np.int32(H), np.int32(W))

    def __call__(self, ptrs: list, stream: int):
        # Slots past the group's own are never read by the kernel: they stay 0.
        if _batched._DIRECT[0]:
            for slot, ptr in zip(self.slots, ptrs):
                slot.value = ptr
            try:
                _batched._driver_launch()(self.fptr, self.grid, 1, 1, self.block, 1, 1,
                                          self.smem, stream, self.addr, 0)
                return
            except Exception:  # an older CuPy without it: its kernel call from now on
                _batched._DIRECT[0] = False
        ptrs = ptrs + [0] * (MAX_SLOTS - len(ptrs))
        desc, nseg, n, H, W = self.args
        with _batched._stream_from_ptr(stream):  # pointers as 8-byte integers
            self.plan[0]((self.grid,), (self.block,),
                         (desc, nseg, *[np.uint64(p) for p in ptrs], n, H, W),
                         shared_mem=self.smem)

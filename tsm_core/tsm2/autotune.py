"""The optional autotuner of the tall-and-skinny kernels, and the TSM2L profile's
measurement: everything in tsm2 that times kernels to choose or fit a figure.

``autotune(A, B)`` times the launcher's own configuration and its neighbourhood on the
caller's operands (a scratch output; the operands are only read) and keeps the fastest
in a :class:`TuneCache`: one JSON file per GPU (the one tuner's store,
:func:`tsm_core.runtime.tune.store`), keyed by algorithm, dtype, the orders of A and
B, a shape bucket (m and k rounded up to a power of two, n exact) and a hash of the
kernel sources. From then on every launch that brings no configuration of its own
(``matmul``, ``tsm2r``/``tsm2l`` with default arguments) uses the tuned one for every
problem of that bucket: the API hands :func:`tuned` to the launcher, which consults
it once per problem. ``TSM_AUTOTUNE=0`` ignores the cache.

What is searched, and why (the candidate values are data in ``tsm2/configs.py``):

* TSM2R v3: the split-K count (the measured bandwidth against it is jagged, not
  smooth: an H100 sweep of 2026-11-23) over 1..16 and a few larger counts, and for
  the row-major tensor-core kernels the block shape (t1, t3); where the launcher
  runs stream-K (tsm2r_v3x, 16 columns), stream-K against those split counts. A tuned
  count is stored as a number of *blocks* (row blocks x splits), so that it carries
  over to the other problems of its bucket, whose row-block counts differ.
* TSM2L: the thread count factor (stored as a number of blocks, for the same reason)
  and, for row-major A with short rows, whole-row warps (opt1w, with 1 to 8 load
  instructions per warp step) against shared-memory tiles; for column-major A,
  tsm2l_opt1d (A straight into registers; block shapes, C staged or not) against
  tsm2l_opt1's cp.async ring.

How candidates are compared (``choose``; the comment above it says why): every
one compiled and launched before anything is timed, interleaved rounds in rotated
order, samples of 1 ms or more on operands that miss L2, the fastest few timed again
with the default in fresh rounds, and a candidate replaces the launcher's own
configuration only where it is faster by 3% or by the rounds' spread, whichever is
larger, in most of those rounds. What is stored gives back, for the tuned problem,
exactly the launch that was timed.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config
from tsm_core.runtime import device as _device
from tsm_core.runtime import timing as _timing
from tsm_core.runtime import tune as _tune
from tsm_core.runtime.arrays import order_of
from tsm_core.runtime.checks import check_operands
from tsm_core.runtime.log import get_logger
from tsm_core.tsm2 import launch as _tsm2
from tsm_core.tsm2 import model as _model
from tsm_core.tsm2 import profile as _profile
from tsm_core.tsm2.configs import (OPT1D_SHAPES_TRIED, OPT1D_STAGE_TRIED, OPT1D_TCF_TRIED,
                                   OPT1W_U_TRIED, SPLITS_TRIED, TCF_TRIED)

_log = get_logger(__name__)
_memo: dict = {}  # device id -> its TuneCache


def enabled() -> bool:
    """Whether default launches use tuned configurations (``TSM_AUTOTUNE``)."""
    return bool(config.flag("TSM_AUTOTUNE"))


class TuneCache:
    """Tuned TSM2R/TSM2L parameters of one GPU on disk, in the one tuner's store
    (``tune-<gpu>.json`` under ``$TSM_CACHE_DIR`` or ~/.cache/tsm): written
    atomically and safely across processes.

    Key: algorithm, dtype, orders of A and B, a shape bucket (m and k rounded up to
    a power of two, n exact) and a hash of the kernel sources, so that editing a
    kernel re-opens its tuning. ``matmul``'s check of a kernel against cuBLAS keeps
    its verdicts here too, under keys of its own.

    Parameters
    ----------
    gpu_name : str
        The GPU's name, as it reports it.
    directory : str or pathlib.Path, optional
        Where the file lives (default: the cache folder).
    """

    def __init__(self, gpu_name: str, directory=None):
        self._store = _tune.store(gpu_name, directory)
        self.path = self._store.path

    @staticmethod
    def key(algorithm: str, dtype, a_order: str, b_order: str, m: int, k: int, n: int,
            source_hash: str) -> str:
        """The key of a problem's bucket."""
        return (f"{algorithm}|{np.dtype(dtype).name}|{a_order}{b_order}|"
                f"m{_model._pow2_ceil(m)}|k{_model._pow2_ceil(k)}|n{int(n)}|{source_hash}")

    @classmethod
    def key_for(cls, p, source_hash: str) -> str:
        """The key of a Plan's problem."""
        return cls.key(p.algorithm, p.dtype, p.a_order, p.b_order, p.m, p.k, p.n, source_hash)

    def _key(self, key) -> str:
        return key if isinstance(key, str) else self.key(*key)

    def get(self, key) -> dict | None:
        """{"params": {...}, "time_s": float} stored for `key` (a string from `key()`
        or the tuple of its arguments), or None."""
        return self._store.get(self._key(key))

    def put(self, key, params: dict, time_s: float, **info) -> None:
        """Store the parameters measured best for `key` and their time (merged into
        the file under its lock: entries other processes add at once are kept);
        `info` (JSON values: the default's time, the decision) is kept beside them."""
        self._store.update({self._key(key): dict(info, params=dict(params), time_s=float(time_s))})


def _orders(A, B, lay: _tsm2.ALayout) -> tuple[str, str]:
    b_f = B.flags.f_contiguous and not B.flags.c_contiguous
    return ("F" if lay.col else "C"), ("F" if b_f else "C")


def cache(device_id: int | None = None) -> TuneCache:
    """The TuneCache of a GPU (the current one by default), one per process."""
    import cupy

    dev = cupy.cuda.runtime.getDevice() if device_id is None else device_id
    c = _memo.get(dev)
    if c is None:
        c = _memo[dev] = TuneCache(_device.name(dev))
    return c


def _key(family: str, dtype, orders, m, k, n) -> str:
    return TuneCache.key(family, dtype, orders[0], orders[1], m, k, n, _compile.source_hash(family))


# ------------------------------------------------------------------ the TSM2L profile


def _time_launch(m: int, kb: int, dtype, a_order: str, seed: int) -> tuple[int, float]:
    """(bytes, median seconds) of the default TSM2L launch on (m, kb) @ (kb, kb)."""
    import cupy

    nbytes = (m * kb + kb * kb + m * kb) * np.dtype(dtype).itemsize
    sets = _timing.operand_sets(m, kb, kb, dtype, a_order, seed)

    def call(A, B, C):
        _tsm2.launch_tsm2l(A, B, C, 1.0, 0.0, None, tuned=False)  # the untuned default

    t = _timing.time_fn(_timing.cycling(call, sets), reps=15)
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
    return nbytes, t.median_s


def measure_tsm2l_profile(spec, dtype, a_order: str, kb: int) -> dict:
    """Measure the TSM2L line of the current GPU for one dtype, order of A and k
    bucket (see ``tsm2/profile.py``): two default launches, a small and a large one.
    Logs one line. Raises RuntimeError where the GPU streams too slowly to trust."""
    m_small, m_large = _profile.sizes(dtype, kb)
    _log.info("profiling TSM2L on %s (%s, A %s-ordered, k = n = %d; once, cached in %s) ...",
              spec.name, np.dtype(dtype).name, a_order, kb, _profile.store(spec.name).path)
    small = _time_launch(m_small, kb, dtype, a_order, seed=1)
    large = _time_launch(m_large, kb, dtype, a_order, seed=2)
    fixed, eff = _profile.fit(small, large, spec.peak_bw)
    if eff < _profile.MIN_EFF:
        raise RuntimeError(f"the large launch streamed at {eff:.0%} of the bandwidth: the GPU is busy")
    return dict(fixed_s=fixed, eff=eff, m_small=m_small, m_large=m_large, k=kb, n=kb,
                small=list(small), large=list(large), peak_bw=spec.peak_bw)


def tsm2l_profile(spec, dtype, a_order: str, k: int) -> dict | None:
    """The stored TSM2L profile, measured on first use on the GPU `spec` describes:
    what ``tsm_core.plan`` hands the model."""
    return _profile.tsm2l_profile(spec, dtype, a_order, k, measure=measure_tsm2l_profile)


# ------------------------------------------------------------------ parameters <-> configs


def tsm2r_params(cfg: _tsm2.TSM2RConfig, row_blocks: int) -> dict:
    # minb (stream-K's launch bounds) is stored: the launcher sets 3-4 blocks per SM
    # only for its own block shape, and read back with t1, t3 and rpt given it
    # would fall to 1 (another kernel than the one timed)
    return dict(t1=cfg.t1, t3=cfg.t3, u=cfg.u, stages=cfg.stages, tc=cfg.tc, rpt=cfg.rpt,
                groups=cfg.groups, rgroups=cfg.rgroups, blocks=row_blocks * cfg.splits,
                streamk=cfg.streamk, minb=cfg.minb)


def tsm2r_config(params: dict, m: int, k: int, n: int, dtype, lay) -> _tsm2.TSM2RConfig:
    """The configuration a stored entry means for this problem (splits from blocks)."""
    itemsize = np.dtype(dtype).itemsize
    cfg = _tsm2.TSM2RConfig(t1=params["t1"], t3=params["t3"], u=params.get("u", 0),
                            stages=params["stages"], tc=params["tc"], rpt=params["rpt"],
                            groups=params.get("groups", 0), rgroups=params.get("rgroups", 0), splits=1,
                            streamk=params.get("streamk", 0), minb=params.get("minb", 0))
    cfg = _tsm2.resolve_tsm2r(m, k, n, dtype, lay, cfg)
    if cfg.streamk == 1:  # one wave of its own: no split count
        return cfg
    row_blocks = -(-m // _tsm2.v3_rows(cfg, lay, itemsize))
    most = max(1, min(64, k // (4 * cfg.t3)))
    splits = min(most, max(1, round(params["blocks"] / row_blocks)))
    return replace(cfg, splits=splits)


def _tsm2l_tiles(cfg: _tsm2.TSM2LConfig, m, k, n, dtype, lay) -> int:
    r = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, replace(cfg, tcf=1))
    return -(-m // _tsm2.tsm2l_rows(r, lay))


def tsm2l_params(cfg: _tsm2.TSM2LConfig, m, k, n, dtype, lay) -> dict:
    """What is stored for a TSM2L configuration (opt, warp, the searched u, direct,
    stage, t1 and vec, and tcf as a block count: the launcher resolves the rest,
    and refuses a resolved opt1w configuration given back)."""
    out = dict(opt=cfg.opt, warp=cfg.warp, blocks=-(-_tsm2l_tiles(cfg, m, k, n, dtype, lay) // cfg.tcf))
    if cfg.u:
        out["u"] = cfg.u
    if cfg.direct == 1:  # tsm2l_opt1d: its block shape and C's staging are searched
        out.update(direct=1, stage=cfg.stage, t1=cfg.t1, vec=cfg.vec)
    return out


def tsm2l_config(params: dict, m: int, k: int, n: int, dtype, lay) -> _tsm2.TSM2LConfig:
    cfg = _tsm2.TSM2LConfig(opt=params["opt"], warp=params["warp"], u=params.get("u", 0),
                            direct=params.get("direct", 0), stage=params.get("stage", 0),
                            t1=params.get("t1", 0), vec=params.get("vec", 0))
    # No cap on tcf: the kernels walk their row tiles grid-stride, and the launcher's
    # own one-wave rule gives tcf in the hundreds at m = 1e7. A cap of 64 turned the
    # timed one-wave launch back into another one for the very problem it was timed
    # on (float32, column-major A, k = n = 12, as resolved for an H100: 132 blocks,
    # one per SM, became 153, a second wave of 21 blocks).
    tiles = _tsm2l_tiles(cfg, m, k, n, dtype, lay)
    return replace(cfg, tcf=max(1, -(-tiles // max(1, params["blocks"]))))


def stored_params(family: str, cfg, m: int, k: int, n: int, dtype, lay) -> dict:
    """What is stored for a timed candidate of this problem.

    Parameters
    ----------
    family : {"tsm2r", "tsm2l"}
    cfg : TSM2RConfig or TSM2LConfig
        The candidate as timed (a TSM2L tcf of 0: the launcher's one-wave rule).
    m, k, n, dtype, lay
        The problem, and A's layout (``launch.a_layout``).

    Returns
    -------
    dict
        ``tsm2r_params`` or ``tsm2l_params``: `tsm2r_config` / `tsm2l_config` give
        the launch that was timed back for this problem.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.tsm2 import launch
    >>> lay = launch.ALayout(col=True, lda=10**7, vec=4)
    >>> cfg = launch.TSM2LConfig(tcf=74)  # resolves to 132 blocks
    >>> p = stored_params("tsm2l", cfg, 10**7, 12, 12, np.float32, lay)
    >>> p["blocks"], tsm2l_config(p, 10**7, 12, 12, np.float32, lay).tcf
    (132, 74)
    """
    if family == "tsm2r":
        return tsm2r_params(cfg, -(-m // _tsm2.v3_rows(cfg, lay, np.dtype(dtype).itemsize)))
    if not cfg.tcf:  # a candidate sized by the launcher's own one-wave rule
        cfg = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, cfg)
    return tsm2l_params(cfg, m, k, n, dtype, lay)


def tuned(family: str, A, B, m: int, k: int, n: int, dtype, lay):
    """The tuned configuration for a default launch, or None (no entry, or tuning off).

    The launchers call it (handed over by the API) once per problem they resolve."""
    if not enabled():
        return None
    try:
        hit = cache().get(_key(family, dtype, _orders(A, B, lay), m, k, n))
    except OSError:
        return None
    if hit is None:
        return None
    try:
        make = tsm2r_config if family == "tsm2r" else tsm2l_config
        return make(hit["params"], m, k, n, dtype, lay)
    except (KeyError, TypeError, ValueError):  # an entry from another version: ignore it
        return None


# ------------------------------------------------------------------ comparing candidates
#
# Every candidate is timed under the same conditions as the default: all of them are
# compiled and launched once before anything is timed (a compile between two timings
# leaves the GPU idle and its clocks down), one untimed round follows, then rounds in
# which each candidate gives one sample, in an order rotated by one place per round
# (no candidate always goes first or follows the same neighbour; a drift of the GPU's
# speed reaches all alike). A sample is back-to-back calls lasting SAMPLE_S or more,
# on operands that miss L2 as in the benchmarks. The fastest few by the median of
# these rounds are then timed again with the default, in fresh rounds: the minimum of
# some 60 noisy medians is biased low, fresh samples of the finalists are not. A
# finalist replaces the default only if its median is lower by MARGIN or by the
# spread of either's rounds (interquartile range over median), whichever is larger,
# and it was faster in a majority of those rounds (each round's two samples were
# taken moments apart).

MARGIN = 0.03  # the least gain, as a fraction of the default's time, that replaces it
SAMPLE_S = 1e-3  # device time of one sample: enough calls back to back to last this long
MAX_BATCH = 1000  # calls per sample at most
FINALISTS = 3  # candidates besides the default timed again in the deciding rounds
MAX_SETS = 256  # operand copies at most (small problems: L2 is missed on the rest)


@dataclass(frozen=True)
class Verdict:
    """What :func:`choose` decided, with the times it decided on.

    Times are seconds per call: medians over the deciding rounds. ``medians``
    holds every candidate's median over the screening rounds."""

    index: int  # the candidate kept (``default`` where the default stays)
    default: int
    time_s: float
    default_time_s: float
    challenger: int | None  # the fastest finalist in the deciding rounds
    challenger_time_s: float | None
    wins: int  # deciding rounds in which the challenger beat the default
    rounds: int  # deciding rounds
    need: float  # the gain the challenger needed (fraction of the default's time)
    medians: tuple

    @property
    def kept_default(self) -> bool:
        return self.index == self.default

    def to_dict(self) -> dict:
        d = asdict(self)
        d["medians"] = list(self.medians)
        d["kept"] = "default" if self.kept_default else "candidate"
        return d


def _interleaved(sample, indices, rounds: int) -> dict:
    """``{i: [seconds per round]}``: `rounds` rounds in which ``sample(i)`` is called
    once for every i of `indices`, the order rotated by one place per round."""
    indices = list(indices)
    times: dict = {i: [] for i in indices}
    for r in range(rounds):
        for j in range(len(indices)):
            i = indices[(r + j) % len(indices)]
            times[i].append(float(sample(i)))
    return times


def _spread(samples) -> float:
    """Interquartile range over median of `samples` (0 for fewer than 3)."""
    ts = sorted(samples)
    if len(ts) < 3:
        return 0.0
    q1, med, q3 = statistics.quantiles(ts, n=4, method="inclusive")
    return (q3 - q1) / med if med > 0 else math.inf


def _decide(times: dict, default, *, margin: float = MARGIN, medians=()) -> Verdict:
    """The Verdict on per-round times ``{i: [seconds]}`` taken in the same rounds:
    the fastest other candidate replaces `default` only if its median is lower by
    ``max(margin, spread of either)`` and it was faster in most rounds."""
    med = {i: statistics.median(t) for i, t in times.items()}
    d = times[default]
    others = [i for i in times if i != default]
    if not others:
        return Verdict(default, default, med[default], med[default], None, None, 0, len(d), margin,
                       tuple(medians))
    c = min(others, key=lambda i: med[i])
    need = max(margin, _spread(d), _spread(times[c]))
    wins = sum(x < y for x, y in zip(times[c], d))
    better = med[c] <= (1.0 - need) * med[default] and 2 * wins > len(d)
    kept = c if better else default
    return Verdict(kept, default, med[kept], med[default], c, med[c], wins, len(d), need, tuple(medians))


def choose(sample, count: int, *, default: int = 0, rounds: int = 5, confirm_rounds: int | None = None,
           warmup_rounds: int = 1, finalists: int = FINALISTS, margin: float = MARGIN) -> Verdict:
    """Compare `count` candidates with candidate `default` (see the comment above).

    Screening: `warmup_rounds` untimed rounds, then `rounds` interleaved rounds of
    all. Deciding: `confirm_rounds` interleaved rounds of the default and the
    `finalists` fastest others by their screening median; the fastest of those
    replaces the default only if its median is lower by ``max(margin, spread)``
    (spread: either's interquartile range over median in the deciding rounds) and
    it was faster in a majority of them.

    Parameters
    ----------
    sample : callable
        ``sample(i)`` -> seconds per call of candidate i, from one sample.
    count : int
        Number of candidates, indexed 0 to count - 1.
    default : int
        The index of the launcher's own configuration.
    rounds : int
        Screening rounds (positive).
    confirm_rounds : int, optional
        Deciding rounds (default ``2 * rounds + 1``).
    warmup_rounds : int
        Untimed rounds first.
    finalists : int
        Candidates besides the default timed again.
    margin : float
        The least gain (fraction of the default's time) that replaces it.

    Returns
    -------
    Verdict
        The kept index, the default's and the kept candidate's medians over the
        deciding rounds, the challenger's, its wins, and the screening medians.

    Raises
    ------
    ValueError
        If `default` is not a candidate's index or rounds < 1.

    Examples
    --------
    >>> cost = [1.0, 1.01, 0.8, 0.99]  # candidate 2 is 20% faster than the default 0
    >>> choose(lambda i: cost[i], 4).index
    2
    >>> choose(lambda i: [1.0, 0.99, 0.985][i], 3).index  # gains within 3%: the default
    0
    """
    if not 0 <= default < count:
        raise ValueError(f"default must index one of the {count} candidates, not {default!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be positive, not {rounds!r}")
    every = range(count)
    _interleaved(sample, every, warmup_rounds)
    screen = _interleaved(sample, every, rounds)
    medians = tuple(statistics.median(screen[i]) for i in every)
    best = sorted((i for i in every if i != default), key=lambda i: medians[i])[:finalists]
    again = _interleaved(sample, [default, *best], confirm_rounds or 2 * rounds + 1)
    return _decide(again, default, margin=margin, medians=medians)


def batch_for(call_s: float, *, sample_s: float = SAMPLE_S, max_batch: int = MAX_BATCH) -> int:
    """Calls per sample: enough that a sample lasts `sample_s`, 1 to `max_batch`.

    Parameters
    ----------
    call_s : float
        Device seconds of one call.
    sample_s : float
        The least device time of a sample.
    max_batch : int
        Calls per sample at most.

    Returns
    -------
    int

    Examples
    --------
    >>> batch_for(0.4e-3), batch_for(5e-6), batch_for(5e-3), batch_for(1e-8)
    (3, 200, 1, 1000)
    """
    return max(1, min(max_batch, math.ceil(sample_s / max(call_s, 1e-9))))


def _operand_sets(A, lay, m: int, n: int, dtype) -> list:
    """[(A, C), ...]: the caller's A and a scratch C, and where such a pair is smaller
    than twice the L2, copies in A's layout, enough that cycling through them reads
    every operand from DRAM, as the benchmarks time (a configuration that wins on
    L2-resident operands need not win on DRAM-bound ones)."""
    import cupy

    def scratch():
        c = cupy.empty((m, n), dtype=dtype)
        c.fill(1)
        return c

    sets = [(A, scratch())]
    per = A.nbytes + m * n * np.dtype(dtype).itemsize
    count = min(MAX_SETS, _timing.sets_needed(per, _timing.l2_size(cupy.cuda.runtime.getDevice())))
    try:
        while len(sets) < count:
            a = cupy.empty_like(A)  # order "K": A's order (a view with padded rows: compact)
            if _tsm2.a_layout(a)[0] != lay:
                break  # a copy would run another kernel: time on the caller's A alone
            a[...] = A
            sets.append((a, scratch()))
    except cupy.cuda.memory.OutOfMemoryError:
        pass  # time on the sets there was room for
    return sets


def _sampler(launch, cands, B, sets, beta: float):
    """``sample(i)``: per-call device seconds of candidate i over one sample of
    back-to-back calls, cycling through `sets`. Launches every candidate once first
    (compiles, module loads) and sizes each one's batch."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    calls = [_timing.cycling(lambda A, C, c=c: launch(A, B, C, 1.0, beta, c), sets) for c in cands]
    for f in calls:
        f()
    stream.synchronize()
    batches, spins = [], []
    for f in calls:
        h = time.perf_counter()
        for _ in range(4):
            f()
        h = (time.perf_counter() - h) / 4  # host seconds per call (enqueue only)
        stream.synchronize()
        # one call behind a spin that covers its enqueue: its device time alone
        b = batch_for(_timing.batch_sample(f, 1, min(_timing.SPIN_MAX_S, 4 * h + 20e-6)))
        batches.append(b)
        spins.append(min(_timing.SPIN_MAX_S, 2 * b * h + 20e-6))

    def sample(i):
        return _timing.batch_sample(calls[i], batches[i], spins[i]) / batches[i]

    return sample


# ------------------------------------------------------------------ search


def _candidates_tsm2r(base: _tsm2.TSM2RConfig, m, k, n, dtype, lay):
    itemsize = np.dtype(dtype).itemsize
    shapes = [base]
    if base.version == 3 and not lay.col and base.tc == 1:
        # the other block shape of the tensor-core kernels: 4 <-> 8 warps (v3x also
        # switches its B tile depth with it)
        t1 = 256 if base.t1 == 128 else 128
        alt = _tsm2.TSM2RConfig(tc=1, t1=t1, t3=(128 if t1 == 256 and itemsize == 4 else 64), splits=1)
        try:
            shapes.append(_tsm2.resolve_tsm2r(m, k, n, dtype, lay, alt))
        except ValueError:
            pass
    out = []
    for s in shapes:
        if s.streamk == 1:
            # stream-K, then split-K counts on the same block shape
            out.append(s)
            s = _tsm2.resolve_tsm2r(m, k, n, dtype, lay, replace(s, streamk=-1, minb=0, splits=1))
        most = max(1, min(64, k // (4 * s.t3)))
        for sp in sorted({*(x for x in SPLITS_TRIED if x <= most), min(base.splits, most)}):
            out.append(replace(s, splits=sp))
    return out


def _candidates_tsm2l(base: _tsm2.TSM2LConfig, m, k, n, dtype, lay):
    """Unresolved configurations (opt, warp, tcf), the launcher's default first."""
    default = _tsm2.TSM2LConfig(opt=base.opt, tcf=base.tcf)
    warps = [0]
    if base.opt == 1 and not lay.col:
        # whole-row warps (opt1w) against shared-memory tiles, where both apply
        name0 = _tsm2.tsm2l_name(base, dtype, lay)
        for w in (1, -1):
            try:
                c = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, _tsm2.TSM2LConfig(opt=1, warp=w, tcf=1))
            except ValueError:
                continue
            if _tsm2.tsm2l_name(c, dtype, lay) != name0:
                warps.append(w)
    out = [default]
    for w in warps:
        for tcf in TCF_TRIED:
            c = _tsm2.TSM2LConfig(opt=base.opt, warp=w, tcf=tcf)
            if c != default:
                out.append(c)
    itemsize = np.dtype(dtype).itemsize
    if 1 in warps or (base.opt == 1 and base.warp == 1):
        # opt1w: load instructions per warp step (bytes in flight per warp) x tcf
        for u in OPT1W_U_TRIED.get(itemsize, ()):
            for tcf in (0, *OPT1D_TCF_TRIED):
                c = _tsm2.TSM2LConfig(opt=1, warp=1, u=u, tcf=tcf)
                if _resolves(c, m, k, n, dtype, lay) and c not in out:
                    out.append(c)
    if base.opt == 1 and _tsm2.opt1d_fits(k, n, dtype, lay):
        # column-major A straight into registers: block shapes, C staged or not, tcf
        # (0: one wave of resident blocks, the launcher's own rule)
        for t1, vec in OPT1D_SHAPES_TRIED:
            for stage in OPT1D_STAGE_TRIED:
                for tcf in (0, *OPT1D_TCF_TRIED):
                    c = _tsm2.TSM2LConfig(opt=1, direct=1, t1=t1, vec=vec, stage=stage, tcf=tcf)
                    if _resolves(c, m, k, n, dtype, lay) and c not in out:
                        out.append(c)
    return out, default


def _resolves(cfg: _tsm2.TSM2LConfig, m, k, n, dtype, lay) -> bool:
    """Whether the launcher accepts `cfg` for this problem (without resolving tcf)."""
    try:
        _tsm2.resolve_tsm2l(m, k, n, dtype, lay, replace(cfg, tcf=cfg.tcf or 1))
    except ValueError:
        return False
    return True


def autotune(A, B, *, algorithm: str = "auto", beta: float = 0.0, reps: int = 5,
             verbose: bool = False) -> dict:
    """Time the neighbourhood of the launcher's configuration for ``A @ B`` and keep
    the fastest for this GPU and shape bucket.

    Later launches that bring no configuration of their own (``matmul``, and
    ``tsm2r`` / ``tsm2l`` with default arguments) on problems of the same bucket
    (m and k rounded up to a power of two, n exact, same dtype and orders) use the
    tuned configuration. Neither operand is written.

    Parameters
    ----------
    A, B : cupy.ndarray or torch.Tensor (CUDA)
        A has shape (M, K), B (K, N); float32 or float64, on the GPU.
    algorithm : {"auto", "tsm2r", "tsm2l"}
        "auto" tunes what ``tsm_core.plan`` picks (nothing when that is cuBLAS).
    beta : float
        The beta the tuned calls will use (C read or not).
    reps : int
        Screening rounds (positive): each times every candidate once, in turn. The
        default and the fastest few are then timed again in ``2 * reps + 1``
        rounds, which decide (see :func:`choose`).
    verbose : bool
        Log each candidate's time and the decision (INFO, logger
        ``tsm_core.tsm2.autotune``).

    Returns
    -------
    dict
        "algorithm", "params" (what was stored), "time_s" (the kept
        configuration's median over the deciding rounds), "default_time_s" (the
        launcher's own configuration's, same rounds), "tried" (candidates timed)
        and "decision" (kept: "default" or "candidate"; wins: deciding rounds the
        fastest other candidate beat the default in, of rounds; need: the gain it
        needed; challenger_time_s: its median); time_s, default_time_s and
        decision are stored with the parameters. For cuBLAS or an empty product:
        nothing is timed, ``params`` is empty and the times and decision are None.

    Raises
    ------
    ValueError
        For numpy (or torch CPU) operands (computed on the CPU: no kernels to
        tune), an unknown algorithm, or reps < 1.
    TypeError
        For operands ``tsm_core.matmul`` refuses (dtype, shape).

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> try:
    ...     tsm_core.autotune(np.ones((4, 3)), np.ones((3, 2)))
    ... except ValueError as e:
    ...     print(str(e)[:40])
    tsm_core.autotune needs GPU operands (Cu
    >>> import cupy                                        # doctest: +SKIP
    >>> A = cupy.random.standard_normal((20480, 20480), dtype=cupy.float32)  # doctest: +SKIP
    >>> B = cupy.random.standard_normal((20480, 16), dtype=cupy.float32)     # doctest: +SKIP
    >>> r = tsm_core.autotune(A, B)                        # doctest: +SKIP
    >>> C = tsm_core.matmul(A, B)  # now with the tuned configuration  # doctest: +SKIP
    """
    if algorithm not in ("auto", "tsm2r", "tsm2l"):
        raise ValueError(f"algorithm must be 'auto', 'tsm2r' or 'tsm2l', not {algorithm!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be a positive integer, not {reps!r}")
    ops = check_operands(A, B, beta=0.0)
    if ops.xp is np:
        raise ValueError("tsm_core.autotune needs GPU operands (CuPy arrays or torch CUDA tensors): "
                         "numpy inputs are computed on the CPU, which has no kernels to tune")
    m, k, n, dtype = ops.m, ops.k, ops.n, ops.dtype
    if algorithm == "auto":
        algorithm = _model.plan(m, k, n, dtype, (order_of(ops.A), order_of(ops.B)), beta=beta,
                                profile=tsm2l_profile).algorithm
    if algorithm == "cublas" or min(m, k, n) == 0:
        return dict(algorithm="cublas", params={}, time_s=None, default_time_s=None, tried=0,
                    decision=None)
    lay, A_read = _tsm2.a_layout(ops.A)
    if algorithm == "tsm2l" and k > _tsm2.TSM2L_KMAX:
        base = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, _tsm2.TSM2LConfig(opt=2))
    elif algorithm == "tsm2l":
        base = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, _tsm2.TSM2LConfig())
    else:
        base = _tsm2.resolve_tsm2r(m, k, n, dtype, lay, _tsm2.TSM2RConfig())
    if algorithm == "tsm2r":
        cands = _candidates_tsm2r(base, m, k, n, dtype, lay)
    else:
        cands, base = _candidates_tsm2l(base, m, k, n, dtype, lay)
    if base not in cands:
        cands.insert(0, base)
    launch = _tsm2.launch_tsm2r if algorithm == "tsm2r" else _tsm2.launch_tsm2l
    sets = _operand_sets(A_read, lay, m, n, dtype)
    sample = _sampler(launch, cands, ops.B, sets, beta)
    v = choose(sample, len(cands), default=cands.index(base), rounds=reps)
    del sets
    if verbose:
        for i, (cfg, t) in enumerate(zip(cands, v.medians)):
            _log.info("autotune [%d/%d] %s: %.4f ms", i + 1, len(cands), cfg, t * 1e3)
        _log.info("autotune: %s kept (%.4f ms; default %.4f ms, fastest other %s %.4f ms, "
                  "faster in %d of %d rounds, %.1f%% needed)",
                  "the default" if v.kept_default else cands[v.index], v.time_s * 1e3,
                  v.default_time_s * 1e3, cands[v.challenger] if v.challenger is not None else None,
                  (v.challenger_time_s or math.nan) * 1e3, v.wins, v.rounds, v.need * 100)
    best_t, default_t = v.time_s, v.default_time_s
    params = stored_params(algorithm, cands[v.index], m, k, n, dtype, lay)
    key = _key(algorithm, dtype, _orders(ops.A, ops.B, lay), m, k, n)
    decision = {f: v.to_dict()[f] for f in ("kept", "wins", "rounds", "need", "challenger_time_s")}
    try:
        cache().put(key, params, best_t, default_time_s=default_t, decision=decision)
    except OSError:  # a read-only cache directory: the result is still returned
        pass
    _tsm2.forget_resolved()  # default launches re-resolve, now with the tuned entry
    return dict(algorithm=algorithm, params=params, time_s=best_t, default_time_s=default_t,
                tried=len(cands), decision=decision)

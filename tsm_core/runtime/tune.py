"""The one tuner: time candidate configurations once, keep the fastest, remember it.

A :class:`Tuner` belongs to one family and one decision (say, the k-means tile
route, or a convolution group's tile). ``pick(key, candidates)`` times each
candidate with the one event timer (:func:`tsm_core.runtime.timing.time_fn`) and
returns the fastest name; the choice is memoised in the process and, where the
tuner is ``persistent``, stored on disk per GPU in one :class:`~tsm_core.runtime.cache.JsonStore`
(``tune-<gpu>.json`` under the cache folder), with a key that includes a hash of the
family's kernel source, so that a changed kernel is tuned again.

Examples
--------
>>> from tsm_core.runtime.tune import Tuner
>>> t = Tuner("demo", persistent=False)
>>> t.pick(("n", 4), {"a": lambda: None}, timer=lambda fn: 1.0)
'a'
"""

from __future__ import annotations

import threading
from pathlib import Path

from tsm_core.runtime import compile as _compile
from tsm_core.runtime import device, timing
from tsm_core.runtime.cache import JsonStore, cache_dir

_lock = threading.Lock()


def store(gpu: str | None = None, directory=None) -> JsonStore:
    """The on-disk store of tuned choices of one GPU: ``tune-<gpu>.json`` under
    ``directory`` (default: :func:`~tsm_core.runtime.cache.cache_dir`), for the GPU
    named ``gpu`` (default: the current one)."""
    d = Path(directory) if directory is not None else cache_dir()
    return JsonStore(d / f"tune-{device._sanitise(gpu or device.name())}.json")


class Tuner:
    """Pick the fastest of several candidates once per key.

    Parameters
    ----------
    family : str
        The kernel family (its source hash enters on-disk keys where it has one).
    persistent : bool
        Keep choices on disk across processes (default) or in this process only.
    """

    def __init__(self, family: str, *, persistent: bool = True):
        self.family = family
        self.persistent = persistent
        self._memo: dict = {}

    def _disk_key(self, key) -> str:
        try:
            h = _compile.source_hash(self.family)
        except (ValueError, OSError):
            h = "-"
        return f"{self.family}|{h}|{key!r}"

    def lookup(self, key):
        """The remembered choice for ``key``, or None."""
        if key in self._memo:
            return self._memo[key]
        if self.persistent:
            v = store().get(self._disk_key(key))
            if v is not None:
                self._memo[key] = v
            return v
        return None

    def remember(self, key, choice) -> None:
        """Keep ``choice`` for ``key`` (on disk too where persistent)."""
        with _lock:
            self._memo[key] = choice
        if self.persistent:
            store().update({self._disk_key(key): choice})

    def forget(self) -> None:
        """Drop this process's memo (the disk store stays)."""
        self._memo.clear()

    def pick(self, key, candidates: dict, *, timer=None, reps: int = 5):
        """The name of the fastest candidate for ``key``, timing them on first use.

        Parameters
        ----------
        key : hashable
            What decides when to time again (shape bucket, dtype, ...).
        candidates : dict
            name -> a callable that runs the candidate once.
        timer : callable, optional
            fn -> seconds; default: the median of :func:`tsm_core.runtime.timing.time_fn`.
        reps : int
            Timed repetitions per candidate with the default timer.
        """
        v = self.lookup(key)
        if v is not None and v in candidates:
            return v
        if timer is None:
            def timer(fn):
                return timing.time_fn(fn, warmup=1, reps=reps).median_s
        times = {name: timer(fn) for name, fn in candidates.items()}
        best = min(times, key=times.get)
        self.remember(key, best)
        return best

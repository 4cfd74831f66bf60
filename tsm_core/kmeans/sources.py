"""Where X lives during a fit: GPU memory (``_DeviceSource``) or host memory,
streamed through two device buffers (``_HostSource``).

A source yields X in chunks of rows (one chunk, the whole of X, in GPU memory);
the Lloyd loop and k-means++ enqueue all their work on a chunk before asking for
the next one. Streamed X is read from host memory once per pass: each chunk is
assigned and summed while the next is being copied.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.assign import _row_sqnorm
from tsm_core.kmeans.configs import PIECE, ROW_BLOCK
from tsm_core.kmeans.launch import _c_rows, _cp
from tsm_core.runtime.arrays import to_backend


class _DeviceSource:
    """X already in GPU memory: one chunk, the whole of it."""

    streamed = False

    def __init__(self, X):
        self.X = _c_rows(X)
        self.n, self.d = self.X.shape
        self.dtype = self.X.dtype
        self.max_rows = self.n
        self._xx = None

    def chunks(self):
        yield 0, self.X

    def rows(self, idx):
        return self.X[_cp().asarray(idx)]

    def xx(self, a, Xc):
        """Row norms of chunk Xc starting at row a: computed once, X does not change."""
        if self._xx is None:
            self._xx = _row_sqnorm(self.X, _cp().empty(self.n, dtype=self.dtype))
        return self._xx[a:a + Xc.shape[0]]

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _HostSource:
    """X in host memory, streamed through two device buffers.

    The host array is page-locked in place (cudaHostRegister) so that the copies
    are asynchronous DMA at full link speed without an extra host copy; where that
    is refused, two pinned staging buffers take the copy (the host memcpy of chunk
    i+1 then overlaps the GPU's work on chunk i). The copy of chunk i+1 runs on its
    own stream while chunk i is computed on the current one."""

    streamed = True

    def __init__(self, X: np.ndarray, chunk_rows: int):
        cp = _cp()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        self.X = X
        self.n, self.d = X.shape
        self.dtype = X.dtype
        self.max_rows = max(1, min(self.n, int(chunk_rows)))
        self.starts = list(range(0, self.n, self.max_rows))
        self.bufs = [cp.empty((self.max_rows, self.d), dtype=X.dtype) for _ in range(2)]
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.copied = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        self.freed = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        self.staged = [None, None]
        self.registered = False
        try:
            if X.nbytes:
                cp.cuda.runtime.hostRegister(X.ctypes.data, X.nbytes, 0)
                self.registered = True
        except Exception:  # not permitted / not supported: stage through pinned buffers
            import cupyx

            self.staging = [cupyx.empty_pinned((self.max_rows, self.d), dtype=X.dtype) for _ in range(2)]
            self.staged_ev = [None, None]

    def _copy(self, i: int):
        cp = _cp()
        a = self.starts[i]
        b = min(self.n, a + self.max_rows)
        slot = i % 2
        dst = self.bufs[slot]
        nbytes = (b - a) * self.d * self.X.itemsize
        with self.copy_stream:
            self.copy_stream.wait_event(self.freed[slot])
            if self.registered:
                src = self.X.ctypes.data + a * self.d * self.X.itemsize
            else:
                ev = self.staged_ev[slot]
                if ev is not None:
                    ev.synchronize()  # the DMA out of this staging buffer has finished
                np.copyto(self.staging[slot][: b - a], self.X[a:b])
                src = self.staging[slot].ctypes.data
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src, nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                        self.copy_stream.ptr)
            self.copied[slot].record(self.copy_stream)
            if not self.registered:
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(self.copy_stream)
                self.staged_ev[slot] = ev

    def chunks(self):
        """Yield (first row, device chunk). The caller must enqueue all its work on the
        chunk (on the current stream) before asking for the next one."""
        cp = _cp()
        cs = cp.cuda.get_current_stream()
        m = len(self.starts)
        for slot in range(2):
            self.freed[slot].record(cs)
        self._copy(0)
        for i in range(m):
            if i >= 1:
                self.freed[(i - 1) % 2].record(cs)  # the work on chunk i-1 is enqueued
            if i + 1 < m:
                self._copy(i + 1)
            cs.wait_event(self.copied[i % 2])
            a = self.starts[i]
            b = min(self.n, a + self.max_rows)
            yield a, self.bufs[i % 2][: b - a]
        self.freed[(m - 1) % 2].record(cs)

    def rows(self, idx):
        return _cp().asarray(self.X[np.asarray(idx)])

    def xx(self, a, Xc):
        return _row_sqnorm(Xc, _cp().empty(Xc.shape[0], dtype=self.dtype))

    def close(self):
        cp = _cp()
        cp.cuda.get_current_stream().synchronize()
        self.copy_stream.synchronize()
        if self.registered:
            cp.cuda.runtime.hostUnregister(self.X.ctypes.data)
            self.registered = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def kmeans_source(X, *, max_gpu_memory=None, n_clusters=8):
    """X prepared for `kmeans_lloyd` and `kmeans_plusplus`, for several runs.

    In GPU memory (CuPy, torch CUDA), moved there once (numpy that fits in about half
    the budget), or streamed from host memory in chunks (larger numpy X: the host
    array is page-locked in place, two device buffers take the chunks). Close it (or
    use ``with``) to release the host pages a streamed X keeps locked.

    Parameters
    ----------
    X : numpy.ndarray, cupy.ndarray or torch.Tensor (CUDA), shape (n, d)
        The rows.
    max_gpu_memory : int, optional
        Bytes of GPU memory the fit may use (default: 70% of the free memory).
    n_clusters : int, default=8
        Sizes the streamed chunks (the dot-product block grows with k).

    Returns
    -------
    source
        An object with ``n``, ``d``, ``dtype``, ``streamed``, ``chunks()``,
        ``close()``; a context manager. X itself where X is already a source.

    Raises
    ------
    TypeError
        X is not a numpy array, CuPy array or torch tensor.
    RuntimeError
        No CUDA GPU (CuPy's error).

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> X = np.random.default_rng(0).standard_normal((1000, 8))
    >>> if tsm_core.has_gpu():
    ...     with tsm_core.kmeans_source(X, max_gpu_memory=1 << 16) as src:  # streamed
    ...         runs = [tsm_core.kmeans_lloyd(src, X[:4], max_iter=5)[1] for _ in range(2)]
    ...     same = runs[0] == runs[1]
    ... else:
    ...     same = True
    >>> same
    True
    """
    if isinstance(X, (_DeviceSource, _HostSource)):
        return X
    if not isinstance(X, np.ndarray):
        X = to_backend(X, "X")
    return make_source(X, max_gpu_memory=max_gpu_memory, k=n_clusters)


def make_source(X, *, max_gpu_memory=None, k=8):
    """The data source for X: GPU-resident, moved once, or streamed in chunks.

    X : numpy (host) or CuPy array. A numpy X larger than about half the budget
    (`max_gpu_memory` bytes, default 70% of the free device memory) is streamed:
    two chunk buffers of about a quarter of the budget each."""
    cp = _cp()
    if isinstance(X, cp.ndarray):
        return _DeviceSource(X)
    free = cp.cuda.runtime.memGetInfo()[0]
    budget = int(max_gpu_memory) if max_gpu_memory is not None else int(0.7 * free)
    n, d = X.shape
    item = X.dtype.itemsize
    per_row_state = 4 + item + 8  # labels, min distance, weight
    if X.nbytes + n * per_row_state <= budget // 2:
        return _DeviceSource(cp.asarray(X))
    avail = max(budget - n * per_row_state, budget // 4)
    # Each chunk: its buffer, the dot products (cuBLAS route), the update's partials.
    per_row = d * item + min(k, 4096) * item + 8 * d / PIECE + 16
    rows = max(1, int(avail / 4 / per_row))
    if rows > ROW_BLOCK:
        rows -= rows % ROW_BLOCK  # chunks of whole row blocks: sums as in memory
    return _HostSource(X, rows)

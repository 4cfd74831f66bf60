"""Where X lives during a fit: GPU memory (``_DeviceSource``) or host memory,
streamed through a ring of device buffers (``_HostSource``).

A source yields X in chunks of rows (one chunk, the whole of X, in GPU memory);
the Lloyd loop and k-means++ enqueue all their work on a chunk before asking for
the next one. Streamed X is read from host memory once per pass: each chunk is
assigned and summed while the next ones are being copied, and the copies of the
next pass's first chunks run while the host reads an iteration's result.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.assign import _row_sqnorm
from tsm_core.kmeans.configs import PIECE, ROW_BLOCK, update_route, x_type
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


NBUF = 3  # device chunk buffers: the chunk being computed and two copies in flight
CHUNK_BYTES = 256 << 20  # a chunk buffer at most: larger chunks add nothing to the overlap


class _HostSource:
    """X in host memory, streamed through a ring of NBUF device buffers.

    The copies run on their own stream, ordered by events: chunk i+1's (and i+2's)
    copy runs while chunk i is computed on the current stream, and a buffer is
    overwritten only after the work queued on its previous chunk. The ring runs on
    across passes: the end of a pass queues the copies of the next pass's first
    chunks, so the link stays busy while the host reads an iteration's status.

    The host array is page-locked in place (cudaHostRegister, undone by `close`) so
    that the copies are DMA at full link speed without an extra host copy; where
    that is refused, or X is not C-contiguous, NBUF pinned staging buffers take the
    chunks (a host copy into the staging buffer, then its DMA)."""

    streamed = True

    def __init__(self, X: np.ndarray, chunk_rows: int):
        cp = _cp()
        self.X = X
        self.n, self.d = X.shape
        self.dtype = X.dtype
        self.max_rows = max(1, min(self.n, int(chunk_rows)))
        self.starts = list(range(0, self.n, self.max_rows))
        self.bufs = [cp.empty((self.max_rows, self.d), dtype=X.dtype) for _ in range(NBUF)]
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.copied = [cp.cuda.Event(disable_timing=True) for _ in range(NBUF)]
        self.freed = [cp.cuda.Event(disable_timing=True) for _ in range(NBUF)]
        # Chunks are numbered over all passes: chunk s is rows starts[s % m], in buffer s % NBUF.
        self.seq = 0  # the next chunk handed out
        self.issued = 0  # the next chunk whose copy is queued
        self.registered = False
        self.staging = None
        if X.flags.c_contiguous and X.nbytes:
            try:
                cp.cuda.runtime.hostRegister(X.ctypes.data, X.nbytes, 0)
                self.registered = True
            except Exception:  # not permitted / not supported / already registered: staging
                pass
        if not self.registered:
            import cupyx

            self.staging = [cupyx.empty_pinned((self.max_rows, self.d), dtype=X.dtype) for _ in range(NBUF)]

    def _rows_of(self, s: int):
        a = self.starts[s % len(self.starts)]
        return a, min(self.n, a + self.max_rows)

    def _issue(self):
        """Queue the copy of chunk `self.issued` into its buffer, after the work queued
        on that buffer's previous chunk (its `freed` event)."""
        cp = _cp()
        s = self.issued
        slot = s % NBUF
        a, b = self._rows_of(s)
        nbytes = (b - a) * self.d * self.X.itemsize
        self.copy_stream.wait_event(self.freed[slot])
        if self.registered:
            src = self.X.ctypes.data + a * self.d * self.X.itemsize
        else:
            # The DMA out of this staging buffer (chunk s - NBUF) has finished.
            self.copied[slot].synchronize()
            np.copyto(self.staging[slot][: b - a], self.X[a:b])
            src = self.staging[slot].ctypes.data
        cp.cuda.runtime.memcpyAsync(self.bufs[slot].data.ptr, src, nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    self.copy_stream.ptr)
        self.copied[slot].record(self.copy_stream)
        self.issued = s + 1

    def chunks(self):
        """Yield (first row, device chunk) over all rows. The caller must enqueue all
        its work on the chunk (on the current stream) before asking for the next one."""
        m = len(self.starts)
        if m == 0:
            return
        cs = _cp().cuda.get_current_stream()
        if self.seq % m:  # a pass left before its end: the next one starts at row 0
            self.seq = -(-self.seq // m) * m
            self.issued = max(self.issued, self.seq)
        end = self.seq + m
        s = None
        try:
            for s in range(self.seq, end):
                # Chunks s - NBUF and earlier are released: copies up to s + NBUF - 1 may run.
                while self.issued < s + NBUF:
                    self._issue()
                cs.wait_event(self.copied[s % NBUF])
                a, b = self._rows_of(s)
                yield a, self.bufs[s % NBUF][: b - a]
                self.freed[s % NBUF].record(cs)  # the work on chunk s is queued
                self.seq = s + 1
                s = None
            # The next pass's first chunks, while the host reads this one's results.
            while self.issued < end + NBUF:
                self._issue()
        finally:
            if s is not None:  # left inside the pass (break, exception): release chunk s
                self.freed[s % NBUF].record(cs)
                self.seq = s + 1

    def rows(self, idx):
        return _cp().asarray(self.X[np.asarray(idx)])

    def xx(self, a, Xc):
        return _row_sqnorm(Xc, _cp().empty(Xc.shape[0], dtype=self.dtype))

    def close(self):
        cp = _cp()
        cp.cuda.get_current_stream().synchronize()
        self.copy_stream.synchronize()  # the queued copies (the next pass's first chunks) read X
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
    array is page-locked in place, a ring of three device buffers takes the chunks,
    see `stream_chunk_rows`). Close it (or
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
    (`max_gpu_memory` bytes, default 70% of the free device memory) is streamed
    in chunks of `stream_chunk_rows` rows."""
    cp = _cp()
    if isinstance(X, cp.ndarray):
        return _DeviceSource(X)
    free = cp.cuda.runtime.memGetInfo()[0]
    budget = int(max_gpu_memory) if max_gpu_memory is not None else int(0.7 * free)
    n, d = X.shape
    if X.nbytes + n * _per_row_state(X.dtype) <= budget // 2:
        return _DeviceSource(cp.asarray(X))
    return _HostSource(X, stream_chunk_rows(n, d, X.dtype, k, budget))


def _per_row_state(dtype) -> int:
    """Bytes a fit keeps per row of X besides X: label, distance, weight."""
    return 4 + np.dtype(dtype).itemsize + 8


def stream_chunk_rows(n, d, dtype, k, budget) -> int:
    """Rows per chunk of a streamed X (n, d) of `dtype` clustered into k clusters
    within `budget` bytes of GPU memory.

    What the fit keeps per row of X (labels, distances, weights) comes first; of
    the rest, three quarters go to what grows with the chunk: the NBUF chunk
    buffers, one converted copy of a chunk (16-bit or aligned rows for the tensor
    cores), the centroid update's partial sums (per piece of PIECE rows, or per
    row block of the direct update) and its order, the assignment's row lists and
    norms. The cuBLAS route's dot-product block is capped apart
    (GEMM_BATCH_BYTES), so k does not shrink the chunks. A chunk holds
    CHUNK_BYTES at most, and whole row blocks (ROW_BLOCK rows) where it holds more
    than one, so that the direct update sums as in memory.

    >>> stream_chunk_rows(10**7, 128, np.float32, 1024, 640 * 10**6)
    169984
    >>> stream_chunk_rows(1000, 8, np.float64, 8, 4096)
    2
    """
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    avail = max(budget - n * _per_row_state(dtype), budget // 4)
    per_row = (NBUF + 1) * d * item + 8 * d / PIECE + 64
    if update_route(k, d, x_type(dtype), max(1, 16 // item)) == "direct":
        per_row += 8 * k * d / ROW_BLOCK
    rows = int(0.75 * avail / per_row)
    rows = max(1, min(rows, CHUNK_BYTES // max(1, d * item)))
    if rows > ROW_BLOCK:
        rows -= rows % ROW_BLOCK  # chunks of whole row blocks: sums as in memory
    return rows

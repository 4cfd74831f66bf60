"""Lloyd's iterations: the one loop (`lloyd`) for every backend, the GPU's steps, and
`kmeans_lloyd`.

`lloyd` runs scikit-learn's rules over a *steps* object that holds the backend's
state and does the work: the GPU steps here (``_GpuSteps``, X in GPU memory or
streamed from host memory) and numpy's (``tsm_apps.kmeans._cpu.CpuSteps``). A steps
object has

- ``pass_over(update)``: assign every row to the current centres (labels, the
  squared distance to the nearest centre, whether a label changed) and, with
  ``update``, the per-cluster weighted sums of the rows and the weights;
- ``update()``: the new centres from the sums (a cluster without weight keeps its
  centre), returning ``(total squared shift, empty clusters, labels changed)``;
- ``relocate_empty(n_empty)``: scikit-learn's relocation of empty clusters (each
  takes one of the points farthest from their centres) in the sums;
- ``advance()``: the new centres become the current ones;
- ``inertia()``: sum_i w_i d_i^2 of the current assignment (progress lines).

With X in GPU memory, `kmeans_lloyd` runs ``_lloyd_overlapped`` instead: the same
rules and results, with the next assignment queued before the host reads an
iteration's status so that the GPU does not wait for the host. It stays a loop of
its own because its speculative assignment into a second label buffer, redone
after a relocation and dropped on strict convergence, is the GPU hot path whose
sequence of launches and synchronisations the headline benchmark measures.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.assign import _assign, auto_method
from tsm_core.kmeans.assign import storage_rows
from tsm_core.kmeans.configs import GEMM_BATCH_BYTES, choose_route, resolve_precision, tile_needs_xx, x_type
from tsm_core.kmeans.tensor import TensorAssign, _kernel as _mma_kernel, _sms, ready
from tsm_core.kmeans.launch import _cp, _kernel
from tsm_core.kmeans.sources import _DeviceSource, _HostSource, kmeans_source
from tsm_core.kmeans.update import _Sums, packed_assign
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config
from tsm_core.runtime.arrays import to_backend
from tsm_core.runtime.log import get_logger

_log = get_logger(__name__)


# ------------------------------------------------------------------ the loop


def _iteration_line(i, inertia):
    return f"Iteration {i}, inertia {inertia}."


def _strict_line(i):
    return f"Converged at iteration {i}: strict convergence."


def _tol_line(i, shift, tol):
    return f"Converged at iteration {i}: center shift {shift} within tolerance {tol}."


def _say(verbose, progress):
    """Where progress lines go: None (quiet), `progress`, or this module's logger."""
    if not verbose:
        return None
    return progress if progress is not None else _log.info


def lloyd(steps, *, max_iter=300, tol=0.0, verbose=0, progress=None):
    """Lloyd's iterations with scikit-learn's stopping rules over a steps object.

    Each iteration assigns every row to its nearest centre and moves every centre to
    the weighted mean of its rows (empty clusters take the farthest points). It
    stops when no label changed ("strict convergence"), when the total squared
    centre shift is <= `tol`, or after `max_iter` iterations; unless it stopped on
    unchanged labels, a last assignment makes the labels match the final centres.

    Parameters
    ----------
    steps : object
        The backend's state and steps: ``pass_over``, ``update``, ``relocate_empty``,
        ``advance``, ``inertia`` (see the module's docstring). Its centres and labels
        are the result.
    max_iter : int, default=300
        Iterations at most.
    tol : float, default=0.0
        Absolute tolerance on the total squared centre shift.
    verbose : int, default=0
        Nonzero: a line per iteration (scikit-learn's wording) and one at convergence.
    progress : callable, optional
        Takes each line (a str); default: this module's logger at INFO.

    Returns
    -------
    n_iter : int
        Iterations run.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps.kmeans._cpu import CpuSteps
    >>> from tsm_core.kmeans.lloyd import lloyd
    >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
    >>> steps = CpuSteps(X, np.ones(4), X[[0, 1]])
    >>> lloyd(steps, max_iter=10)
    3
    >>> steps.centers.ravel().tolist(), steps.labels.tolist()
    ([0.5, 10.5], [0, 0, 1, 1])
    """
    say = _say(verbose, progress)
    strict = False
    i = 0
    for i in range(max_iter):
        steps.pass_over(update=True)
        shift_tot, n_empty, changed = steps.update()
        if n_empty > 0:
            steps.relocate_empty(int(n_empty))
            # The changed flag was read (and reset) by the first update: keep that value.
            shift_tot, _, _ = steps.update()
        if say:
            say(_iteration_line(i, steps.inertia()))
        steps.advance()
        if not changed:
            if say:
                say(_strict_line(i))
            strict = True
            break
        if shift_tot <= tol:
            if say:
                say(_tol_line(i, shift_tot, tol))
            break
    if not strict:
        steps.pass_over(update=False)
    return i + 1


# ------------------------------------------------------------------ the GPU's steps


class _GpuSteps:
    """The GPU steps of one Lloyd run over a source (see `lloyd`): labels, distances,
    the current and next centres and their norms, the update's workspace.

    `C` (k, d) is the caller's copy of the initial centres, in X's dtype (C order).
    `precision` (resolved: see ``configs.resolve_precision``) picks the route; the
    tensor-core route ("mma") keeps a ``TensorAssign`` workspace. It and the packed
    route ("packed": the assignment and the centroid sums in one pass over X) keep,
    for 16-bit precisions or rows that 16-byte copies cannot read, X's rows in the
    form they read (converted once in GPU memory, per chunk when streamed).
    ``approx_mind``: the distances are not those of X's own rows (tensor-core
    products, or rows rounded to 16 bits), so relocations and the reported
    inertia recompute them (``exact_mind``)."""

    def __init__(self, src, C, sample_weight, method: str, precision: str = "float64"):
        cp = _cp()
        k = C.shape[0]
        self.src, self.k = src, k
        n, d = src.n, src.d
        self.precision = precision
        self.method = choose_route(k, d, precision) if method == "auto" else method
        if method == "auto" and self.method == "tile":
            self.method = None  # tile or cuBLAS: decided on the first chunk (auto_method)
        self.tc = TensorAssign(src.max_rows, d, k, precision) if self.method == "mma" else None
        self.packed = self.method == "packed"
        self.Xs = None  # X as the tensor-core or packed route reads it, when X itself is not
        if (self.tc is not None or self.packed) and not src.streamed:
            xdt = src.dtype.name
            if precision in ("bfloat16", "float16") and xdt != precision or not ready(src.X):
                self.Xs = storage_rows(src.X, xdt, precision)
        # Centres, distances and weights: float32 in every precision but float64.
        cdt = np.dtype(np.float64) if precision == "float64" else np.dtype(np.float32)
        self.half = precision in ("bfloat16", "float16")
        self.approx_mind = self.tc is not None or self.packed and self.half and x_type(src.dtype) != precision
        self.labels = cp.full(n, -1, dtype=cp.int32)
        self.mind = cp.empty(n, dtype=cdt)
        self.w = sample_weight  # CuPy (n,) of X's dtype, or None (all ones)
        self.changed = cp.zeros(1, dtype=cp.int32)
        self.sums = cp.empty((k, d), dtype=cp.float64)
        self.wsum = cp.empty(k, dtype=cp.float64)
        # 16-bit precisions sum the 16-bit rows (half the bytes of a pass).
        self.work = _Sums(src.max_rows, d, k, precision if self.half else src.dtype)
        self.Xr = None  # the 16-bit chunk the last assignment read (streamed)
        self.shift2 = cp.empty(k, dtype=cp.float64)
        self.status = cp.empty(3, dtype=cp.float64)
        self.status_host = None  # pinned copy of status (finalize with wait=False)
        self.dbuf = None
        c = _compile.ctype(cdt)
        self.k_final = _kernel(f"kmeans_finalize<{c}>")
        self.k_status = _kernel("kmeans_status<256>")
        self.C = C
        self.cn = (C.astype(cp.float64) ** 2).sum(1).astype(cdt)
        self.C_new = cp.empty_like(C)
        self.cn_new = cp.empty_like(self.cn)

    def assign_chunk(self, a, Xc, C, cn, labels, mind, prev, sums=None):
        """Assign rows a.. of X (the chunk Xc) to C; `labels`, `mind` and `prev` are
        full-length (n,) arrays (`prev` may be `labels`: updated in place). `sums`:
        (sums, wsum) that the packed route fills in the same pass (added to after the
        first chunk); the other routes take None."""
        b = a + Xc.shape[0]
        if self.tc is not None or self.packed:
            if a == 0 and self.tc is not None:
                self.tc.prepare(C)
            if self.Xs is not None:
                Xr = self.Xs[a:b]
            elif self.src.streamed and (self.half or not ready(Xc)):
                Xr = storage_rows(Xc, Xc.dtype.name, self.precision)
            else:
                Xr = Xc
            self.Xr = Xr
            if self.packed:
                if sums is not None:
                    w = self.w[a:b] if self.w is not None else None
                    self.work.packed(Xr, C, labels[a:b], mind[a:b], self.changed, prev[a:b], w, *sums, acc=a > 0,
                                     exact=self.precision == "float32")
                else:
                    packed_assign(Xr, self.work.xdtype, C, labels[a:b], mind[a:b], self.changed, prev[a:b],
                                  exact=self.precision == "float32")
                return
            _assign(Xr, C, cn, labels[a:b], mind[a:b], self.changed, prev=prev[a:b], method="mma", tc=self.tc)
            return
        if self.method is None:
            self.method = auto_method(Xc, C, cn)
        # Row norms: computed once for X in GPU memory, per chunk when streamed;
        # not at all for the fused kernel and v2 of the tile kernel (they sum them).
        need_xx = self.method == "gemm" or (self.method == "tile" and tile_needs_xx())
        xx = self.src.xx(a, Xc) if need_xx else None
        if self.method == "gemm" and self.dbuf is None:
            rows = max(1, min(self.src.max_rows, GEMM_BATCH_BYTES // (self.k * Xc.itemsize)))
            self.dbuf = _cp().empty((rows, self.k), dtype=Xc.dtype)
        _assign(Xc, C, cn, labels[a:b], mind[a:b], self.changed, prev=prev[a:b], method=self.method,
                xx=xx, dbuf=self.dbuf)

    def pass_over(self, update: bool):
        """Assign every row to the current centres (labels, mind, changed flag); with
        `update`, the centroid sums."""
        C, cn = self.C, self.cn
        # The changed flag is 0 here: made so, and reset by every kmeans_status.
        first = True
        for a, Xc in self.src.chunks():
            b = a + Xc.shape[0]
            if self.packed:  # the sums in the same pass
                self.assign_chunk(a, Xc, C, cn, self.labels, self.mind, self.labels,
                                  sums=(self.sums, self.wsum) if update else None)
                continue
            self.assign_chunk(a, Xc, C, cn, self.labels, self.mind, self.labels)
            if update:
                w = self.w[a:b] if self.w is not None else None
                Xu = self.update_rows(a, b, Xc)
                # Chunks add to the sums in row order (deterministic).
                self.work.run(Xu, self.labels[a:b], w, self.sums, self.wsum, acc=not first)
            first = False
        if not update:
            self.changed.fill(0)

    def update_rows(self, a, b, Xc):
        """The rows a..b that the centroid update reads: the 16-bit rows for 16-bit
        precisions (converted once, or the chunk the assignment just converted)."""
        if not self.half:
            return Xc
        if self.Xs is not None:
            return self.Xs[a:b]
        if self.src.dtype.name == self.precision:
            return Xc
        return self.Xr

    def finalize(self, C_old, C_new, cn, wait: bool = True):
        """New centres, their norms and the status [total squared shift, empty clusters,
        changed flag] (the flag is reset). `wait`: return the status (a host round
        trip); else its copy to host memory is queued, `status_wait` returns it."""
        cp = _cp()
        k, d = C_old.shape
        threads = 1 << max(5, min(10, (d - 1).bit_length()))
        self.k_final((k,), (threads,), (self.sums, self.wsum, C_old, np.int32(d), C_new, cn, self.shift2))
        self.k_status((1,), (256,), (self.shift2, self.wsum, np.int32(k), self.changed, self.status))
        if wait:
            return self.status.get()
        if self.status_host is None:
            import cupyx

            self.status_host = cupyx.empty_pinned(3, dtype=np.float64)
            self.status_ev = cp.cuda.Event(disable_timing=True)
        stream = cp.cuda.get_current_stream()
        cp.cuda.runtime.memcpyAsync(self.status_host.ctypes.data, self.status.data.ptr, self.status.nbytes,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        self.status_ev.record(stream)
        return None

    def update(self):
        """New centres from the sums (into C_new), and the status (a host round trip)."""
        return self.finalize(self.C, self.C_new, self.cn_new)

    def advance(self):
        """The new centres become the current ones (the buffers swap)."""
        self.C, self.C_new = self.C_new, self.C
        self.cn, self.cn_new = self.cn_new, self.cn

    def status_wait(self):
        self.status_ev.synchronize()
        return self.status_host.copy()

    def exact_mind(self, C=None):
        """mind = ||x - c_label||^2 from X's rows (float64 sums; one pass over X), for
        the tensor-core route, whose distances come from products rounded to TF32 or
        16 bits (``||x||^2 - 2 x.c + ||c||^2`` loses the small distances to that
        rounding; labels do not depend on it). `C`: the centres of the labels."""
        cp = _cp()
        C = self.C if C is None else C
        for a, Xc in self.src.chunks():
            m = Xc.shape[0]
            xt = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}.get(np.dtype(Xc.dtype))
            if xt is not None and C.dtype == np.float32 and C.flags.c_contiguous and m > 0:
                ldx = Xc.strides[0] // Xc.itemsize if m > 1 else Xc.shape[1]
                if Xc.strides[1] == Xc.itemsize:
                    blocks = min(-(-m // 8), 8 * _sms())
                    _mma_kernel(f"kmeans_exact_mind<{xt}>")((blocks,), (256,), (
                        Xc, np.int64(ldx), np.int32(m), np.int32(Xc.shape[1]), C, self.labels[a:a + m],
                        self.mind[a:a + m]))
                    continue
            step = max(1, (1 << 26) // max(1, Xc.shape[1]))
            for s0 in range(0, m, step):
                s1 = min(m, s0 + step)
                diff = Xc[s0:s1].astype(cp.float32) - C[self.labels[a + s0:a + s1]].astype(cp.float32)
                self.mind[a + s0:a + s1] = (diff * diff).sum(1, dtype=cp.float64)

    def relocate_empty(self, n_empty: int, C=None):
        """sklearn's relocation: each empty cluster takes one of the points farthest
        from their centres (the largest first, the smaller index on ties); the point's
        weight moves from its old cluster to the empty one. Rare: done with CuPy ops.
        `C`: the centres of the current labels (default the current centres)."""
        cp = _cp()
        if self.approx_mind:
            self.exact_mind(C)
        empty = cp.asnumpy(cp.nonzero(self.wsum == 0)[0])[:n_empty]
        # argsort is a stable radix sort: equal distances keep the smaller index first.
        far = cp.asnumpy(cp.argsort(-self.mind.astype(cp.float64))[: len(empty)])
        rows = self.src.rows(far).astype(cp.float64)
        wts = self.w[cp.asarray(far)].astype(cp.float64) if self.w is not None else cp.ones(len(far))
        old = cp.asnumpy(self.labels[cp.asarray(far)])
        for i, new_id in enumerate(empty):
            o = int(old[i])
            self.sums[o] -= rows[i] * wts[i]
            self.sums[int(new_id)] = rows[i] * wts[i]
            self.wsum[int(new_id)] = wts[i]
            self.wsum[o] -= wts[i]

    def inertia(self) -> float:
        """sum_i w_i mind_i of the current assignment (float64)."""
        cp = _cp()
        m = self.mind.astype(cp.float64)
        if self.w is not None:
            m = m * self.w.astype(cp.float64)
        return float(m.sum())


def _lloyd_overlapped(run, max_iter, tol, say=None):
    """The Lloyd loop of `kmeans_lloyd` for X in GPU memory, without an idle GPU
    while the host reads each iteration's status.

    The assignment to the new centres is queued right after the update, before the
    host waits for the status, into a second label / distance buffer (prev = the
    current labels, so the changed flag means the same). Depending on the status it
    is the next iteration's assignment, or the final assignment that the loop would
    run after a tolerance stop or at max_iter; on strict convergence it is dropped
    and the current buffers are returned; when a cluster is empty the centres are
    redone after the relocation and the assignment queued again. Same results (bit
    for bit) as the plain loop and the same passes over X, but for one assignment
    more on strict convergence. `say`: as in `lloyd`. Returns the iterations run;
    the centres are ``run.C``."""
    cp = _cp()
    C, cn, C_new, cn_new = run.C, run.cn, run.C_new, run.cn_new
    X = run.src.X
    lab = [run.labels, cp.empty_like(run.labels)]
    md = [run.mind, cp.empty_like(run.mind)]
    cur = 0
    # The packed route sums with each assignment: a sums buffer per label buffer.
    S = [(run.sums, run.wsum), (cp.empty_like(run.sums), cp.empty_like(run.wsum))] if run.packed else [None, None]
    run.assign_chunk(0, X, C, cn, lab[0], md[0], lab[0], sums=S[0])
    i = 0
    for i in range(max_iter):
        run.labels, run.mind = lab[cur], md[cur]  # relocate_empty and inertia read these
        if run.packed:
            run.sums, run.wsum = S[cur]
        else:
            run.work.run(run.update_rows(0, X.shape[0], X), lab[cur], run.w, run.sums, run.wsum)
        run.finalize(C, C_new, cn_new, wait=False)
        nxt = 1 - cur
        run.assign_chunk(0, X, C_new, cn_new, lab[nxt], md[nxt], lab[cur], sums=S[nxt])
        shift_tot, n_empty, changed = run.status_wait()
        if n_empty > 0:
            run.relocate_empty(int(n_empty), C)  # C: the centres of lab[cur]
            # The flag was read by the first finalize: keep that value. The second
            # resets the one the speculative assignment set; the redone one sets it again.
            shift_tot, _, _ = run.finalize(C, C_new, cn_new)
            run.assign_chunk(0, X, C_new, cn_new, lab[nxt], md[nxt], lab[cur], sums=S[nxt])
        if say:
            say(_iteration_line(i, run.inertia()))
        C, C_new = C_new, C
        cn, cn_new = cn_new, cn
        if not changed:
            if say:
                say(_strict_line(i))
            break  # labels of this iteration (lab[cur]), as the plain loop returns
        cur = nxt
        if shift_tot <= tol:
            if say:
                say(_tol_line(i, shift_tot, tol))
            break
    run.labels, run.mind = lab[cur], md[cur]
    run.C, run.cn, run.C_new, run.cn_new = C, cn, C_new, cn_new
    return i + 1


# ------------------------------------------------------------------ kmeans_lloyd


def kmeans_lloyd(X, centers, *, sample_weight=None, max_iter=300, tol=0.0, verbose=0,
                 max_gpu_memory=None, method="auto", progress=None, precision=None):
    """Lloyd's k-means from `centers`, with scikit-learn's stopping rules, on the GPU.

    Each iteration assigns every row to its nearest centre and moves every centre to
    the weighted mean of its rows (empty clusters take the farthest points, as in
    scikit-learn). It stops when no label changed ("strict convergence") or when the
    sum of squared centre shifts is <= `tol` (an absolute tolerance: scale it as
    scikit-learn does before calling), or after `max_iter` iterations; unless it
    stopped on unchanged labels, a last assignment makes the labels match the
    returned centres. With X in GPU memory the next assignment is queued before the
    host reads an iteration's status, so the GPU does not wait for the host
    (``TSM_KMEANS_OVERLAP=0``: the plain loop, same results).

    Parameters
    ----------
    X : cupy.ndarray, torch.Tensor (CUDA), numpy.ndarray or kmeans_source, shape (n, d)
        The rows: in GPU memory, moved there once (numpy), streamed in chunks (numpy
        larger than the memory budget), or a `kmeans_source` reused across runs.
    centers : array of shape (k, d), any kind
        The initial centres.
    sample_weight : array of shape (n,), optional
        Weights of the rows (default: all ones, and no weight array is read).
    max_iter : int, default=300
        Iterations at most.
    tol : float, default=0.0
        Absolute tolerance on the total squared centre shift.
    verbose : int, default=0
        Nonzero: a line per iteration with its inertia, and one at convergence.
    max_gpu_memory : int, optional
        Bytes of GPU memory the fit may use (default: 70% of the free memory); a numpy
        X that does not fit is streamed.
    method : {"auto", "fused", "tile", "gemm", "mma", "packed"}, default="auto"
        The assignment route (see `kmeans_assign`).
    progress : callable, optional
        Takes each progress line (a str) when `verbose`; default: the logger
        ``tsm_core.kmeans.lloyd`` at INFO.
    precision : {"float32", "tf32", "bfloat16", "float16", "float64"}, optional
        How distances are computed (see `kmeans_assign`; default: X's dtype).
        float64 X with "float32" or "tf32" is converted to float32 once; the
        16-bit precisions convert X once in GPU memory (per chunk when streamed).
        Centres and sums stay float32 (float64 sums) in every precision but
        "float64".

    Returns
    -------
    labels : cupy.ndarray of shape (n,), int32
        The cluster of each row.
    inertia : float
        sum_i w_i ||x_i - c_label_i||^2.
    centers : cupy.ndarray of shape (k, d)
        The final centres, X's dtype (float32 for precisions other than float64).
    n_iter : int
        Iterations run.

    Raises
    ------
    ValueError
        `centers` does not have shape (k, d).
    RuntimeError
        No CUDA GPU (CuPy's error).

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
    >>> if tsm_core.has_gpu():
    ...     labels, inertia, C, n_iter = tsm_core.kmeans_lloyd(X, X[[0, 1]], max_iter=10)
    ...     labels, C = labels.get(), C.get()
    ... else:  # the same loop over numpy steps
    ...     from tsm_apps.kmeans._cpu import lloyd
    ...     labels, inertia, C, n_iter = lloyd(X, np.ones(4), X[[0, 1]], max_iter=10)
    >>> labels.tolist(), C.ravel().tolist(), inertia, n_iter
    ([0, 0, 1, 1], [0.5, 10.5], 1.0, 3)
    """
    cp = _cp()
    own = not isinstance(X, (_DeviceSource, _HostSource))
    if own and precision in ("float32", "tf32"):
        Xa = X if isinstance(X, np.ndarray) else to_backend(X, "X")
        if Xa.dtype == np.float64:
            X = Xa.astype(np.float32)
    src = kmeans_source(X, max_gpu_memory=max_gpu_memory, n_clusters=len(centers))
    try:
        precision = resolve_precision(precision, src.dtype)
        if precision in ("float32", "tf32") and src.dtype != np.float32:
            raise ValueError(f"precision={precision!r} needs float32 rows; this source holds {src.dtype}")
        Cin = centers if isinstance(centers, np.ndarray) else to_backend(centers, "centers")
        C = cp.array(Cin, dtype=src.dtype if precision == "float64" else np.float32, order="C", copy=True)
        if C.ndim != 2 or C.shape[1] != src.d:
            raise ValueError(f"centers must have shape (k, {src.d}); got {C.shape}")
        w = None
        if sample_weight is not None:
            w = cp.ascontiguousarray(cp.asarray(
                sample_weight if isinstance(sample_weight, np.ndarray) else to_backend(sample_weight, "sample_weight")),
                dtype=src.dtype if src.dtype in (np.float32, np.float64) else np.float32)
        run = _GpuSteps(src, C, w, method, precision)
        if not src.streamed and config.flag("TSM_KMEANS_OVERLAP"):
            n_iter = _lloyd_overlapped(run, max_iter, tol, _say(verbose, progress))
        else:
            n_iter = lloyd(run, max_iter=max_iter, tol=tol, verbose=verbose, progress=progress)
        if run.approx_mind:
            run.exact_mind()  # the reported inertia from X's own rows
        return run.labels, run.inertia(), run.C, n_iter
    finally:
        if own:
            src.close()

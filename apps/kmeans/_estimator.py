"""TSMKMeans: scikit-learn's KMeans (Lloyd) with the iterations on the GPU."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import (BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin,
                          TransformerMixin)
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_array, check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

import tsm_core
from tsm_core.arrays import kind_of, to_backend, wrap

from tsm_apps.kmeans import _cpu

_DEVICE_KINDS = ("cupy", "torch")


def _kind(X):
    """The caller's array kind; anything that is not a numpy/CuPy/torch array
    (lists, DataFrames) counts as "numpy" and goes through sklearn's validation."""
    try:
        return kind_of(X)
    except TypeError:
        return "numpy"


def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def _is_same_clustering(l1, l2):
    """True if two labelings are the same partition (labels permuted)."""
    xp = _xp(l1)
    if xp is np:
        # Linear time: l1 -> l2 is a function (compiled, stopping at the first row
        # against it), and both use as many labels.
        k = int(max(l1.max(), l2.max())) + 1
        return _cpu.maps_to(l1, l2, k) and (
            np.count_nonzero(np.bincount(l1, minlength=k)) == np.count_nonzero(np.bincount(l2, minlength=k)))
    pairs = xp.unique(l1.astype(xp.int64) * (int(max(l1.max(), l2.max())) + 1) + l2)
    return pairs.size == xp.unique(l1).size == xp.unique(l2).size


class TSMKMeans(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """K-means clustering (Lloyd's algorithm) on the GPU, as a scikit-learn estimator.

    Parameters have scikit-learn's ``KMeans`` names and meanings. Each iteration
    assigns the points with one pass of a fused tall-and-skinny kernel (distances
    ``||c||^2 - 2 x.c`` and their argmin kept in registers; when k > 32 or d < 512,
    a SIMT GEMM tile kernel with the argmin fused, or cuBLAS, whichever measures
    faster) and updates the centres with a deterministic segmented sum (a second
    pass; no floating-point atomics). numpy X larger than the GPU memory budget is streamed
    from host memory. Without a GPU (or with ``device="cpu"``) the same loop runs on
    the CPU over scikit-learn's compiled Lloyd iteration (numpy steps for small
    problems, or with ``TSM_KMEANS_CPU=numpy``; see the k-means guide).

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters (centres).
    init : {"k-means++", "k-means||", "random"}, callable or array of shape (n_clusters, n_features), \
default="k-means++"
        "k-means++": scikit-learn's greedy k-means++ (2 + int(log k) trials per centre).
        "k-means||": k-means|| (Bahmani et al. 2012): 5 passes over X that take about
        n_clusters / 2 candidates each, then greedy k-means++ on the weighted candidates;
        for large n_clusters, where k-means++ costs a pass over X per centre.
        A callable is called as ``init(X, n_clusters, random_state=rs)``.
    n_init : "auto" or int, default="auto"
        Runs from different seeds; "auto" is 1 for "k-means++", "k-means||" and arrays,
        10 otherwise.
    max_iter : int, default=300
        Lloyd iterations at most, per run.
    tol : float, default=1e-4
        Relative to the mean variance of the features; stop when the total squared
        centre shift is below it. Labels that no longer change stop the run at any tol.
    verbose : int, default=0
        Nonzero: print "Initialization complete", a line per iteration with its
        inertia and one at convergence (scikit-learn's lines, on stdout).
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation (the same draws as scikit-learn's ``KMeans``).
    copy_x : bool, default=True
        CPU path: False centres X in place and restores it after (as scikit-learn).
        The GPU path never writes X.
    device : {"auto", "gpu", "cpu"}, default="auto"
        "auto": the GPU when one is found (numpy X included, moved once), else the CPU.
    max_gpu_memory : int or None, default=None
        Bytes of GPU memory a fit may use (default 70% of the free memory). numpy X
        that does not fit is streamed through the GPU in chunks.
    precision : {"float32", "tf32", "bfloat16", "float16", "float64"} or None, default=None
        How the GPU computes distances (None: X's dtype). "float32": labels as
        trustworthy as exact float32 evaluation, on the tensor cores where k is
        large (near ties decided again in float64); "tf32": tensor-core products
        only, fastest for float32 X (labels may differ on near ties); "bfloat16" /
        "float16": X held in 16 bits on the GPU (converted once), float32
        accumulation and centres; "float64" needs float64 X. The CPU computes in
        X's dtype whatever this says. See the k-means guide.
    distributed : bool, default=False
        True: `fit` clusters the union of the shards that the ranks of the initialised
        torch.distributed default group pass (each rank its own X, zero rows allowed;
        numpy on the CPU with gloo, CuPy / torch CUDA or ``device="gpu"`` on the GPUs
        with NCCL): the centres, inertia and iterations are those of the union, the
        same on every rank; ``labels_`` are the local rows'; `predict` and `transform`
        act on local data. One allreduce of k * (d + 1) + 2 floats per iteration.
        See the distributed guide.
    timeout : float or None, default=None
        With `distributed`: seconds a collective may wait before every rank still
        alive raises (a rank died or stopped answering); default ``TSM_DIST_TIMEOUT``.

    Attributes
    ----------
    cluster_centers_ : array of shape (n_clusters, n_features)
        The centres, in the caller's array kind and dtype.
    labels_ : array of shape (n_samples,), int32
        The cluster of each training sample, in the caller's array kind.
    inertia_ : float
        Sum of the weighted squared distances of the samples to their centres.
    n_iter_ : int
        Iterations of the best run.
    n_features_in_ : int
        Features seen by `fit`.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps.kmeans import TSMKMeans
    >>> X = np.array([[1., 2.], [1., 4.], [1., 0.], [10., 2.], [10., 4.], [10., 0.]])
    >>> km = TSMKMeans(n_clusters=2, random_state=0, device="cpu").fit(X)
    >>> sorted(km.cluster_centers_.tolist())
    [[1.0, 2.0], [10.0, 2.0]]
    >>> km.predict(np.array([[0., 0.], [12., 3.]])).tolist() == [km.labels_[0], km.labels_[3]]
    True
    """

    _parameter_constraints: dict = {
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "init": [StrOptions({"k-means++", "k-means||", "random"}), callable, "array-like"],
        "n_init": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "copy_x": ["boolean"],
        "device": [StrOptions({"auto", "gpu", "cpu"})],
        "max_gpu_memory": [Interval(Integral, 1, None, closed="left"), None],
        "precision": [StrOptions({"float32", "tf32", "bfloat16", "float16", "float64"}), None],
        "distributed": ["boolean"],
        "timeout": [Interval(Real, 0, None, closed="neither"), None],
    }

    def __init__(self, n_clusters=8, *, init="k-means++", n_init="auto", max_iter=300, tol=1e-4,
                 verbose=0, random_state=None, copy_x=True, device="auto", max_gpu_memory=None, precision=None,
                 distributed=False, timeout=None):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.copy_x = copy_x
        self.precision = precision
        self.device = device
        self.max_gpu_memory = max_gpu_memory
        self.distributed = distributed
        self.timeout = timeout

    # ------------------------------------------------------------ input handling

    def _on_gpu(self, kind):
        if self.device == "cpu":
            return False
        if kind in _DEVICE_KINDS:
            return True
        if self.device == "gpu":
            if not tsm_core.has_gpu():
                raise RuntimeError("device='gpu' but no CUDA GPU is usable (tsm_core.has_gpu() is False)")
            return True
        return tsm_core.has_gpu()

    def _check_device_X(self, X, reset, distributed=False):
        """Validate a CuPy / torch CUDA X as check_array would (2-D, floats, finite);
        `distributed`: zero rows allowed, finiteness left to the ranks' agreement."""
        import cupy as cp

        Xb = to_backend(X, "X")
        if Xb.ndim != 2:
            raise ValueError(f"Expected 2D array, got {Xb.ndim}D array instead.")
        if Xb.dtype.kind == "c":
            raise ValueError("Complex data not supported")
        if Xb.dtype not in (np.float32, np.float64):
            Xb = Xb.astype(cp.float64)
        n, d = Xb.shape
        if n < 1 and not distributed:
            raise ValueError(f"Found array with 0 sample(s) (shape={Xb.shape}) while a minimum of 1 is required.")
        if d < 1:
            raise ValueError(f"Found array with 0 feature(s) (shape={Xb.shape}) while a minimum of 1 is required.")
        if not distributed and not bool(cp.isfinite(Xb).all()):
            raise ValueError("Input X contains NaN or infinity.")
        if reset:
            self.n_features_in_ = d
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        elif d != self.n_features_in_:
            raise ValueError(f"X has {d} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input.")
        return Xb

    def _check_X(self, X, reset, copy=False, distributed=False):
        """(backend array, caller's kind): CuPy for device inputs, numpy otherwise.
        `distributed`: zero rows allowed, finiteness left to the ranks' agreement."""
        kind = _kind(X)
        if kind in _DEVICE_KINDS:
            return self._check_device_X(X, reset, distributed), kind
        if kind == "torch-cpu":
            X = to_backend(X, "X")
        relax = {"ensure_min_samples": 0, "ensure_all_finite": False} if distributed else {}
        X = validate_data(self, X, reset=reset, dtype=[np.float64, np.float32], order="C", copy=copy,
                          accept_sparse=False, **relax)
        return X, kind

    def _weights(self, sample_weight, X):
        """Validated weights, same backend and dtype as X (sklearn's errors)."""
        if isinstance(X, np.ndarray):
            if sample_weight is not None and _kind(sample_weight) in _DEVICE_KINDS:
                import cupy as cp

                sample_weight = cp.asnumpy(to_backend(sample_weight, "sample_weight"))
            return _check_sample_weight(sample_weight, X, dtype=X.dtype, ensure_non_negative=True)
        import cupy as cp

        n = X.shape[0]
        if sample_weight is None:
            return cp.ones(n, dtype=X.dtype)
        if _kind(sample_weight) in _DEVICE_KINDS:
            w = to_backend(sample_weight, "sample_weight")
        else:
            w = np.asarray(sample_weight)
        if w.ndim == 0:
            return cp.full(n, float(w), dtype=X.dtype)
        if w.ndim != 1:
            raise ValueError("Sample weights must be 1D array or scalar")
        if w.shape != (n,):
            raise ValueError(f"sample_weight.shape == {w.shape}, expected ({n},)!")
        w = cp.asarray(w, dtype=X.dtype)
        if bool((w < 0).any()):
            raise ValueError("Negative values in data passed to sample_weight")
        if not bool(cp.isfinite(w).all()):
            raise ValueError("Input sample_weight contains NaN or infinity.")
        return w

    def _n_init_for(self):
        if self.n_init == "auto":
            if isinstance(self.init, str) and self.init in ("k-means++", "k-means||"):
                return 1
            if isinstance(self.init, str) or callable(self.init):
                return 10
            return 1
        return self.n_init

    def _init_array(self, X, xp):
        init = self.init
        if xp is np:
            if _kind(init) in _DEVICE_KINDS:
                import cupy as cp

                init = cp.asnumpy(to_backend(init, "init"))
            init = check_array(init, dtype=X.dtype, copy=True, order="C")
        else:
            if _kind(init) in _DEVICE_KINDS:
                init = to_backend(init, "init")
            init = xp.array(init, dtype=X.dtype, order="C", copy=True)
        self._validate_center_shape(X, init)
        return init

    def _validate_center_shape(self, X, centers):
        if centers.ndim != 2 or centers.shape[0] != self.n_clusters:
            raise ValueError(f"The shape of the initial centers {centers.shape} does not "
                             f"match the number of clusters {self.n_clusters}.")
        if centers.shape[1] != X.shape[1]:
            raise ValueError(f"The shape of the initial centers {centers.shape} does not "
                             f"match the number of features of the data {X.shape[1]}.")

    # ------------------------------------------------------------ fit

    def fit(self, X, y=None, sample_weight=None):
        """Compute k-means clustering.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy (or anything ``check_array`` takes), CuPy, or torch (CPU or CUDA).
            Device arrays are clustered on their GPU without a copy; the GPU path never
            writes X.
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the samples (default: all ones). Not used by the initialisation
            when `init` is a callable or an array (as scikit-learn).

        Returns
        -------
        self : TSMKMeans
            The fitted estimator.

        Raises
        ------
        ValueError
            Invalid parameters or input (as scikit-learn): fewer samples than clusters,
            NaN or infinity, negative or misshapen weights, initial centres of the
            wrong shape. With `distributed`, raised on every rank alike, before the
            first iteration, also for shards of different widths or dtypes.
        RuntimeError
            ``device="gpu"`` where no CUDA GPU is usable; with `distributed`, no
            initialised process group.
        tsm_core.distributed.DistributedError
            With `distributed`: a collective failed or outlasted `timeout` (another
            rank died or stopped answering).

        Warns
        -----
        ConvergenceWarning
            Fewer distinct clusters than `n_clusters` were found.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps.kmeans import TSMKMeans
        >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
        >>> km = TSMKMeans(2, init=X[[0, 2]], device="cpu").fit(X)
        >>> km.cluster_centers_.ravel().tolist(), km.labels_.tolist(), km.inertia_
        ([0.5, 10.5], [0, 0, 1, 1], 1.0)
        """
        self._validate_params()
        if self.distributed:
            from tsm_apps.kmeans._distributed import fit_distributed

            return fit_distributed(self, X, sample_weight)
        kind = _kind(X)
        gpu = self._on_gpu(kind)
        copy = self.copy_x and not gpu
        Xb, kind = self._check_X(X, reset=True, copy=copy)
        if not gpu and not isinstance(Xb, np.ndarray):
            Xb = Xb.get()  # device='cpu' with a device array: compute on a host copy
        n = Xb.shape[0]
        if n < self.n_clusters:
            raise ValueError(f"n_samples={n} should be >= n_clusters={self.n_clusters}.")
        n_init = self._n_init_for()
        init_is_array = not isinstance(self.init, str) and not callable(self.init)
        if init_is_array and n_init != 1:
            warnings.warn("Explicit initial center position passed: performing only one init in "
                          f"{type(self).__name__} instead of n_init={n_init}.", RuntimeWarning, stacklevel=2)
            n_init = 1
        self._n_init = n_init
        random_state = check_random_state(self.random_state)
        w = self._weights(sample_weight, Xb)
        if gpu:
            labels, inertia, centers, n_iter = self._fit_gpu(Xb, X, w, random_state, init_is_array)
        else:
            labels, inertia, centers, n_iter = self._fit_cpu(Xb, X, w, random_state, init_is_array)
        xp = _xp(labels)
        if xp is np:
            distinct = int(np.count_nonzero(np.bincount(labels, minlength=self.n_clusters)))
        else:
            distinct = int(xp.unique(labels).size)
        if distinct < self.n_clusters:
            warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                          f"({self.n_clusters}). Possibly due to duplicate points in X.",
                          ConvergenceWarning, stacklevel=2)
        back = kind if kind != "numpy" else "numpy"
        if back in _DEVICE_KINDS and isinstance(centers, np.ndarray):
            import cupy as cp

            centers, labels = cp.asarray(centers), cp.asarray(labels)
        if back == "numpy" and not isinstance(centers, np.ndarray):
            centers, labels = centers.get(), labels.get()
        self.cluster_centers_ = wrap(centers, back)
        self.labels_ = wrap(labels, back)
        self.inertia_ = float(inertia)
        self.n_iter_ = int(n_iter)
        self._n_features_out = self.n_clusters
        return self

    def _tolerance(self, X):
        if self.tol == 0:
            return 0.0
        xp = _xp(X)
        # Chunked float64 variance about the first row (bounded memory, no cancellation).
        shift = X[0].astype(xp.float64)
        s1 = xp.zeros(X.shape[1])
        s2 = xp.zeros(X.shape[1])
        step = max(1, (1 << 24) // X.shape[1])
        for a in range(0, X.shape[0], step):
            y = X[a:a + step].astype(xp.float64) - shift
            s1 += y.sum(0)
            s2 += (y * y).sum(0)
        m = s1 / X.shape[0]
        return float(xp.mean(s2 / X.shape[0] - m * m)) * self.tol

    def _callable_init(self, Xcaller, rs, dtype, xp):
        c = self.init(Xcaller, self.n_clusters, random_state=rs)
        if _kind(c) in _DEVICE_KINDS:
            c = to_backend(c, "init")
            c = c.get() if xp is np else c
        if xp is np:
            c = check_array(c, dtype=dtype, copy=False, order="C")
        else:
            c = xp.array(c, dtype=dtype, order="C")
        return c

    def _best(self, runs_iter):
        best = None
        for labels, inertia, centers, n_iter in runs_iter:
            if best is None or (inertia < best[1] and not _is_same_clustering(labels, best[0])):
                best = (labels, inertia, centers, n_iter)
        return best

    def _runs(self, X, *, init, rs, w_host, plusplus, parallel, rows, init_X, xp, run):
        """The n_init runs, each from its own initial centres: an explicit array, k-means++
        (`plusplus()`), k-means|| (`parallel()`), k rows drawn by the weights `w_host()`
        (`rows(seeds)`), or the callable's centres (called on `init_X`); `run(c0)` is one
        Lloyd run on the backend."""
        for _ in range(self._n_init):
            if init is not None:
                c0 = init
            elif isinstance(self.init, str) and self.init == "k-means++":
                c0 = plusplus()
            elif isinstance(self.init, str) and self.init == "k-means||":
                c0 = parallel()
            elif isinstance(self.init, str):
                wh = w_host()
                seeds = rs.choice(X.shape[0], size=self.n_clusters, replace=False, p=wh / wh.sum())
                c0 = rows(seeds)
            else:
                c0 = self._callable_init(init_X, rs, X.dtype, xp)
                self._validate_center_shape(X, c0)
            if self.verbose:
                print("Initialization complete")
            yield run(c0)

    def _fit_cpu(self, X, Xcaller, w, rs, init_is_array):
        # Centre X as scikit-learn does: more accurate ||x||^2 - 2 x.c + ||c||^2.
        X_mean = X.mean(axis=0)
        X -= X_mean
        init = self._init_array(X, np) - X_mean if init_is_array else None
        tol = self.tol * _cpu.mean_variance(X) if self.tol else 0.0
        engine = _cpu.engine(X.shape[0] * X.shape[1] * self.n_clusters)
        # Weights converted, thread count decided, ||x||^2 computed: once for all runs.
        ws = _cpu.Workspace(X, w, engine)
        try:
            labels, inertia, centers, n_iter = self._best(self._runs(
                X, init=init, rs=rs, w_host=lambda: w, init_X=X, xp=np,
                plusplus=lambda: _cpu.kmeans_plusplus(X, self.n_clusters, rs, w, ws.xx())[0],
                parallel=lambda: _cpu.kmeans_parallel(X, self.n_clusters, rs, w, ws.xx())[0],
                rows=lambda seeds: X[seeds],
                run=lambda c0: _cpu.lloyd(X, w, c0, max_iter=self.max_iter, tol=tol, verbose=self.verbose,
                                          progress=print, workspace=ws)))
        finally:
            if not self.copy_x:
                X += X_mean
        return labels, inertia, centers + X_mean, n_iter

    def _fit_gpu(self, X, Xcaller, w, rs, init_is_array):
        import cupy as cp

        init = self._init_array(X, cp) if init_is_array else None
        tol = self._tolerance(X)
        # Unit weights are left out of the kernels (they read no weight array).
        wk = None if bool((w == 1).all()) else w
        with tsm_core.kmeans_source(X, max_gpu_memory=self.max_gpu_memory, n_clusters=self.n_clusters) as src:
            return self._best(self._runs(
                X, init=init, rs=rs, w_host=lambda: cp.asnumpy(w).astype(np.float64), init_X=Xcaller, xp=cp,
                plusplus=lambda: tsm_core.kmeans_plusplus(src, self.n_clusters, random_state=rs, sample_weight=w)[0],
                parallel=lambda: tsm_core.kmeans_parallel(src, self.n_clusters, random_state=rs, sample_weight=w)[0],
                rows=lambda seeds: cp.asarray(X[seeds]) if isinstance(X, np.ndarray) else X[cp.asarray(seeds)],
                run=lambda c0: tsm_core.kmeans_lloyd(src, c0, sample_weight=wk, max_iter=self.max_iter, tol=tol,
                                                     verbose=self.verbose, progress=print,
                                                     precision=self._gpu_precision(X))))

    def _gpu_precision(self, X):
        """The `precision` for the GPU fit of X (validated; None: X's own)."""
        if self.precision in ("float32", "tf32") and X.dtype != np.float32:
            raise ValueError(f"precision={self.precision!r} needs float32 X; got {X.dtype} "
                             "(pass X as float32)")
        return self.precision

    # ------------------------------------------------------------ predict & co

    def _centers_for(self, Xb):
        C = self.cluster_centers_
        if _kind(C) in _DEVICE_KINDS:
            C = to_backend(C, "cluster_centers_")
            if isinstance(Xb, np.ndarray):
                C = C.get()
        elif _kind(C) == "torch-cpu":
            C = to_backend(C, "cluster_centers_")
        if not isinstance(Xb, np.ndarray):
            import cupy as cp

            C = cp.asarray(C)
        return C.astype(Xb.dtype, copy=False)

    def _prepare(self, X):
        check_is_fitted(self)
        kind = _kind(X)
        Xb, kind = self._check_X(X, reset=False)
        gpu = self._on_gpu(kind)
        if not gpu and not isinstance(Xb, np.ndarray):
            Xb = Xb.get()
        return Xb, kind, gpu

    def _labels_mind(self, Xb, gpu):
        C = self._centers_for(Xb)
        if not gpu:
            return _cpu.assign(Xb, C)
        import cupy as cp

        if not isinstance(Xb, np.ndarray):
            return tsm_core.kmeans_assign(Xb, cp.ascontiguousarray(C))
        # numpy X on the GPU: in row blocks of at most 256 MiB.
        Cd = cp.ascontiguousarray(cp.asarray(C))
        rows = max(1, (256 << 20) // max(1, Xb.shape[1] * Xb.itemsize))
        parts = [tsm_core.kmeans_assign(cp.asarray(Xb[a:a + rows]), Cd) for a in range(0, Xb.shape[0], rows)]
        return (np.concatenate([p[0].get() for p in parts]), np.concatenate([p[1].get() for p in parts]))

    @staticmethod
    def _back(a, kind):
        if kind in _DEVICE_KINDS:
            import cupy as cp

            return wrap(cp.asarray(a), kind)
        if not isinstance(a, np.ndarray):
            a = a.get()
        return wrap(a, kind)

    def predict(self, X):
        """Index of the closest fitted centre of each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy, CuPy or torch (CPU or CUDA).

        Returns
        -------
        labels : array of shape (n_samples,), int32
            In the caller's array kind.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Called before `fit`.
        ValueError
            X has another number of features than the fitted data, or NaN / infinity.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps.kmeans import TSMKMeans
        >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
        >>> km = TSMKMeans(2, init=X[[0, 2]], device="cpu").fit(X)
        >>> km.predict(np.array([[2.0], [9.0]])).tolist()
        [0, 1]
        """
        Xb, kind, gpu = self._prepare(X)
        labels, _ = self._labels_mind(Xb, gpu)
        return self._back(labels, kind)

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit on X and return its labels (``fit(X).labels_``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy, CuPy or torch (CPU or CUDA).
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the samples.

        Returns
        -------
        labels : array of shape (n_samples,), int32
            In the caller's array kind.

        Raises
        ------
        ValueError
            As `fit`.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps.kmeans import TSMKMeans
        >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
        >>> TSMKMeans(2, init=X[[0, 2]], device="cpu").fit_predict(X).tolist()
        [0, 0, 1, 1]
        """
        return self.fit(X, sample_weight=sample_weight).labels_

    def transform(self, X):
        """Euclidean distances of each sample to each fitted centre.

        On the GPU, ``X @ C.T`` is the tall-and-skinny product that ``tsm_core.matmul``
        runs on its own kernels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy, CuPy or torch (CPU or CUDA).

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
            X's dtype, in the caller's array kind.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Called before `fit`.
        ValueError
            X has another number of features than the fitted data, or NaN / infinity.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps.kmeans import TSMKMeans
        >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
        >>> km = TSMKMeans(2, init=X[[0, 2]], device="cpu").fit(X)
        >>> km.transform(np.array([[2.0]])).tolist()
        [[1.5, 8.5]]
        """
        Xb, kind, gpu = self._prepare(X)
        C = self._centers_for(Xb)
        if not gpu or isinstance(Xb, np.ndarray) and not gpu:
            return self._back(_cpu.distances(Xb, C), kind)
        import cupy as cp

        Xd = cp.asarray(Xb)
        Cd = cp.ascontiguousarray(C)
        # X @ C^T is the tall-and-skinny product (k small): tsm_core picks its kernel.
        G = tsm_core.matmul(Xd, cp.ascontiguousarray(Cd.T))
        D = (Xd * Xd).sum(1)[:, None] - 2 * G + (Cd * Cd).sum(1)[None, :]
        return self._back(cp.sqrt(cp.maximum(D, 0)), kind)

    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit on X and return its distances to the centres (``fit(X).transform(X)``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy, CuPy or torch (CPU or CUDA).
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the samples.

        Returns
        -------
        distances : array of shape (n_samples, n_clusters)
            X's dtype, in the caller's array kind.

        Raises
        ------
        ValueError
            As `fit`.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps.kmeans import TSMKMeans
        >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
        >>> TSMKMeans(2, init=X[[0, 2]], device="cpu").fit_transform(X)[:, 0].tolist()
        [0.5, 0.5, 9.5, 10.5]
        """
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the (weighted) inertia of X on the fitted centres.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy, CuPy or torch (CPU or CUDA).
        y : None
            Ignored; present for the scikit-learn API.
        sample_weight : array-like of shape (n_samples,), optional
            Weights of the samples (default: all ones).

        Returns
        -------
        score : float
            ``-sum_i w_i ||x_i - c_label_i||^2`` (larger is better).

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Called before `fit`.
        ValueError
            X has another number of features than the fitted data, or misshapen weights.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps.kmeans import TSMKMeans
        >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
        >>> km = TSMKMeans(2, init=X[[0, 2]], device="cpu").fit(X)
        >>> km.score(X)
        -1.0
        """
        Xb, kind, gpu = self._prepare(X)
        w = self._weights(sample_weight, Xb)
        _, mind = self._labels_mind(Xb, gpu)
        if isinstance(mind, np.ndarray):
            wn = w if isinstance(w, np.ndarray) else w.get()
            return -float(mind.astype(np.float64) @ wn.astype(np.float64))
        return -float((mind.astype(np.float64) * w.astype(np.float64)).sum())

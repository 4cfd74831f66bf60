"""A blocked right-looking Cholesky factorisation whose trailing updates are checksum-protected."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tsm_core import arrays

from tsm_apps.abft._core import ft_matmul


@dataclass(frozen=True)
class SolverFix:
    """A correction made during the factorisation, in the coordinates of the full matrix."""

    step: int  # block column whose trailing update was struck
    row: int
    col: int
    old: float  # the corrupted value of the update L21 @ L21.T
    new: float  # the corrected value
    method: str


@dataclass
class SolverReport:
    """What ``cholesky`` checked and corrected."""

    n: int
    block: int
    steps: int = 0  # protected trailing updates
    fixes: list = field(default_factory=list)
    max_ratio: float = 0.0  # the largest |d| / tau of the clean checks

    def summary(self) -> str:
        lines = [f"Cholesky n={self.n}, block={self.block}: {self.steps} protected updates, "
                 f"{len(self.fixes)} correction(s)"]
        for f in self.fixes:
            lines.append(f"  step {f.step}: L21 L21^T[{f.row}, {f.col}] {f.old!r} -> {f.new!r} ({f.method})")
        return "\n".join(lines)


def cholesky(A, *, block=128, c=2, inject=None, recompute=True, **ft_kwargs):
    """Lower Cholesky factor L of a symmetric positive definite A (A = L L^T), fault tolerant.

    Blocked right-looking: for each block column, factor the diagonal block,
    solve for the panel L21, then update the trailing matrix ``A22 -= L21 @ L21.T``.
    That update is the GEMM of the factorisation (all but O(n^2 block) of its
    flops) and runs through ``ft_matmul``: a fault striking it is detected,
    located and corrected from the checksums before it can propagate into the
    rest of the factorisation.

    A has shape (n, n). The factor is computed on A's device (numpy: CPU).

    Parameters
    ----------
    A : numpy.ndarray, cupy.ndarray or torch.Tensor, float32 or float64, (n, n)
        Symmetric positive definite; only the lower triangle is read.
    block : int
        Block column width.
    c : int
        Checksums per row of each protected update.
    inject : callable, optional
        ``inject(step, P)`` is called with each trailing update P = L21 @ L21.T
        between its GEMM and its verification (the fault-injection hook).
    recompute : bool
        Passed to ``ft_matmul``: rows the checksums cannot repair are recomputed.
    **ft_kwargs
        Other ``ft_matmul`` options (bound, confidence).

    Returns
    -------
    L : array of A's kind, shape (n, n)
        The lower triangular factor.
    report : SolverReport
        The protected updates and the corrections made.

    Raises
    ------
    TypeError
        A is not float32 or float64, or `inject` is not callable.
    ValueError
        A is not square, or `block` is not a positive int.
    ABFTError
        A trailing update was damaged beyond what the checksums (and recomputation)
        repair.
    numpy.linalg.LinAlgError
        A is not positive definite (numpy's error; CuPy returns NaNs instead).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> rng = np.random.default_rng(0)
    >>> G = rng.standard_normal((300, 300)); A = G @ G.T + 300 * np.eye(300)
    >>> L, rep = abft.cholesky(A, block=64, inject=lambda step, P: abft.flip_bit(P, 5, 9, 62) if step == 1 else None)
    >>> [(f.step, f.row, f.col) for f in rep.fixes]
    [(1, 133, 137)]
    >>> bool(np.linalg.norm(A - L @ L.T) / np.linalg.norm(A) < 1e-14)
    True
    """
    kind = arrays.kind_of(A, "A")
    Ab = arrays.to_backend(A, "A")
    dt = arrays.numpy_dtype(A)
    if dt is None or dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"A has dtype {arrays.dtype_name(A)}; cholesky supports float32 and float64")
    if Ab.ndim != 2 or Ab.shape[0] != Ab.shape[1]:
        raise ValueError(f"A must be square (n, n), got shape {tuple(Ab.shape)}")
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if inject is not None and not callable(inject):
        raise TypeError("inject must be a callable inject(step, P) or None")
    xp = np if isinstance(Ab, np.ndarray) else __import__("cupy")
    n = Ab.shape[0]
    L = xp.array(Ab, order="C", copy=True)
    rep = SolverReport(n=n, block=int(block))
    for step, p in enumerate(range(0, n, block)):
        e = min(p + block, n)
        try:
            L11 = xp.linalg.cholesky(L[p:e, p:e])
        except Exception as exc:  # numpy: LinAlgError; CuPy returns NaN instead
            raise np.linalg.LinAlgError(f"A is not positive definite (block at {p})") from exc
        if not bool(xp.isfinite(L11).all()):
            raise np.linalg.LinAlgError(f"A is not positive definite (block at {p})")
        L[p:e, p:e] = L11
        if e == n:
            break
        # L21 = A21 L11^{-T}, by solving L11 X = A21^T.
        L21 = xp.ascontiguousarray(xp.linalg.solve(L11, L[e:, p:e].T).T)
        L[e:, p:e] = L21
        hook = None if inject is None else (lambda P, _s=step: inject(_s, P))
        P, r = ft_matmul(L21, L21.T, c=c, inject=hook, recompute=recompute, **ft_kwargs)
        L[e:, e:] -= P
        rep.steps += 1
        if r.clean:
            rep.max_ratio = max(rep.max_ratio, r.max_ratio)
        for f in r.corrections:
            rep.fixes.append(SolverFix(step, f.row + e, f.col + e, f.old, f.new, f.method))
    L = xp.tril(L)
    return arrays.wrap(L, kind), rep

"""Tall-and-skinny products across the ranks of a ``torch.distributed`` process group.

``C = alpha * A @ B`` with A split across the ranks and B replicated:

- ``shard="rows"``: each rank holds a block of rows of A, ``A_local`` (M_local, K),
  and gets its rows of C, (M_local, N). Nothing is communicated but the check of
  the operands; the product is ``tsm_core.matmul`` on each rank.
- ``shard="k"``: each rank holds a block of columns of A, ``A_local`` (M, K_local);
  rank r multiplies it by the matching rows of B (its slice, or the rows at its
  offset of the full B), then one allreduce (sum) of the partial C, (M, N), gives
  every rank the whole C.

Before any work the ranks exchange one small row of integers each (an
``all_gather`` of the shape, dtype, device and a local verdict): operands that do
not fit together raise the same ``ValueError`` on every rank, where a mismatch left
unchecked would hang a collective or give a wrong answer. The communication goes
through torch (NCCL between GPUs, gloo on CPUs); CuPy arrays are viewed as torch
tensors through DLPack, without copies. torch is imported when a function is
called, not with this module.
"""

from __future__ import annotations

import contextlib

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime.checks import check_operands
from tsm_core.tsm2.api import matmul

__all__ = ["distributed_matmul"]

SHARDS = ("rows", "k")
_DTYPE_CODES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}
_DTYPE_NAMES = {1: "float32", 2: "float64"}
# One row per rank of the exchange: a local error flag, then the sizes, the result
# dtype (code above) and where the operands live (0 host, 1 GPU).
_FIELDS = ("error", "m", "k", "b_rows", "n", "dtype", "gpu")


def _dist():
    """torch.distributed, checked to be initialised."""
    try:
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - torch is a dependency
        raise RuntimeError("distributed_matmul needs torch (torch.distributed)") from e
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "distributed_matmul needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group, or torchrun)")
    return dist


def _local_row(A_local, B, out, alpha, shard):
    """This rank's row of the exchange and its error message ("" if none)."""
    B_check = B
    try:
        # shard="k" with the full B: its first K_local rows stand in for the rank's
        # slice in the local checks (same kind, dtype and device); whether B has
        # the whole K rows is checked once every rank's K_local is known.
        if (shard == "k" and getattr(A_local, "ndim", 0) == 2 and getattr(B, "ndim", 0) == 2
                and B.shape[0] > A_local.shape[1]):
            B_check = B[: A_local.shape[1]]
        ops = check_operands(A_local, B_check, out=out, alpha=alpha)
    except (TypeError, ValueError) as e:
        return [1, -1, -1, -1, -1, 0, -1], f"{type(e).__name__}: {e}"
    gpu = int(ops.kind in ("cupy", "torch"))
    return [0, ops.m, ops.k, int(B.shape[0]), ops.n, _DTYPE_CODES[np.dtype(ops.dtype)], gpu], ""


def _comm_device(torch, dist, group):
    """Where the small exchange tensors live: host memory if the group has a CPU
    backend (gloo), else this process's current GPU (NCCL takes no host tensors)."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu"), backend
    return torch.device("cuda", torch.cuda.current_device()), backend


def _exchange(row, group):
    """Every rank's row, in group-rank order (one all_gather of a few int64)."""
    import torch

    dist = _dist()
    device, backend = _comm_device(torch, dist, group)
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, mine, group=group)
    return [[int(v) for v in r.tolist()] for r in rows], backend


def _ranks(table, field, value):
    i = _FIELDS.index(field)
    return [r for r, row in enumerate(table) if row[i] == value]


def _disagree(table, field, what) -> str | None:
    """A sentence naming the ranks of each value of `field` where they are not all
    equal, else None."""
    i = _FIELDS.index(field)
    values = sorted({row[i] for row in table})
    if len(values) <= 1:
        return None
    name = (lambda v: _DTYPE_NAMES.get(v, str(v))) if field == "dtype" else (
        (lambda v: "GPU" if v else "host") if field == "gpu" else str)
    parts = [f"{name(v)} on rank{'s' if len(_ranks(table, field, v)) > 1 else ''} "
             f"{', '.join(map(str, _ranks(table, field, v)))}" for v in values]
    return f"{what} differs across ranks: " + "; ".join(parts)


def _check_table(table, shard, backend) -> list[str]:
    """Every problem that the exchanged rows show; identical on every rank."""
    problems = []
    same = [("n", "N (the columns of B)"), ("dtype", "the result dtype"),
            ("gpu", "where the operands live")]
    if shard == "rows":
        same.insert(0, ("k", "K (the columns of A_local, the rows of B)"))
    else:
        same.insert(0, ("m", "M (the rows of A_local)"))
    for field, what in same:
        msg = _disagree(table, field, what)
        if msg:
            problems.append(msg)
    if shard == "k":
        k_total = sum(row[_FIELDS.index("k")] for row in table)
        for r, row in enumerate(table):
            k_local, b_rows = row[_FIELDS.index("k")], row[_FIELDS.index("b_rows")]
            if b_rows not in (k_local, k_total):
                problems.append(
                    f"rank {r}: B has {b_rows} rows; pass its slice of K_local = {k_local} rows "
                    f"or the whole B of K = {k_total} rows")
    if backend == "nccl" and any(row[_FIELDS.index("gpu")] == 0 for row in table):
        problems.append("host arrays (numpy, torch CPU) need a process group with a CPU "
                        "backend (gloo); this one is NCCL only")
    return problems


def _validate(A_local, B, out, alpha, shard, group):
    """Exchange and check; the table of every rank's row, or the same ValueError
    on every rank."""
    row, message = _local_row(A_local, B, out, alpha, shard)
    table, backend = _exchange(row, group)
    errors = _ranks(table, "error", 1)
    if errors:
        # Only on this path (every rank sees the same flags): the messages themselves.
        dist = _dist()
        messages = [None] * len(table)
        dist.all_gather_object(messages, message, group=group)
        raise ValueError(
            f"distributed_matmul(shard={shard!r}): operands refused on rank"
            f"{'s' if len(errors) > 1 else ''} {', '.join(map(str, errors))}: "
            + "; ".join(f"rank {r}: {messages[r]}" for r in errors))
    problems = _check_table(table, shard, backend)
    if problems:
        raise ValueError(f"distributed_matmul(shard={shard!r}): " + "; ".join(problems))
    return table


def _torch_view(C, kind):
    """A torch tensor sharing C's memory."""
    import torch

    if kind == "numpy":
        return torch.from_numpy(C)
    if kind == "cupy":
        return torch.from_dlpack(C)
    return C


def _stream_context(torch, kind):
    """Run the collective on CuPy's current stream where C is a CuPy array, so that
    it follows the product and what comes next follows it (torch's NCCL collective
    waits on, and is then waited for by, torch's current stream)."""
    if kind != "cupy":
        return contextlib.nullcontext()
    import cupy

    ptr = cupy.cuda.get_current_stream().ptr
    stream = torch.cuda.default_stream() if ptr == 0 else torch.cuda.ExternalStream(ptr)
    return torch.cuda.stream(stream)


def _allreduce_sum(C, kind, group):
    """Sum C over the group, in place."""
    import torch

    dist = _dist()
    t = _torch_view(C, kind)
    with _stream_context(torch, kind):
        if t.is_contiguous():
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        else:  # an out given as a strided view: reduce a dense copy, write it back
            dense = t.contiguous()
            dist.all_reduce(dense, op=dist.ReduceOp.SUM, group=group)
            t.copy_(dense)


def distributed_matmul(A_local, B, *, shard="rows", group=None, out=None, alpha=1.0,
                       validate=None):
    """``alpha * A @ B`` with A split across the ranks of a process group, B replicated.

    With ``shard="rows"``, A_local has shape (M_local, K) (this rank's rows of A), B
    (K, N), and the result (M_local, N) is this rank's rows of C. With
    ``shard="k"``, A_local has shape (M, K_local) (this rank's columns of A, ranks in
    group-rank order), B either (K_local, N) (the matching rows of B, sliced by the
    caller) or (K, N) (the whole B, of which the rows at this rank's offset, the
    sum of K_local over the lower ranks, are used), and the result (M, N) is the
    whole C, the same on every rank. M_local and K_local may differ between ranks
    and may be 0.

    Parameters
    ----------
    A_local : numpy.ndarray, cupy.ndarray or torch.Tensor
        This rank's block of A, float32 or float64, any memory order.
    B : array of the same kind
        Replicated (``shard="rows"``), or as described above (``shard="k"``).
    shard : {"rows", "k"}, default "rows"
        How A is split. "rows" communicates nothing but the check of the
        operands; "k" computes a partial product on each rank with
        ``tsm_core.matmul`` and sums them with one allreduce of the (M, N)
        result (a ring allreduce sends about 2 (P - 1) / P x M N x itemsize
        bytes per rank for P ranks).
    group : torch.distributed.ProcessGroup, optional
        The ranks taking part; default the whole world. NCCL groups take CuPy
        arrays and torch CUDA tensors on each process's current device
        (``torch.cuda.set_device(local_rank)``); groups with gloo take any kind.
    out : array of the caller's kind, optional
        Shape (M_local, N) or (M, N), the result dtype; written and returned.
    alpha : float, default 1.0
        Scale factor.
    validate : bool or None, default None
        Exchange and check the operands first (one ``all_gather`` of a few
        integers per rank, a host round trip). None: for "k" (whose allreduce
        needs agreeing shapes), not for "rows", which then communicates
        nothing (each rank's operands are checked as ``tsm_core.matmul`` checks
        them). False for "k" needs B as this rank's (K_local, N) slice;
        mismatched operands are then not detected and may hang the collective.

    Returns
    -------
    array of the caller's kind
        ``out`` where given, else a new array: this rank's rows of C ("rows") or
        the whole C on every rank ("k"). Same kinds in and out as
        ``tsm_core.matmul``; float32 with float32 operands.

    Raises
    ------
    ValueError
        An unknown ``shard``; and, raised on every rank alike, operands that
        ``tsm_core.matmul`` refuses on some rank (its message is quoted), or that
        do not fit together across ranks: different K or N ("rows"), different M
        or N, or a B of neither K_local nor K rows ("k"), different dtypes, host
        arrays on some ranks and GPU arrays on others, host arrays on an NCCL
        group.
    RuntimeError
        No initialised ``torch.distributed`` process group.

    Notes
    -----
    Floating-point sums depend on their order: with ``shard="k"`` the result
    differs from a single ``A @ B`` by the round-off of adding the ranks'
    partial products in the order the collective chooses (within a few units of
    the dtype's round-off times the number of ranks); every rank gets the same
    bits. Run under ``torchrun`` (one process per GPU)::

        torch.distributed.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        cupy.cuda.Device(int(os.environ["LOCAL_RANK"])).use()
        C_local = distributed_matmul(A_local, B)             # rows of C
        C = distributed_matmul(A_cols, B, shard="k")         # all of C, every rank

    Examples
    --------
    One process is a group of one (the same call runs unchanged on every rank of
    a larger group):

    >>> import os, tempfile
    >>> import numpy as np, torch.distributed as dist
    >>> from tsm_core.distributed.products import distributed_matmul
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    >>> rng = np.random.default_rng(0)
    >>> A, B = rng.standard_normal((1000, 300)), rng.standard_normal((300, 4))
    >>> C = distributed_matmul(A, B)                      # this rank's rows
    >>> bool(np.allclose(C, A @ B))
    True
    >>> C = distributed_matmul(A, B, shard="k")  # all K columns on this one rank
    >>> bool(np.allclose(C, A @ B))
    True
    >>> distributed_matmul(A, B[:7], validate=True)
    Traceback (most recent call last):
    ...
    ValueError: distributed_matmul(shard='rows'): operands refused on rank 0: rank 0: ValueError: inner dimensions differ: ...
    >>> dist.destroy_process_group()
    """
    if shard not in SHARDS:
        raise ValueError(f"shard must be one of {SHARDS}, not {shard!r}")
    _dist()
    if validate is None:
        validate = shard == "k"
    if validate:
        table = _validate(A_local, B, out, alpha, shard, group)
    if shard == "rows":
        return matmul(A_local, B, out=out, alpha=alpha)
    kind = _arrays.kind_of(A_local, "A_local")
    k_local = int(A_local.shape[1])
    B_use = B
    if validate and int(B.shape[0]) != k_local:  # the whole B: this rank's rows of it
        dist = _dist()
        me = dist.get_rank(group)
        offset = sum(row[_FIELDS.index("k")] for row in table[:me])
        B_use = B[offset: offset + k_local]
    C = matmul(A_local, B_use, out=out, alpha=alpha)
    if C.shape[0] * C.shape[1] > 0:  # M and N agree on every rank: all skip or none
        _allreduce_sum(C, kind, group)
    return C

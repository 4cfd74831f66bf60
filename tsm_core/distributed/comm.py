"""Process-group helpers of the distributed fits and products, on torch.distributed.

tsm writes no communication layer of its own: the ranks, the transport and the
collectives are torch.distributed's (NCCL between GPUs, gloo on CPUs). This module
adds what every distributed routine of tsm needs around them:

- ``Comm``: the group, this rank, the world size, the timeout, and collectives on
  arrays of any kind (numpy, CuPy, torch) moved to torch tensors without copies
  where the backend reduces on the array's device (numpy through
  ``torch.from_numpy``, CuPy through DLPack); a collective that fails or outlasts
  the timeout raises ``DistributedError`` on every rank that is still alive;
- ``Comm.agree``: ONE small allreduce before any work, by which every rank learns
  every rank's shard (rows, features, dtype, finiteness, device, a parameter
  fingerprint, a local validation error) and raises the same ``ValueError`` when
  they disagree, instead of one rank failing and the others waiting for it;
- ``resolve_timeout``: the timeout in seconds (``TSM_DIST_TIMEOUT`` by default).

torch is imported when a ``Comm`` is made, never when this module is imported.
"""

from __future__ import annotations

import datetime
import zlib
from dataclasses import dataclass

import numpy as np

from tsm_core.runtime import config
from tsm_core.runtime.arrays import kind_of

# Bytes of a local error message carried by the agreement allreduce.
MESSAGE_BYTES = 160
_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
_DEVICES = ("cpu", "gpu")


class DistributedError(RuntimeError):
    """A collective failed or did not complete within the timeout: another rank died,
    stopped answering, or the process group broke. The group cannot be used after
    it (destroy it and start again)."""


def resolve_timeout(timeout=None) -> float:
    """Seconds a collective may wait: `timeout`, or ``TSM_DIST_TIMEOUT`` where None.

    Parameters
    ----------
    timeout : float, optional
        Seconds (> 0).

    Returns
    -------
    float
        The timeout in seconds.

    Raises
    ------
    ValueError
        A timeout that is not a positive number.

    Examples
    --------
    >>> from tsm_core.distributed.comm import resolve_timeout
    >>> resolve_timeout(5)
    5.0
    >>> resolve_timeout() == float(config.integer("TSM_DIST_TIMEOUT"))
    True
    """
    t = config.integer("TSM_DIST_TIMEOUT") if timeout is None else timeout
    if isinstance(t, bool) or not isinstance(t, (int, float, np.number)) or not np.isfinite(t) or t <= 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {t!r}")
    return float(t)


def to_tensor(a):
    """A torch tensor viewing `a` (numpy through ``torch.from_numpy``, CuPy through
    DLPack, torch as it is): no copy; numpy `a` must be C-contiguous or is copied.

    Parameters
    ----------
    a : numpy.ndarray, cupy.ndarray or torch.Tensor

    Returns
    -------
    torch.Tensor
        Sharing `a`'s memory (writes to it are writes to `a`).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.distributed.comm import to_tensor
    >>> a = np.zeros(3)
    >>> to_tensor(a).add_(1.0) is not None, a.tolist()
    (True, [1.0, 1.0, 1.0])
    """
    import torch

    kind = kind_of(a, "buffer")
    if kind == "numpy":
        return torch.from_numpy(np.ascontiguousarray(a))
    if kind == "cupy":
        return torch.from_dlpack(a)
    return a


def from_tensor(t, kind):
    """`t` as an array of `kind` ("numpy", "cupy", "torch", "torch-cpu"), viewed where
    the device matches (``Tensor.numpy()``, DLPack), copied across devices.

    Examples
    --------
    >>> import torch
    >>> from tsm_core.distributed.comm import from_tensor
    >>> from_tensor(torch.arange(3.0), "numpy").tolist()
    [0.0, 1.0, 2.0]
    """
    if kind == "numpy":
        return t.detach().cpu().numpy()
    if kind == "cupy":
        import cupy

        return cupy.from_dlpack(t.detach() if t.is_cuda else t.detach().cuda())
    if kind == "torch":
        return t if t.is_cuda else t.cuda()
    return t.cpu()


def group_info(group=None):
    """(rank, world size) of `group` (default: the default group).

    Raises
    ------
    RuntimeError
        torch.distributed is not initialised.
    """
    dist = _dist()
    return dist.get_rank(group), dist.get_world_size(group)


def _dist():
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this torch has no torch.distributed; install a torch with distributed support")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                           "first (torchrun sets its environment), or fit with distributed=False")
    return dist


def _backend_devices(backend: str) -> tuple:
    """The devices whose tensors the backend reduces, preferred first: NCCL reduces
    CUDA tensors only; gloo and MPI host tensors; a mixed backend
    ("cpu:gloo,cuda:nccl") both."""
    b = str(backend).lower()
    if ":" in b:
        return tuple(dict.fromkeys(part.split(":")[0] for part in b.split(",")))
    if b == "nccl":
        return ("cuda",)
    if b == "ucc":
        return ("cuda", "cpu")
    return ("cpu",)


def dtype_name(dt) -> str:
    """numpy / CuPy / torch dtype -> its name ("float32", "bfloat16", ...)."""
    s = str(dt)
    return s[len("torch."):] if s.startswith("torch.") else np.dtype(dt).name


@dataclass(frozen=True)
class Agreement:
    """What `Comm.agree` learnt of every rank's shard.

    Attributes
    ----------
    counts : numpy.ndarray of int64, shape (world,)
        Rows of each rank's shard.
    offsets : numpy.ndarray of int64, shape (world,)
        Global index of each rank's first row (the ranks' shards in rank order).
    n : int
        Rows of all shards together.
    d : int
        Features (the same on every rank).
    dtype : str
        The dtype's name (the same on every rank).
    """

    counts: np.ndarray
    offsets: np.ndarray
    n: int
    d: int
    dtype: str


class Comm:
    """The collectives of one distributed routine over a torch.distributed group.

    Parameters
    ----------
    group : torch.distributed.ProcessGroup, optional
        The group (default: the default group).
    timeout : float, optional
        Seconds each collective may wait (default ``TSM_DIST_TIMEOUT``). A rank that
        died makes the others fail at once (its connections close) or, where it stops
        answering, when this runs out. For NCCL see the distributed guide: a hung
        NCCL collective is ended by torch's watchdog (the ``timeout`` of
        ``init_process_group``), not by this one.

    Attributes
    ----------
    rank, world : int
        This rank and the group's size.
    devices : tuple of str
        Devices ("cpu", "cuda") whose tensors the backend reduces, preferred first.

    Raises
    ------
    RuntimeError
        torch.distributed is not initialised.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, torch.distributed as dist
    >>> from tsm_core.distributed.comm import Comm
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    >>> comm = Comm(timeout=10)
    >>> comm.allreduce(np.array([1.0, 2.0])).tolist(), comm.rank, comm.world
    ([1.0, 2.0], 0, 1)
    >>> dist.destroy_process_group()
    """

    def __init__(self, group=None, timeout=None):
        dist = _dist()
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout = resolve_timeout(timeout)
        self.devices = _backend_devices(dist.get_backend(group))

    # ------------------------------------------------------------ arrays <-> tensors

    def _tensor(self, a):
        """(torch tensor on a device the backend reduces, whether it is a copy)."""
        import torch

        if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
            raise ValueError("collective buffers must be C-contiguous")
        t = to_tensor(a)
        dev = "cuda" if t.is_cuda else "cpu"
        if dev in self.devices:
            return t, False
        if self.devices[0] == "cuda":
            return t.to(torch.device("cuda", torch.cuda.current_device())), True
        return t.cpu(), True

    def _stream(self, a):
        """A context that runs the collective on CuPy's current stream (NCCL waits
        for the work queued there, and that stream waits for NCCL)."""
        import contextlib

        if kind_of(a, "buffer") != "cupy":
            return contextlib.nullcontext()
        import cupy
        import torch

        ptr = cupy.cuda.get_current_stream().ptr
        if ptr == torch.cuda.current_stream().cuda_stream:
            return contextlib.nullcontext()
        return torch.cuda.stream(torch.cuda.ExternalStream(ptr))

    def _wait(self, work, what):
        try:
            done = work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        except Exception as e:  # torch's DistBackendError / RuntimeError
            raise DistributedError(
                f"rank {self.rank} of {self.world}: the {what} collective failed or did not complete within "
                f"{self.timeout:g} s: another rank may have died or stopped answering "
                f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})") from e
        if done is False:
            raise DistributedError(f"rank {self.rank} of {self.world}: the {what} collective did not complete "
                                   f"within {self.timeout:g} s: another rank may have died or stopped answering")

    def _run(self, a, collective, what, wait=True, **kw):
        """Run one `collective(tensor, **kw)` on array `a` in place; returns `a`.
        `wait` False: a collective on a CUDA buffer is only queued (see `allreduce`)."""
        t, copied = self._tensor(a)
        with self._stream(a):
            work = collective(t, group=self.group, async_op=True, **kw)
            if wait or copied or not t.is_cuda:
                self._wait(work, what)
            else:
                work.wait()  # no timeout: the current stream waits for it, the host does not
        if copied:
            kind = kind_of(a, "buffer")
            if kind == "numpy":
                a[...] = t.cpu().numpy()
            elif kind == "cupy":
                import cupy

                a[...] = cupy.from_dlpack(t.to("cuda").contiguous())
            else:
                a.copy_(t)
        return a

    # ------------------------------------------------------------ collectives

    def allreduce(self, a, op="sum", what="allreduce", wait=True):
        """Reduce `a` (numpy, CuPy or torch; C-contiguous) over the group, in place.

        Parameters
        ----------
        a : array
            The buffer; every rank passes one of the same shape and dtype.
        op : {"sum", "max", "min"}, default="sum"
        what : str
            Names the collective in an error message.
        wait : bool, default=True
            False, for a GPU buffer the backend reduces in place (NCCL): the
            collective is queued on the current stream and the host goes on; work
            queued after it sees the result. The caller then bounds its own wait
            for that work by `timeout` (a host wait on an event, say). Ignored
            (the host waits) for host buffers and copied ones.

        Returns
        -------
        array
            `a`, holding the result (the same bits on every rank).

        Raises
        ------
        DistributedError
            The collective failed or outlasted the timeout.
        """
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if self.world == 1:
            return a
        return self._run(a, dist.all_reduce, what, wait=wait, op=ops[op])

    def broadcast(self, a, src=0, what="broadcast"):
        """`a` of group rank `src` into `a` of every rank (in place); returns `a`.

        Raises
        ------
        DistributedError
            The collective failed or outlasted the timeout.
        """
        import torch.distributed as dist

        if self.world == 1:
            return a
        src = dist.get_global_rank(self.group, src) if self.group is not None else src
        return self._run(a, dist.broadcast, what, src=src)

    def slots(self, row, what="gather"):
        """Every rank's `row` (numpy, 1-D) as the rows of a (world, m) numpy array: an
        allreduce of a zero matrix in which each rank wrote its own row (exact: each
        entry is one rank's value plus zeros)."""
        row = np.asarray(row)
        out = np.zeros((self.world, row.size), dtype=row.dtype)
        out[self.rank] = row
        return self.allreduce(out, what=what)

    # ------------------------------------------------------------ agreement

    def agree(self, *, n, d, dtype, finite=True, device="cpu", error=None, fingerprint=b"",
              what="distributed fit"):
        """Check the ranks' shards against each other with ONE small allreduce.

        Every rank passes what it holds; every rank receives every rank's values and
        raises the same ValueError where they disagree, so no rank waits for another
        that already failed.

        Parameters
        ----------
        n : int
            Rows of this rank's shard (may be 0).
        d : int
            Its features.
        dtype : dtype or str
            Its dtype.
        finite : bool, default=True
            Whether the shard (and its weights) hold only finite numbers.
        device : {"cpu", "gpu"}, default="cpu"
            Where this rank computes.
        error : str, optional
            This rank's own validation error (its message), to be raised everywhere.
        fingerprint : bytes, default=b""
            The parameters that must be equal on every rank (compared by CRC-32).
        what : str
            The routine, for the messages.

        Returns
        -------
        Agreement
            Every rank's row count and offset, the total, d and the dtype.

        Raises
        ------
        ValueError
            On every rank alike: a rank's validation error, different d, dtypes,
            devices or parameters across ranks, NaN or infinity in a shard.
        DistributedError
            The allreduce failed or outlasted the timeout.

        Examples
        --------
        >>> import os, tempfile
        >>> import numpy as np, torch.distributed as dist
        >>> from tsm_core.distributed.comm import Comm
        >>> store = os.path.join(tempfile.mkdtemp(), "store")
        >>> dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        >>> Comm().agree(n=5, d=3, dtype=np.float32).offsets.tolist()
        [0]
        >>> Comm().agree(n=5, d=3, dtype=np.float32, finite=False)
        Traceback (most recent call last):
        ...
        ValueError: distributed fit: Input X contains NaN or infinity (on rank 0).
        >>> dist.destroy_process_group()
        """
        name = dtype_name(dtype) if error is None else ""
        msg = (error or "").encode("utf-8", "replace")[:MESSAGE_BYTES]
        head = np.array([error is not None, int(n), int(d),
                         _DTYPES.index(name) if name in _DTYPES else len(_DTYPES), bool(finite),
                         _DEVICES.index(device), zlib.crc32(fingerprint), len(msg)], dtype=np.int64)
        body = np.zeros(MESSAGE_BYTES, dtype=np.int64)
        body[:len(msg)] = np.frombuffer(msg, dtype=np.uint8)
        table = self.slots(np.concatenate([head, body]), what=f"{what}: agreement")
        failed, ns, ds, dts, fin, devs, fps, lens = (table[:, j] for j in range(8))

        def ranks(mask):
            return ", ".join(str(r) for r in np.flatnonzero(mask))

        if failed.any():
            r = int(np.flatnonzero(failed)[0])
            text = bytes(table[r, 8:8 + lens[r]].astype(np.uint8)).decode("utf-8", "replace")
            raise ValueError(f"{what}: rank {r}: {text}")
        if (ds != ds[0]).any():
            per = ", ".join(f"rank {r}: {int(v)}" for r, v in enumerate(ds))
            raise ValueError(f"{what}: the ranks' shards have different numbers of features ({per}); "
                             "every rank must pass the same number of columns")
        if (dts != dts[0]).any():
            names = [(_DTYPES + ("other",))[int(v)] for v in dts]
            per = ", ".join(f"rank {r}: {v}" for r, v in enumerate(names))
            raise ValueError(f"{what}: the ranks' shards have different dtypes ({per}); cast every shard "
                             "to the same dtype")
        if (devs != devs[0]).any():
            per = ", ".join(f"rank {r}: {_DEVICES[int(v)]}" for r, v in enumerate(devs))
            raise ValueError(f"{what}: the ranks compute on different devices ({per})")
        if (fps != fps[0]).any():
            raise ValueError(f"{what}: the ranks were given different parameters (those of rank "
                             f"{ranks(fps != fps[0])} differ from rank 0's)")
        if not fin.all():
            raise ValueError(f"{what}: Input X contains NaN or infinity (on rank {ranks(fin == 0)}).")
        offsets = np.concatenate([[0], np.cumsum(ns)[:-1]]).astype(np.int64)
        return Agreement(counts=ns.astype(np.int64), offsets=offsets, n=int(ns.sum()), d=int(ds[0]),
                         dtype=(_DTYPES + ("other",))[int(dts[0])])

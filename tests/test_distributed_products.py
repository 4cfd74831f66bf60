"""distributed_matmul across processes: gloo on the CPU (spawned here, 127.0.0.1 and a
free port), NCCL on GPUs where at least two are found.

Each group of processes runs every case in one go (starting a process that imports
torch costs seconds; the gloo ranks are forked from the test process): the ranks return their results and the error each call raised,
and the tests compare them with numpy in float64. Every wait has a deadline, and
processes still alive after it are terminated, so a hang fails a test instead of
stalling the suite.

Tolerances: a float64 product of inner size K differs from numpy's by a few K u
(u = 2**-53) relative to |A| |B|; float32 against the float64 reference by about
sqrt(K) u32 relative in norm for random signed data (u32 = 2**-24), so 1e-5 for
K <= 200 leaves a wide margin; the sum over ranks with shard="k" adds at most
(ranks - 1) roundings of C.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import queue
import socket
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

DEADLINE_S = 90  # a whole group of processes, start to finish (NCCL: spawned, CUDA start: 3x)
TOL = {"float32": 1e-5, "float64": 1e-12}

# The problems (shared by every rank: same seeds, same data).
M, K, N = 37, 129, 5  # awkward sizes on purpose
ROW_SPLIT = {2: [37, 0], 3: [20, 0, 17], 4: [9, 0, 27, 1]}
K_SPLIT = {2: [0, 129], 3: [50, 0, 79], 4: [1, 64, 0, 64]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _operands(dtype, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(dtype)
    B = rng.standard_normal((K, N)).astype(dtype)
    return A, B


def _bounds(split, rank):
    lo = sum(split[:rank])
    return lo, lo + split[rank]


def _call(results, name, fn):
    """Run one case on this rank; keep its result or the error it raised."""
    try:
        results[name] = ("ok", fn())
    except Exception as e:  # recorded, compared in the parent
        results[name] = ("error", type(e).__name__, str(e))


def _cases(rank, world, gpu):
    """Every case, run by every rank in the same order (the collectives match)."""
    from tsm_core.distributed.products import distributed_matmul

    if gpu:
        import cupy

        to, back = cupy.asarray, cupy.asnumpy
    else:
        to, back = (lambda x: x), (lambda x: x)
    res: dict = {}
    rows, cols = ROW_SPLIT[world], K_SPLIT[world]
    r0, r1 = _bounds(rows, rank)
    c0, c1 = _bounds(cols, rank)
    for dtype in ("float32", "float64"):
        A, B = _operands(dtype)
        _call(res, f"rows/{dtype}", lambda: back(distributed_matmul(to(A[r0:r1]), to(B))))
        _call(res, f"k-slice/{dtype}", lambda: back(distributed_matmul(
            to(A[:, c0:c1]), to(B[c0:c1]), shard="k")))
        _call(res, f"k-full/{dtype}", lambda: back(distributed_matmul(
            to(A[:, c0:c1]), to(B), shard="k")))
    A, B = _operands("float64", seed=1)
    xp = np if not gpu else __import__("cupy")
    out = xp.full((M, N), np.nan)
    _call(res, "k-out-alpha", lambda: (
        back(distributed_matmul(to(A[:, c0:c1]), to(B[c0:c1]), shard="k", out=out, alpha=-2.0)),
        bool(distributed_matmul(to(A[:, c0:c1]), to(B[c0:c1]), shard="k", out=out, alpha=-2.0)
             is out)))
    out_f = xp.asfortranarray(xp.full((M, N), np.nan))  # a strided out: reduced through a copy
    _call(res, "k-out-F", lambda: back(distributed_matmul(
        to(A[:, c0:c1]), to(B[c0:c1]), shard="k", out=out_f)))
    At, Bt = torch.from_numpy(A[r0:r1].copy()), torch.from_numpy(B)
    if gpu:
        At, Bt = At.cuda(), Bt.cuda()
    _call(res, "rows/torch", lambda: (
        distributed_matmul(At, Bt).cpu().numpy(), type(distributed_matmul(At, Bt)).__name__))
    # Operands that do not fit: every rank must raise, and the group stays usable.
    Bn = np.concatenate([B, B[:, :1]], axis=1) if rank == world - 1 else B
    _call(res, "bad-n", lambda: distributed_matmul(to(A[r0:r1]), to(np.ascontiguousarray(Bn)), validate=True))
    Ab = A[r0:r1, :K - 1] if rank == 0 else A[r0:r1]
    _call(res, "bad-local", lambda: distributed_matmul(to(np.ascontiguousarray(Ab)), to(B), validate=True))
    Ad = A[r0:r1].astype(np.float32) if rank == 1 else A[r0:r1]
    Bd = B.astype(np.float32) if rank == 1 else B
    _call(res, "bad-dtype", lambda: distributed_matmul(to(Ad), to(Bd), validate=True))
    Bk = B[c0:c1 + 1] if rank == 0 else B[c0:c1]
    _call(res, "bad-k-rows", lambda: distributed_matmul(to(A[:, c0:c1]), to(Bk), shard="k"))
    _call(res, "after-errors", lambda: back(distributed_matmul(to(A[r0:r1]), to(B))))
    return res


def _entry(rank, world, port, backend, out_q):
    """One rank: join the group, run the cases, report, leave."""
    import torch.distributed as dist

    try:
        if backend == "nccl":
            import cupy

            torch.cuda.set_device(rank)
            cupy.cuda.Device(rank).use()
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=30))
        try:
            out_q.put((world, rank, "ok", _cases(rank, world, backend == "nccl")))
        finally:
            dist.destroy_process_group()
    except BaseException:
        out_q.put((world, rank, "crash", traceback.format_exc()))


def run_groups(worlds, backend: str = "gloo") -> dict:
    """Start a group of `world` ranks for each of `worlds`, all at once; wait for their
    reports (DEADLINE_S at most), terminate what is left. {world: {rank: cases}};
    fails the test on a crash or a missing report."""
    # fork for gloo: the ranks inherit the imports (torch alone takes seconds to import
    # on a busy machine); CUDA cannot be forked, so spawn for NCCL.
    method = "fork" if backend == "gloo" and "fork" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    q = ctx.Queue()
    procs = []
    for world in worlds:
        port = _free_port()
        procs += [ctx.Process(target=_entry, args=(r, world, port, backend, q), daemon=True)
                  for r in range(world)]
    for p in procs:
        p.start()
    reports: dict = {}
    deadline = time.monotonic() + DEADLINE_S * (1 if backend == "gloo" else 3)
    try:
        while len(reports) < len(procs) and time.monotonic() < deadline:
            try:
                world, rank, status, payload = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            reports[world, rank] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    crashed = {k: s[1] for k, s in reports.items() if s[0] != "ok"}
    assert not crashed, f"ranks crashed: {crashed}"
    missing = sorted({(w, r) for w in worlds for r in range(w)} - set(reports))
    assert not missing, f"no report from (world, rank) {missing} within {DEADLINE_S} s"
    return {w: {r: reports[w, r][1] for r in range(w)} for w in worlds}


def _rel(C, ref) -> float:
    C = np.asarray(C, dtype=np.float64)
    return float(np.linalg.norm(C - ref) / np.linalg.norm(ref))


def _ok(report, rank, name):
    entry = report[rank][name]
    assert entry[0] == "ok", f"rank {rank}, {name}: {entry}"
    return entry[1]


def _check_group(report, world):
    """The assertions shared by the gloo and NCCL groups."""
    for dtype in ("float32", "float64"):
        A, B = _operands(dtype)
        ref = A.astype(np.float64) @ B.astype(np.float64)
        rows = [_ok(report, r, f"rows/{dtype}") for r in range(world)]
        for r, C in enumerate(rows):
            assert C.shape == (ROW_SPLIT[world][r], N) and C.dtype == np.dtype(dtype)
        assert _rel(np.vstack(rows), ref) <= TOL[dtype]
        for mode in ("k-slice", "k-full"):
            Cs = [_ok(report, r, f"{mode}/{dtype}") for r in range(world)]
            assert Cs[0].shape == (M, N) and Cs[0].dtype == np.dtype(dtype)
            assert _rel(Cs[0], ref) <= TOL[dtype], mode
            for C in Cs[1:]:  # the same bits on every rank
                assert np.array_equal(C, Cs[0]), mode
    A, B = _operands("float64", seed=1)
    for r in range(world):
        C, same = _ok(report, r, "k-out-alpha")
        assert same and _rel(C, -2.0 * (A @ B)) <= TOL["float64"]
    for r in range(world):
        assert _rel(_ok(report, r, "k-out-F"), A @ B) <= TOL["float64"]
    Ct = np.vstack([_ok(report, r, "rows/torch")[0] for r in range(world)])
    assert _rel(Ct, A @ B) <= TOL["float64"]
    assert {_ok(report, r, "rows/torch")[1] for r in range(world)} == {"Tensor"}
    for name, words in (("bad-n", "N (the columns of B) differs"),
                        ("bad-local", "refused on rank 0"),
                        ("bad-dtype", "result dtype differs"),
                        ("bad-k-rows", "rank 0: B has")):
        errors = [report[r][name] for r in range(world)]
        assert all(e[0] == "error" and e[1] == "ValueError" for e in errors), (name, errors)
        assert len({e[2] for e in errors}) == 1, f"{name}: messages differ across ranks"
        assert words in errors[0][2], (name, errors[0][2])
    after = np.vstack([_ok(report, r, "after-errors") for r in range(world)])
    assert _rel(after, A @ B) <= TOL["float64"]


@pytest.fixture(scope="module")
def gloo():
    return run_groups((2, 4))


@pytest.mark.parametrize("world", (2, 4))
def test_rows_and_k_match_numpy(gloo, world):
    _check_group(gloo[world], world)


def test_mismatch_message_names_the_ranks(gloo):
    msg = gloo[4][0]["bad-n"][2]
    assert "5 on ranks 0, 1, 2" in msg and "6 on rank 3" in msg, msg
    assert "inner dimensions differ" in gloo[4][1]["bad-local"][2]


def test_no_group_and_bad_shard():
    from tsm_core.distributed.products import distributed_matmul

    A, B = _operands("float64")
    with pytest.raises(ValueError, match="shard must be"):
        distributed_matmul(A, B, shard="cols")
    if not torch.distributed.is_initialized():
        with pytest.raises(RuntimeError, match="process group"):
            distributed_matmul(A, B)


def _gpus() -> int:
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs at least 2 GPUs")
def test_nccl_matches_numpy():
    worlds = (2, 4) if _gpus() >= 4 else (2,)
    for world in worlds:  # one group at a time: each takes GPUs 0 .. world - 1
        _check_group(run_groups((world,), "nccl")[world], world)

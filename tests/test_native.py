"""The C++ fast path of batched calls on torch tensors (tsm_core/batched/fastpath.cpp).

Runs without a GPU: the extension is built against the installed torch (a CPU
build in CI), its launches go to a recording launcher (`dry_launcher`) instead of
cuLaunchKernel, and CPU tensors stand in for CUDA ones (the records compare the
same fields; a CPU tensor's device is -1). What a hit launches on the GPU is in
tests/test_batched.py (`test_gpu_torch_fast_path_*`).
"""

from __future__ import annotations

import gc
import os
import shutil
import weakref

import pytest

torch = pytest.importorskip("torch")

from tsm_core.batched import native as _native  # noqa: E402

HAS_CXX = shutil.which(os.environ.get("CXX", "c++")) is not None


@pytest.fixture(scope="module")
def nat():
    if not HAS_CXX:
        pytest.skip("no C++ compiler: the fast path is not built here")
    path = _native.target()
    if not path.exists():
        _native.build(path, quiet=True)
    m = _native.load(path)
    m.clear()
    before = m.set_launcher(m.dry_launcher())
    m.dry_status(0)
    yield m
    m.clear()
    m.set_launcher(before)


@pytest.fixture
def fresh(nat):
    nat.clear()
    nat.dry_status(0)
    yield nat
    nat.clear()


class Owner:
    """Stands in for the Python launch object an entry keeps alive."""


def batch(P=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(1 + 3 * i % 7, 2 + i % 3, 1 + 2 * i % 5) for i in range(P)]
    As = [torch.randn(m, k, generator=g) for m, _, k in shapes]
    Bs = [torch.randn(k, n, generator=g) for _, n, k in shapes]
    Cs = [torch.randn(m, n, generator=g) for m, n, _ in shapes]
    return As, Bs, Cs


def remember(nat, As, Bs, Cs, *, dev=0, owner=None, func=0xF00, grid=17, smem=4096, meta=0xA0,
             tiles=0xB0, dbl=False):
    return nat.remember(As, Bs, Cs, dev, owner if owner is not None else Owner(), func, grid, 256,
                        smem, meta, tiles, dbl)


def test_builds_and_loads(nat):
    assert nat.REC_BYTES == 48
    assert nat.MAX_ENTRIES == 64
    assert _native.target().exists()


def test_hit_launches_with_the_remembered_arguments(fresh):
    As, Bs, Cs = batch()
    assert fresh.lookup_launch(As, Bs, Cs, 0, 99, 1.0, 0.0) == 1  # not remembered
    assert remember(fresh, As, Bs, Cs) is True
    n0 = fresh.dry_last()["count"]
    assert fresh.lookup_launch(As, Bs, Cs, 0, 0x5EED, -2.5, 0.75) == 0
    d = fresh.dry_last()
    assert d["count"] == n0 + 1
    assert (d["func"], d["grid"], d["block"], d["smem"], d["stream"], d["meta"], d["tiles"]) == \
        (0xF00, 17, 256, 4096, 0x5EED, 0xA0, 0xB0)
    assert (d["alpha_f32"], d["beta_f32"]) == (-2.5, 0.75)  # float kernel: 4-byte scalars


def test_double_batches_pass_double_scalars(fresh):
    As, Bs, Cs = batch()
    As, Bs, Cs = ([x.double() for x in xs] for xs in (As, Bs, Cs))
    remember(fresh, As, Bs, Cs, dbl=True)
    assert fresh.lookup_launch(As, Bs, Cs, 0, 1, 0.1, -3.0) == 0
    d = fresh.dry_last()
    assert (d["alpha_f64"], d["beta_f64"]) == (0.1, -3.0)


def test_matched_by_layout_not_identity(fresh):
    """New tensor objects over the same memory with the same layout run the same
    launch; tuples are lists too."""
    As, Bs, Cs = batch()
    remember(fresh, As, Bs, Cs)
    views = [[x.view(x.shape) for x in xs] for xs in (As, Bs, Cs)]
    assert all(v is not x for v, x in zip(views[0], As))
    assert fresh.lookup_launch(*views, 0, 1, 1.0, 0.0) == 0
    assert fresh.lookup_launch(tuple(As), tuple(Bs), tuple(Cs), 0, 1, 1.0, 0.0) == 0


@pytest.mark.parametrize("change", ["transpose_", "data_new", "data_same_ptr_strides",
                                    "data_same_ptr_dtype", "slice", "swap", "other_device"])
def test_any_change_a_launch_depends_on_misses(fresh, change):
    As, Bs, Cs = batch()
    As[2] = torch.randn(4, 4)  # square, so that a transpose keeps the sizes
    Bs[2] = torch.randn(4, Bs[2].shape[1])
    remember(fresh, As, Bs, Cs)
    dev = 0
    if change == "transpose_":
        As[2].t_()  # same object, same pointer, strides swapped
    elif change == "data_new":
        As[2].data = torch.randn(4, 4)  # same object, new storage
    elif change == "data_same_ptr_strides":
        As[2].data = As[2].t()  # same pointer and sizes, strides swapped, no version bump
    elif change == "data_same_ptr_dtype":
        As[2].data = As[2].view(torch.int32)  # same pointer, sizes and strides
    elif change == "slice":
        Cs[1] = Cs[1][1:]
    elif change == "swap":
        As[0], As[1] = As[1], As[0]
    elif change == "other_device":
        dev = 1
    assert fresh.lookup_launch(As, Bs, Cs, dev, 1, 1.0, 0.0) == 1


def test_contents_do_not_matter(fresh):
    As, Bs, Cs = batch()
    remember(fresh, As, Bs, Cs)
    As[0].mul_(-1)
    Cs[3].fill_(float("nan"))
    assert fresh.lookup_launch(As, Bs, Cs, 0, 1, 1.0, 0.0) == 0


@pytest.mark.parametrize("case", ["grad", "3d", "not_tensor", "lengths", "empty", "dict",
                                  "sparse", "sparse_csr", "nested"])
def test_not_for_this_path(fresh, case):
    """2: the Python path checks these (and raises where they are wrong); nothing is
    launched and nothing remembered."""
    As, Bs, Cs = batch(3)
    if case == "grad":
        As[1] = As[1].clone().requires_grad_()
    elif case == "3d":
        Cs[0] = Cs[0][None]
    elif case == "not_tensor":
        Bs[2] = Bs[2].numpy()
    elif case == "lengths":
        Cs = Cs[:2]
    elif case == "empty":
        As, Bs, Cs = [], [], []
    elif case == "dict":
        As = dict(enumerate(As))
    elif case == "sparse":
        As[0] = As[0].to_sparse()
    elif case == "sparse_csr":
        Bs[1] = Bs[1].to_sparse_csr()
    elif case == "nested":  # 2-D, but no sizes to read
        Cs[2] = torch.nested.nested_tensor([torch.randn(3), torch.randn(5)])
        assert Cs[2].dim() == 2
    n0 = fresh.dry_last()["count"]
    assert fresh.lookup_launch(As, Bs, Cs, 0, 1, 1.0, 0.0) == 2
    assert remember(fresh, As, Bs, Cs) is False
    assert fresh.size() == 0
    assert fresh.dry_last()["count"] == n0


def test_inference_tensors(fresh):
    """No version counter is needed: inference tensors are matched as any other."""
    with torch.inference_mode():
        As, Bs, Cs = batch()
        remember(fresh, As, Bs, Cs)
        assert fresh.lookup_launch(As, Bs, Cs, 0, 1, 1.0, 0.0) == 0


def test_least_recently_used_goes(fresh):
    batches = [batch(2, seed=s) for s in range(fresh.MAX_ENTRIES + 1)]
    for b in batches:
        remember(fresh, *b)
    assert fresh.size() == fresh.MAX_ENTRIES
    assert fresh.lookup_launch(*batches[0], 0, 1, 1.0, 0.0) == 1  # the oldest went
    assert fresh.lookup_launch(*batches[1], 0, 1, 1.0, 0.0) == 0  # now the most recent
    remember(fresh, *batch(2, seed=10_000))
    assert fresh.lookup_launch(*batches[1], 0, 1, 1.0, 0.0) == 0  # kept: recently used
    assert fresh.lookup_launch(*batches[2], 0, 1, 1.0, 0.0) == 1


def test_same_batch_again_replaces_its_entry(fresh):
    As, Bs, Cs = batch()
    remember(fresh, As, Bs, Cs, grid=5)
    remember(fresh, As, Bs, Cs, grid=9)
    assert fresh.size() == 1
    fresh.lookup_launch(As, Bs, Cs, 0, 1, 1.0, 0.0)
    assert fresh.dry_last()["grid"] == 9


def test_entries_keep_their_owner_alive_until_dropped(fresh):
    """The owner (the launch object holding the device metadata) lives as long as its
    entry; the tensors are not held at all."""
    As, Bs, Cs = batch()
    owner = Owner()
    w_owner = weakref.ref(owner)
    w_tensor = weakref.ref(As[0])
    remember(fresh, As, Bs, Cs, owner=owner)
    del owner, As, Bs, Cs
    gc.collect()
    assert w_tensor() is None
    assert w_owner() is not None
    fresh.clear()
    gc.collect()
    assert w_owner() is None


def test_launch_errors_come_back_negated(fresh):
    As, Bs, Cs = batch()
    remember(fresh, As, Bs, Cs)
    fresh.dry_status(700)  # CUDA_ERROR_ILLEGAL_ADDRESS
    assert fresh.lookup_launch(As, Bs, Cs, 0, 1, 1.0, 0.0) == -700
    assert fresh.launch(1, 2, 256, 0, 3, 4, 5, 1.0, 0.0, False) == -700
    fresh.dry_status(0)
    assert fresh.launch(1, 2, 256, 0, 3, 4, 5, 1.0, 0.0, False) == 0


def test_empty_grid_launches_nothing(fresh):
    As, Bs, Cs = batch()
    remember(fresh, As, Bs, Cs, grid=0)
    n0 = fresh.dry_last()["count"]
    assert fresh.lookup_launch(As, Bs, Cs, 0, 1, 1.0, 0.0) == 0
    assert fresh.dry_last()["count"] == n0


def test_bad_arguments_raise(fresh):
    As, Bs, Cs = batch()
    with pytest.raises(TypeError):
        fresh.lookup_launch(As, Bs, Cs)
    with pytest.raises(TypeError):
        fresh.remember(As, Bs, Cs, 0)
    with pytest.raises(TypeError):
        fresh.lookup_launch(As, Bs, Cs, 0, 1, "one", 0.0)
    with pytest.raises(OverflowError):
        fresh.launch(-1, 2, 256, 0, 3, 4, 5, 1.0, 0.0, False)


@pytest.fixture
def on_gpu(fresh):
    """`call` as on a GPU: CPU tensors' records name device 0, and the current device
    and stream come from Python getters (c10's are not used: no libc10_cuda here)."""
    saved = fresh.stream_state()  # batched_matmul's, where a GPU set them: restored
    fresh.use_c10("")
    fresh.host_device(0)
    state = {"dev": 0, "stream": 0x5EED}
    fresh.set_stream_getters(lambda: state["dev"], lambda d: state["stream"] + d)
    yield fresh, state
    fresh.host_device(-1)
    fresh.set_stream_getters(*saved[:2])
    fresh.use_c10(saved[2])


def test_call_launches_on_the_current_device_and_stream(on_gpu):
    nat, state = on_gpu
    As, Bs, Cs = batch()
    remember(nat, As, Bs, Cs)
    n0 = nat.dry_last()["count"]
    assert nat.current() == (0, 0x5EED)
    assert nat.call(As, Bs, Cs, -2.5, 0.75) == 0
    last = nat.dry_last()
    assert last["count"] == n0 + 1 and last["stream"] == 0x5EED
    assert (last["alpha_f32"], last["beta_f32"]) == (-2.5, 0.75)
    assert nat.call(tuple(As), tuple(Bs), tuple(Cs), 3, -1) == 0  # ints are reals too
    assert nat.dry_last()["alpha_f32"] == 3.0
    state["stream"] = 0xABC0
    assert nat.call(As, Bs, Cs, 1.0, 0.0) == 0
    assert nat.dry_last()["stream"] == 0xABC0
    state["dev"] = 1  # another current device: the entry's kernel is not loaded there
    assert nat.call(As, Bs, Cs, 1.0, 0.0) == 1
    assert nat.dry_last()["count"] == n0 + 3


@pytest.mark.parametrize("case", ["bool", "numpy_scalar", "str", "list_subclass", "dict",
                                  "cpu_tensor", "no_getters"])
def test_call_leaves_other_calls_to_python(on_gpu, case):
    """2, nothing launched, for what batched_matmul's Python path must look at."""
    import numpy as np

    nat, _ = on_gpu
    As, Bs, Cs = batch()
    remember(nat, As, Bs, Cs)
    alpha, beta = 1.0, 0.0
    if case == "bool":
        alpha = True
    elif case == "numpy_scalar":
        beta = np.float32(0.5)
    elif case == "str":
        alpha = "1"
    elif case == "list_subclass":
        As = type("L", (list,), {})(As)
    elif case == "dict":
        Cs = dict(enumerate(Cs))
    elif case == "cpu_tensor":
        nat.host_device(-1)  # CPU tensors as they are: not on a GPU
    elif case == "no_getters":
        nat.set_stream_getters(None, None)
    n0 = nat.dry_last()["count"]
    assert nat.call(As, Bs, Cs, alpha, beta) == 2
    assert nat.dry_last()["count"] == n0


def test_call_getter_errors_propagate(on_gpu):
    nat, _ = on_gpu
    As, Bs, Cs = batch()
    remember(nat, As, Bs, Cs)

    def broken(d):
        raise RuntimeError("no stream here")

    nat.set_stream_getters(lambda: 0, broken)
    n0 = nat.dry_last()["count"]
    with pytest.raises(RuntimeError, match="no stream here"):
        nat.call(As, Bs, Cs, 1.0, 0.0)
    assert nat.dry_last()["count"] == n0
    with pytest.raises(TypeError):
        nat.call(As, Bs, Cs)
    with pytest.raises(TypeError):
        nat.set_stream_getters(1, 2)


def test_plain_and_subclass_tensors_read_alike(on_gpu):
    """torch.Tensor's records are read from its TensorImpl directly, a subclass's
    through torch's checked accessors: the two must agree (empty tensors too), or a
    batch remembered through one would be missed, or worse, through the other."""
    nat, _ = on_gpu

    class Sub(torch.Tensor):
        pass

    As, Bs, Cs = batch(6)
    As[5] = torch.randn(0, 4)  # empty: no data pointer in either reader
    Bs[5] = torch.randn(4, 3)
    Cs[5] = torch.randn(0, 3)
    Bs[2] = torch.randn(7, 9)[1:, 2:][:, ::2]  # offset and strides
    As[2] = torch.randn(As[2].shape[0], Bs[2].shape[0])
    Cs[2] = torch.randn(As[2].shape[0], Bs[2].shape[1])
    remember(nat, As, Bs, Cs)
    subs = [[x.as_subclass(Sub) for x in xs] for xs in (As, Bs, Cs)]
    assert type(subs[1][2]) is Sub
    assert nat.call(*subs, 1.0, 0.0) == 0
    nat.clear()
    remember(nat, *subs)
    assert nat.call(As, Bs, Cs, 1.0, 0.0) == 0


@pytest.mark.parametrize("where", [0, 1, 377, 599])
def test_long_batches_miss_on_any_tensor(on_gpu, where):
    """A batch of 200 problems (the reading loop asks for tensors ahead of use) that
    differs from the remembered one in a single tensor misses; the remembered one
    behind the most recent entry still hits."""
    nat, _ = on_gpu
    As, Bs, Cs = batch(200)
    remember(nat, As, Bs, Cs)
    other = batch(3, seed=1)
    remember(nat, *other)  # now the most recent: As... is found behind it
    assert nat.call(As, Bs, Cs, 1.0, 0.0) == 0
    flat = [As, Bs, Cs]
    lst, i = flat[where // 200], where % 200
    lst[i] = lst[i].clone()
    assert nat.call(As, Bs, Cs, 1.0, 0.0) == 1
    assert nat.call(*other, 1.0, 0.0) == 0


def test_graphs_never_take_the_recorders_launches(on_gpu):
    """With the recording launcher installed, every hit reaches it, graphs on or not
    (no driver here; where there is one, graphs launch only with the driver's own
    cuLaunchKernel installed)."""
    nat, _ = on_gpu
    As, Bs, Cs = batch()
    remember(nat, As, Bs, Cs)
    before = nat.use_graphs(None)
    nat.use_graphs(True)
    try:
        n0 = nat.dry_last()["count"]
        for _ in range(3):
            assert nat.call(As, Bs, Cs, 1.0, 0.0) == 0
        assert nat.dry_last()["count"] == n0 + 3
    finally:
        nat.use_graphs(before)


def test_use_c10_without_the_library(on_gpu):
    nat, _ = on_gpu
    assert nat.use_c10("/nonexistent/libc10_cuda.so") is False
    assert nat.stream_state()[2] == ""
    assert nat.current() == (0, 0x5EED)  # the Python getters still
    with pytest.raises(TypeError):
        nat.use_c10(3)


def test_switched_off(monkeypatch):
    monkeypatch.setenv("TSM_NATIVE", "0")
    _native._reset_for_tests()
    try:
        assert _native.get() is None
        st = _native.status()
        assert st["mode"] == "0" and "TSM_NATIVE=0" in st["error"] and not st["loaded"]
    finally:
        _native._reset_for_tests()


def test_a_failing_build_warns_and_falls_back(monkeypatch, tmp_path):
    """A compiler that fails: a warning saying why, None, and the Python path; with
    TSM_NATIVE=1 the failure is an error."""
    monkeypatch.setenv("TSM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    _native._reset_for_tests()
    try:
        with pytest.warns(RuntimeWarning, match="fast path .* unavailable"):
            assert _native.get() is None
        assert "failed" in _native.status()["error"]
        _native._reset_for_tests()
        monkeypatch.setenv("TSM_NATIVE", "1")
        with pytest.raises(RuntimeError, match="failed"):
            _native.get()
    finally:
        _native._reset_for_tests()
    assert not list(tmp_path.glob("native/*.so"))  # no half-built file left

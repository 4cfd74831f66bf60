"""The runtime layer on the CPU: the switch table, the atomic JSON store, the one
tuner, the one timer's pure parts, device facts without a GPU, logging, and the
rule that the TSM2 planner imports no launcher."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest

import tsm_core
from tsm_core.runtime import cache, config, device, log, timing, tune
from tsm_core.runtime.arrays import order_of

ROOT = Path(tsm_core.__file__).parent


# ------------------------------------------------------------------ config


def test_switches_read_through_the_table(monkeypatch):
    monkeypatch.delenv("TSM_AUTOTUNE", raising=False)
    assert config.flag("TSM_AUTOTUNE") is True
    for v, want in (("0", False), ("off", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("TSM_AUTOTUNE", v)
        assert config.flag("TSM_AUTOTUNE") is want
    monkeypatch.setenv("TSM_CONV_SPLITK", "3")
    assert config.integer("TSM_CONV_SPLITK") == 3
    monkeypatch.setenv("TSM_CONV_SPLITK", "x")
    with pytest.raises(ValueError):
        config.integer("TSM_CONV_SPLITK")
    with pytest.raises(KeyError):
        config.flag("TSM_NO_SUCH_SWITCH")
    assert "TSM_PROFILE" in config.describe()


def test_tsm2_switches_take_effect(monkeypatch):
    from tsm_core.tsm2 import autotune, profile

    monkeypatch.setenv("TSM_AUTOTUNE", "0")
    monkeypatch.setenv("TSM_PROFILE", "0")
    assert not autotune.enabled() and not profile.enabled()
    monkeypatch.setenv("TSM_AUTOTUNE", "1")
    monkeypatch.delenv("TSM_PROFILE")
    assert autotune.enabled() and profile.enabled()


def _tsm_environ_reads(path: Path) -> list[str]:
    """'os.environ' / 'os.getenv' reads of TSM_* names in one file."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("TSM_"):
            hits.append(node.value)
    return hits


def test_tsm2_and_runtime_read_switches_only_through_config():
    for path in [*(ROOT / "tsm2").glob("*.py"), *(ROOT / "runtime").glob("*.py")]:
        if path.name == "config.py":
            continue
        text = path.read_text()
        assert "os.environ.get(\"TSM_" not in text and "getenv(\"TSM_" not in text, path
        for name in _tsm_environ_reads(path):
            assert name in config.SWITCHES, (path, name)


# ------------------------------------------------------------------ cache


def test_cache_dir_follows_the_switch(monkeypatch, tmp_path):
    monkeypatch.setenv("TSM_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"


def test_json_store_merges_and_writes_atomically(tmp_path):
    s = cache.JsonStore(tmp_path / "sub" / "s.json")
    assert s.load() == {} and s.get("a") is None
    s.update({"a": 1})
    s.update({"b": [1, 2]})
    assert cache.JsonStore(s.path).load() == {"a": 1, "b": [1, 2]}
    # a torn or foreign file reads as empty, and the next write replaces it
    s.path.write_text("{not json")
    assert s.load() == {}
    s.update({"c": 3})
    assert s.load() == {"c": 3}
    assert not [p for p in s.path.parent.iterdir() if p.suffix == ".tmp"]
    s.clear()
    assert not s.path.exists()


# ------------------------------------------------------------------ tune


def test_tuner_times_once_and_remembers_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("TSM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(device, "name", lambda device_id=None: "Fake GPU 1")
    times = {"slow": 2.0, "fast": 1.0}
    timed = []

    def timer(fn):
        name = fn()
        timed.append(name)
        return times[name]

    cands = {"slow": lambda: "slow", "fast": lambda: "fast"}
    t = tune.Tuner("tsm2r")
    assert t.pick(("m", 1024), cands, timer=timer) == "fast"
    assert sorted(timed) == ["fast", "slow"]
    assert t.pick(("m", 1024), cands, timer=timer) == "fast" and len(timed) == 2
    # another process (a fresh tuner) reads it from the store
    assert tune.Tuner("tsm2r").lookup(("m", 1024)) == "fast"
    assert tune.store().path == tmp_path / "tune-Fake_GPU_1.json"
    assert tune.store("NVIDIA H100 80GB HBM3", tmp_path).path.name == "tune-NVIDIA_H100_80GB_HBM3.json"


# ------------------------------------------------------------------ timing


def test_timing_pure_helpers():
    t = timing.summarize([4e-3, 1e-3, 2e-3, 3e-3], batch=2)
    assert t.median_s == pytest.approx(1.25e-3) and t.min_s == 0.5e-3 and t.batch == 2
    assert timing.sets_needed(1 << 20, 50 << 20) == 101
    assert timing.sets_needed(1 << 30, 50 << 20) == 1
    f = timing.cycling(lambda x: x, [(1,), (2,)])
    assert [f(), f(), f()] == [1, 2, 1]
    assert device.SPIN_SRC is timing.SPIN_SRC  # one spin kernel


# ------------------------------------------------------------------ device


def test_device_facts_without_a_gpu(monkeypatch):
    ref = device.KNOWN_GPUS[device.REFERENCE_GPU]
    assert ref.name == "H100 SXM" and ref.source == "table"
    assert ref.peak_flops(np.float64) == 34e12
    with pytest.raises(TypeError):
        ref.peak_flops(np.int32)
    if not tsm_core.has_gpu():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            device.query()
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            tsm_core.device_spec()


def test_measure_writes_its_json_atomically(tmp_path):
    path = tmp_path / "device.json"
    cache.write_json(path, {"version": device.MEASURE_VERSION, "peak_bw": 1.0})
    assert cache.read_json(path) == {"version": device.MEASURE_VERSION, "peak_bw": 1.0}
    assert cache.read_json(tmp_path / "missing.json", "d") == "d"


# ------------------------------------------------------------------ log


def test_messages_go_through_the_tsm_core_logger(caplog):
    lg = log.get_logger("tsm_core.tsm2.profile")
    assert lg.name == "tsm_core.tsm2.profile"
    assert logging.getLogger("tsm_core").handlers  # a stderr handler, unless the app configured one
    with caplog.at_level(logging.INFO, logger="tsm_core"):
        logging.getLogger("tsm_core").propagate = True
        try:
            lg.info("measured %d", 1)
        finally:
            logging.getLogger("tsm_core").propagate = False
    assert "measured 1" in caplog.text


def test_no_prints_in_tsm2_and_runtime():
    for path in [*(ROOT / "tsm2").glob("*.py"), *(ROOT / "runtime").glob("*.py")]:
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
        # explain() prints by design (its purpose), and config's __main__ prints its table
        allowed = {"api.py": 2, "config.py": 1}.get(path.name, 0)
        assert len(calls) <= allowed, path


# ------------------------------------------------------------------ arrays


def test_order_of():
    a = np.zeros((4, 3))
    assert order_of(a) == "C" and order_of(np.asfortranarray(a)) == "F"
    assert order_of(a[:, :1]) == "C" and order_of(a[::2]) == "C"


# ------------------------------------------------------------------ layering


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("module", ["model.py", "profile.py", "configs.py"])
def test_the_planner_imports_no_launcher_and_no_tuner(module):
    names = _imports(ROOT / "tsm2" / module)
    for banned in ("tsm_core.tsm2.launch", "tsm_core.tsm2.autotune", "tsm_core.tsm2.api"):
        assert banned not in names, (module, banned)


def test_the_launcher_imports_no_tuner_and_no_api():
    names = _imports(ROOT / "tsm2" / "launch.py")
    for banned in ("tsm_core.tsm2.autotune", "tsm_core.tsm2.api", "tsm_core.tsm2.model"):
        assert banned not in names, banned


def test_runtime_imports_no_family():
    for path in (ROOT / "runtime").glob("*.py"):
        for name in _imports(path):
            assert not name.startswith("tsm_core.") or name.startswith("tsm_core.runtime"), (path, name)

"""The runtime layer's table of switches, logging, on-disk cache and tuner (no GPU needed)."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tsm_core.runtime import cache, config, log, tune
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import device as _device

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("tsm_core", "apps", "datasets")
KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".h")


# ---------------------------------------------------------------- config: the one table


def _names_in(paths) -> dict[str, str]:
    """TSM_* names -> the first file that mentions one (``TSM_X_`` prefixes left out)."""
    found = {}
    for path in paths:
        for name in re.findall(r"\bTSM_[A-Z0-9_]+\b", path.read_text(errors="replace")):
            if not name.endswith("_"):
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def _files(suffixes):
    for folder in SOURCE_FOLDERS:
        for p in sorted((ROOT / folder).rglob("*")):
            if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts:
                yield p


def test_every_switch_in_the_source_is_in_the_table():
    # Names that appear in kernel sources are preprocessor macros, not switches.
    macros = set(_names_in(_files(KERNEL_SUFFIXES)))
    used = {n: f for n, f in _names_in(_files((".py",))).items() if n not in macros}
    unknown = {n: f for n, f in used.items() if n not in config.SWITCHES}
    assert not unknown, f"TSM_* names used in the source but missing from config.SWITCHES: {unknown}"
    assert {"TSM_CACHE_DIR", "TSM_LOG"} <= set(used)


def _is_environ(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", None) == "os"


def _tsm_str(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("TSM_")


def _environ_reads(tree):
    """Lines that read a TSM_* variable from os.environ / os.getenv (writes, which
    steer the library from a bench or a test, are fine)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value) \
                and _tsm_str(node.slice):
            yield node.lineno
        elif isinstance(node, ast.Call) and node.args and _tsm_str(node.args[0]) \
                and isinstance(node.func, ast.Attribute) \
                and ((node.func.attr == "get" and _is_environ(node.func.value))
                     or (node.func.attr == "getenv" and getattr(node.func.value, "id", None) == "os")):
            yield node.lineno
        elif isinstance(node, ast.Compare) and _tsm_str(node.left) and any(_is_environ(c) for c in node.comparators):
            yield node.lineno


def test_no_switch_read_past_the_table():
    # config.flag / text / integer are the only readers of TSM_* variables.
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in _files((".py",)) if p.name != "config.py"
           for line in sorted(set(_environ_reads(ast.parse(p.read_text()))))]
    assert not bad, "TSM_* switches read from os.environ instead of tsm_core.runtime.config: " + ", ".join(bad)


def test_table_entries_are_well_formed():
    for name, s in config.SWITCHES.items():
        assert s.name == name and name.startswith("TSM_")
        assert s.kind in ("flag", "text", "int"), s
        assert s.family and s.help, s
        if s.kind == "flag":
            assert s.default in (True, False, None), s


@pytest.mark.parametrize("value, expected", [
    ("0", False), ("false", False), ("No", False), (" OFF ", False),
    ("1", True), ("true", True), ("YES", True), ("on", True), ("anything", True),
])
def test_flag_values(monkeypatch, value, expected):
    monkeypatch.setenv("TSM_AUTOTUNE", value)
    assert config.flag("TSM_AUTOTUNE") is expected


def test_flag_defaults(monkeypatch):
    monkeypatch.delenv("TSM_AUTOTUNE", raising=False)
    assert config.flag("TSM_AUTOTUNE") is True  # the table's default
    assert config.flag("TSM_AUTOTUNE", default=False) is False  # the caller's
    monkeypatch.setenv("TSM_AUTOTUNE", "  ")  # empty counts as unset
    assert config.flag("TSM_AUTOTUNE") is True
    monkeypatch.delenv("TSM_BATCHED_TC", raising=False)
    assert config.flag("TSM_BATCHED_TC") is None  # the library decides
    monkeypatch.setenv("TSM_AUTOTUNE", "0")
    assert config.flag("TSM_AUTOTUNE", default=True) is False  # a set value beats any default


def test_text_and_integer(monkeypatch):
    monkeypatch.delenv("TSM_NATIVE", raising=False)
    assert config.text("TSM_NATIVE") == "auto"
    monkeypatch.setenv("TSM_NATIVE", " 0 ")
    assert config.text("TSM_NATIVE") == "0"
    assert config.raw("TSM_NATIVE") == "0"
    monkeypatch.delenv("TSM_CONV_SPLITK", raising=False)
    assert config.integer("TSM_CONV_SPLITK") is None
    monkeypatch.setenv("TSM_CONV_SPLITK", " 4 ")
    assert config.integer("TSM_CONV_SPLITK") == 4
    monkeypatch.setenv("TSM_CONV_SPLITK", "four")
    with pytest.raises(ValueError, match="TSM_CONV_SPLITK"):
        config.integer("TSM_CONV_SPLITK")


def test_values_are_read_at_each_call(monkeypatch):
    monkeypatch.setenv("TSM_KMEANS_TILE", "v1")
    assert config.text("TSM_KMEANS_TILE") == "v1"
    monkeypatch.setenv("TSM_KMEANS_TILE", "v2")
    assert config.text("TSM_KMEANS_TILE") == "v2"


@pytest.mark.parametrize("reader", [config.flag, config.text, config.integer, config.raw])
def test_unknown_name_raises(reader):
    with pytest.raises(KeyError, match="TSM_NO_SUCH_SWITCH"):
        reader("TSM_NO_SUCH_SWITCH")


def test_describe_lists_every_switch(monkeypatch):
    monkeypatch.setenv("TSM_CONV_TILE", "t64")
    text = config.describe()
    assert len(text.splitlines()) == len(config.SWITCHES)
    for name in config.SWITCHES:
        assert name in text
    assert "(now t64)" in text


# ---------------------------------------------------------------- log


@pytest.fixture
def fresh_logging():
    """tsm's loggers as a new process has them; restored afterwards."""
    names = ("tsm_core", "tsm_apps")
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in names}
    saved_configured = set(log._configured)
    for n in names:
        lg = logging.getLogger(n)
        lg.handlers.clear()
        lg.setLevel(logging.NOTSET)
        lg.propagate = True
    log._configured.clear()
    yield
    log._configured.clear()
    log._configured.update(saved_configured)
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


def _first_use_unconfigured(name, monkeypatch):
    """``get_logger(name)`` as a module-level logger meets it: at import, before the
    application has configured logging (the root logger has no handler)."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    root.handlers.clear()
    try:
        return log.get_logger(name)
    finally:
        root.handlers[:] = handlers


def test_logger_names():
    assert log.get_logger("tsm_core.tsm2.profile").name == "tsm_core.tsm2.profile"
    assert log.get_logger("tsm_apps.kmeans").name == "tsm_apps.kmeans"
    assert log.get_logger("tsm_core.tsm2.profile").parent.name in ("tsm_core.tsm2", "tsm_core")


def test_default_messages_go_to_stderr(fresh_logging, monkeypatch, capsys):
    monkeypatch.delenv("TSM_LOG", raising=False)
    lg = _first_use_unconfigured("tsm_core.demo", monkeypatch)
    root = logging.getLogger()
    handlers = list(root.handlers)
    root.handlers.clear()  # an application that configured nothing
    try:
        lg.info("measured once")
        lg.debug("not shown")
    finally:
        root.handlers[:] = handlers
    err = capsys.readouterr().err
    assert "tsm_core.demo: measured once" in err
    assert "not shown" not in err


def test_tsm_log_sets_the_level(fresh_logging, monkeypatch, capsys):
    monkeypatch.setenv("TSM_LOG", "warning")
    lg = _first_use_unconfigured("tsm_core.demo", monkeypatch)
    root = logging.getLogger()
    handlers = list(root.handlers)
    root.handlers.clear()
    try:
        lg.info("quiet")
        lg.warning("loud")
    finally:
        root.handlers[:] = handlers
    err = capsys.readouterr().err
    assert "loud" in err and "quiet" not in err


def test_messages_reach_caplog_and_can_be_silenced(fresh_logging, monkeypatch, caplog):
    # The module's logger was made at import time, before any handler existed;
    # records must still reach the application's handlers (here pytest's).
    lg = _first_use_unconfigured("tsm_core.demo", monkeypatch)
    with caplog.at_level(logging.INFO, logger="tsm_core"):
        lg.info("captured %d", 1)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("tsm_core.demo", logging.INFO, "captured 1")]
    caplog.clear()
    top = logging.getLogger("tsm_core")
    level = top.level
    top.setLevel(logging.WARNING)
    try:
        lg.info("silenced")
        lg.warning("kept")
    finally:
        top.setLevel(level)
    assert [r.getMessage() for r in caplog.records] == ["kept"]


def test_configured_application_gets_each_message_once(fresh_logging, monkeypatch, capsys, caplog):
    # An application that configured logging receives the records through its own
    # handlers, and tsm prints nothing of its own beside them.
    caplog.set_level(logging.INFO)
    lg = log.get_logger("tsm_core.demo")  # root has pytest's handlers: configured
    lg.info("once")
    assert [r.getMessage() for r in caplog.records] == ["once"]
    assert "once" not in capsys.readouterr().err


# ---------------------------------------------------------------- cache


def test_cache_dir_follows_the_switch(monkeypatch, tmp_path):
    monkeypatch.setenv("TSM_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TSM_CACHE_DIR", "~/x")
    assert cache.cache_dir() == tmp_path / "x"


def test_write_json_is_atomic(tmp_path):
    path = tmp_path / "sub" / "s.json"
    cache.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    # A write that fails half-way leaves the old file whole, and no temporary behind.
    with pytest.raises(TypeError):
        cache.write_json(path, {"a": 2, "b": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["s.json"]


def test_store_update_load_clear(tmp_path):
    s = cache.JsonStore(tmp_path / "deep" / "store.json")
    assert s.load() == {} and s.get("a", 7) == 7
    assert s.update({"a": 1}) == {"a": 1}
    assert s.update({"b": [1, 2]}) == {"a": 1, "b": [1, 2]}
    assert cache.JsonStore(s.path).get("b") == [1, 2]  # another instance reads the file
    s.clear()
    assert not s.path.exists() and s.load() == {}
    s.clear()  # nothing to remove: no error


def test_corrupt_files_read_as_default(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1, "b"')  # cut short
    assert cache.read_json(bad, default="fallback") == "fallback"
    assert cache.read_json(tmp_path / "missing.json", default={}) == {}
    assert cache.JsonStore(bad).load() == {}
    (tmp_path / "list.json").write_text("[1, 2]")  # valid JSON, not an object
    assert cache.JsonStore(tmp_path / "list.json").load() == {}
    s = cache.JsonStore(bad)
    s.update({"c": 3})  # a corrupt store is replaced on the next write
    assert s.load() == {"c": 3}


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tsm_core.runtime.cache import JsonStore

    path, tag, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    store = JsonStore(path)
    (go.parent / f"ready-{tag}").touch()
    while not go.exists():
        time.sleep(0.005)
    for i in range(50):
        store.update({f"{tag}-{i}": i})
""")


def test_concurrent_writers_lose_no_key(tmp_path):
    path, go = tmp_path / "shared.json", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{j}", str(go)])
             for j in range(3)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all three start writing at once
    for p in procs:
        assert p.wait(timeout=120) == 0
    data = json.loads(path.read_text())
    assert len(data) == 150
    assert data == {f"w{j}-{i}": i for j in range(3) for i in range(50)}
    assert not list(tmp_path.glob("*.tmp"))


# ---------------------------------------------------------------- tune


class _Timer:
    """A fake timer: fixed times per candidate, and a count of what it timed."""

    def __init__(self, times):
        self.times, self.calls = times, []

    def __call__(self, fn):
        name = fn()
        self.calls.append(name)
        return self.times[name]


def _candidates(*names):
    return {n: (lambda n=n: n) for n in names}


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A GPU named "Fake GPU/1" and a temporary cache folder."""
    monkeypatch.setenv("TSM_CACHE_DIR", str(tmp_path / "cache"))
    if hasattr(tune, "_gpu_name"):
        monkeypatch.setattr(tune, "_gpu_name", lambda: _device._sanitise("Fake GPU/1"))
    if hasattr(_device, "name"):
        monkeypatch.setattr(_device, "name", lambda *a, **k: "Fake GPU/1")
    return tmp_path / "cache"


def test_tuner_in_process(fake_gpu):
    t = tune.Tuner("demo", persistent=False)
    timer = _Timer({"a": 3.0, "b": 1.0, "c": 2.0})
    assert t.lookup(("n", 4)) is None
    assert t.pick(("n", 4), _candidates("a", "b", "c"), timer=timer) == "b"
    assert sorted(timer.calls) == ["a", "b", "c"]
    assert t.pick(("n", 4), _candidates("a", "b", "c"), timer=timer) == "b"
    assert len(timer.calls) == 3  # remembered: not timed again
    assert t.lookup(("n", 4)) == "b"
    # a remembered choice that is no longer a candidate is timed again
    assert t.pick(("n", 4), _candidates("a", "c"), timer=timer) == "c"
    t.forget()
    assert t.lookup(("n", 4)) is None
    assert not fake_gpu.exists()  # nothing written to disk


def test_tuner_on_disk(fake_gpu):
    timer = _Timer({"x": 2.0, "y": 1.0})
    first = tune.Tuner("kmeans", persistent=True)
    assert first.pick(("k", 8), _candidates("x", "y"), timer=timer) == "y"
    files = list(fake_gpu.glob("tune-*.json"))
    assert len(files) == 1 and "Fake" in files[0].name and "/" not in files[0].name[5:]
    stored = json.loads(files[0].read_text())
    (key,) = stored
    assert stored[key] == "y"
    assert key.startswith("kmeans|") and _compile.source_hash("kmeans") in key and "('k', 8)" in key
    # another process (a new tuner, empty memo) finds the choice without timing
    second = tune.Tuner("kmeans", persistent=True)
    assert second.lookup(("k", 8)) == "y"
    assert second.pick(("k", 8), _candidates("x", "y"), timer=timer) == "y"
    assert len(timer.calls) == 2
    # forget() drops the memo only; the disk keeps the choice
    second.forget()
    assert second.lookup(("k", 8)) == "y"
    # a family without kernel source still gets a key
    third = tune.Tuner("demo", persistent=True)
    third.remember("k", "z")
    assert tune.Tuner("demo").lookup("k") == "z"

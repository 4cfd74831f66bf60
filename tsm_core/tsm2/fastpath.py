"""The C++ half of ``matmul`` on torch tensors routed to cuBLAS (``fastpath.cpp``).

Built on first use (in a background thread: calls keep the Python path until it is
ready), as the batched family's fast path (``tsm_core/batched/native.py``:
same compiler, flags, cache directory and switch): compiled once per (source, torch
version, Python ABI) into ``cache_dir()/native/`` and loaded from there by later
processes. `get()` returns the module, or None where it cannot be had; ``matmul``
then keeps its Python path, which computes the same results.

Environment: ``TSM_NATIVE=0`` never builds or loads it; ``TSM_NATIVE=1`` makes a
failed build an error instead of a warning.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
import threading
import warnings
from pathlib import Path

from tsm_core.batched import native as _native
from tsm_core.runtime.log import get_logger

_log = get_logger(__name__)

SOURCE = Path(__file__).parent / "fastpath.cpp"
MODULE = "tsm_mm_fastpath"  # PyInit_tsm_mm_fastpath in the source

_lock = threading.Lock()
_state: dict = {}


def target() -> Path:
    """Where the built module lives: its name hashes everything it was built from."""
    torch, _ = _native._torch()
    from tsm_core.runtime.cache import cache_dir

    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                 os.environ.get("CXX", "c++").encode(), repr(_native.build_flags()).encode()):
        h.update(part)
        h.update(b"\0")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / "native" / f"mm-fastpath-{h.hexdigest()[:16]}{suffix}"


def build(path: Path | None = None, *, quiet: bool = False) -> Path:
    """Compile the extension to `path` (default `target()`); returns the path.
    Raises RuntimeError with the compiler's output when it fails."""
    path = Path(path) if path is not None else target()
    path.parent.mkdir(parents=True, exist_ok=True)
    cflags, lflags = _native.build_flags()
    cxx = os.environ.get("CXX", "c++")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if not quiet:
        _log.info("building the C++ matmul fast path for torch tensors (once): %s", path)
    errors = []
    for std in ("-std=c++17", "-std=c++20"):
        cmd = [cxx, std, *cflags, str(SOURCE), "-o", str(tmp), *lflags]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:
            raise RuntimeError(f"cannot run the C++ compiler {cxx!r}: {exc}") from exc
        if r.returncode == 0:
            os.replace(tmp, path)
            return path
        errors.append(f"$ {' '.join(cmd)}\n{r.stderr[-4000:]}")
    tmp.unlink(missing_ok=True)
    raise RuntimeError("building tsm_core/tsm2/fastpath.cpp failed:\n" + "\n".join(errors))


def load(path: Path):
    """Import the built module at `path`."""
    _native._torch()
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _decide(build_if_missing: bool = True):
    """Load the module (building it first where missing and allowed) and record the
    outcome; called under the lock."""
    mod, err = None, None
    m = _native.mode()
    if m == "0":
        err = "switched off by TSM_NATIVE=0"
    else:
        try:
            path = target()
            if not path.exists():
                build(path)
            mod = load(path)
        except ImportError as exc:
            err = f"torch is not importable: {exc}"
        except Exception as exc:  # compiler missing or failing, a bad cache file
            err = f"{type(exc).__name__}: {exc}"
            if m == "1":
                raise
            warnings.warn("tsm: the C++ matmul fast path for torch tensors is unavailable "
                          f"(matmul takes the Python path): {err}", RuntimeWarning, stacklevel=4)
    _state["module"], _state["error"] = mod, err
    return mod


def _build_in_background():
    try:
        with _lock:
            if "module" not in _state:
                _decide()
    except Exception as exc:  # noqa: BLE001 - recorded; the Python path stays
        _state.setdefault("module", None)
        _state.setdefault("error", f"{type(exc).__name__}: {exc}")


def get(wait: bool = False):
    """The extension module, or None: where switched off (``TSM_NATIVE=0``), torch is
    missing, the build failed (a warning says why, once; ``TSM_NATIVE=1`` raises
    instead), or, unless `wait`, while it is being built.

    A module already built (in the cache) is loaded at once. A missing one is built
    in a background thread, so that no call waits for the compiler (tens of seconds):
    calls take the Python path, which computes the same results, until it is ready.
    ``TSM_NATIVE=1`` and `wait` build in the caller's thread."""
    if "module" in _state:
        return _state["module"]
    if wait or _native.mode() in ("0", "1"):
        with _lock:
            return _state["module"] if "module" in _state else _decide()
    try:
        ready = _native.mode() != "0" and target().exists()
    except Exception:  # noqa: BLE001 - torch missing: _decide says so
        ready = True
    if ready:
        with _lock:
            return _state["module"] if "module" in _state else _decide()
    if "thread" not in _state:
        with _lock:
            if "thread" not in _state and "module" not in _state:
                t = threading.Thread(target=_build_in_background, name="tsm-mm-fastpath-build", daemon=True)
                _state["thread"] = t
                t.start()
    return None


def status() -> dict:
    """Whether the extension is loaded in this process, and if not, why."""
    return {"loaded": _state.get("module") is not None, "decided": "module" in _state,
            "building": "thread" in _state and "module" not in _state,
            "mode": _native.mode(), "error": _state.get("error")}


def _reset_for_tests():
    with _lock:
        _state.clear()



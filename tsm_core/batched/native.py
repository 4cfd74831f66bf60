"""The C++ half of batched calls on torch tensors (``fastpath.cpp``), built on first use.

A repeated ``batched_matmul`` on torch CUDA tensors spends its host time
recognising the batch: in Python, a few attribute reads per tensor. The extension
reads each tensor's data pointer, sizes, strides, dtype and device straight from
torch's C++ object and launches the remembered kernel in the same call (see the
source's header for what it compares and why that is safe).

`get()` returns the loaded module, or None where it cannot be had; callers then
keep their Python path, which computes the same results. The module is compiled
once per (source, torch version, Python ABI) with the C++ compiler (``$CXX``, else
``c++``) against the installed torch's headers and libraries, into
``cache_dir()/native/``, and loaded from there by later processes (milliseconds).
No new dependency: a compiler is what torch's own C++ extensions need, and without
one the package works as before.

Environment: ``TSM_NATIVE=0`` never builds or loads it (the Python path);
``TSM_NATIVE=1`` makes a failed build an error instead of a warning.
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

from tsm_core.runtime import config as _config
from tsm_core.runtime.log import get_logger

_log = get_logger(__name__)

SOURCE = Path(__file__).parent / "fastpath.cpp"
MODULE = "tsm_fastpath"  # PyInit_tsm_fastpath in the source

_lock = threading.Lock()
_state: dict = {}  # "module": the module or None once decided; "error": why not


def mode() -> str:
    """``TSM_NATIVE``: "0" (off), "1" (required) or "auto" (the default)."""
    v = _config.text("TSM_NATIVE").lower()
    return {"0": "0", "off": "0", "false": "0", "1": "1", "on": "1", "true": "1"}.get(v, "auto")


def _torch():
    import torch  # noqa: F401  (loads libtorch before the extension that links it)
    from torch.utils import cpp_extension

    return torch, cpp_extension


def build_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the installed torch and Python."""
    torch, cpp = _torch()
    inc = [f"-I{p}" for p in cpp.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cflags = ["-O2", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *inc]
    libs = cpp.library_paths()
    lflags = [*(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
              "-ltorch_python", "-ltorch", "-lc10"]
    return cflags, lflags


def target() -> Path:
    """Where the built module lives: its name hashes everything it was built from."""
    torch, _ = _torch()
    from tsm_core.runtime.cache import cache_dir

    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                 os.environ.get("CXX", "c++").encode(), repr(build_flags()).encode()):
        h.update(part)
        h.update(b"\0")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / "native" / f"fastpath-{h.hexdigest()[:16]}{suffix}"


def build(path: Path | None = None, *, quiet: bool = False) -> Path:
    """Compile the extension to `path` (default `target()`); returns the path.

    Raises RuntimeError with the compiler's output when it fails. The file appears
    whole or not at all (written beside it, then renamed), so processes building at
    once do not see each other's halves.
    """
    path = Path(path) if path is not None else target()
    path.parent.mkdir(parents=True, exist_ok=True)
    cflags, lflags = build_flags()
    cxx = os.environ.get("CXX", "c++")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if not quiet:
        _log.info("building the C++ fast path for torch tensors (once, about 15 s): %s", path)
    errors = []
    # torch's headers compile as C++17 up to now; C++20 should a later torch need it.
    for std in ("-std=c++17", "-std=c++20"):
        cmd = [cxx, std, *cflags, str(SOURCE), "-o", str(tmp), *lflags]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as exc:  # no compiler at all
            raise RuntimeError(f"cannot run the C++ compiler {cxx!r}: {exc}") from exc
        if r.returncode == 0:
            os.replace(tmp, path)
            return path
        errors.append(f"$ {' '.join(cmd)}\n{r.stderr[-4000:]}")
    tmp.unlink(missing_ok=True)
    raise RuntimeError("building tsm_core/batched/fastpath.cpp failed:\n" + "\n".join(errors))


def load(path: Path):
    """Import the built module at `path`."""
    _torch()
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def get():
    """The extension module, built first if needed; None where it is switched off
    (``TSM_NATIVE=0``), torch is missing, or the build fails (a warning says why,
    once; ``TSM_NATIVE=1`` raises instead). Decided once per process."""
    if "module" in _state:
        return _state["module"]
    with _lock:
        if "module" in _state:
            return _state["module"]
        mod, err = None, None
        m = mode()
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
                warnings.warn("tsm: the C++ fast path for torch tensors is unavailable "
                              f"(batched calls take the Python path): {err}", RuntimeWarning,
                              stacklevel=3)
        _state["module"], _state["error"] = mod, err
        return mod


def status() -> dict:
    """Whether the extension is loaded in this process, and if not, why."""
    return {"loaded": _state.get("module") is not None, "decided": "module" in _state,
            "mode": mode(), "error": _state.get("error")}


def _reset_for_tests():
    """Forget the decision (tests switch TSM_NATIVE in one process)."""
    with _lock:
        _state.clear()

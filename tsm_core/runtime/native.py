"""Build and load the package's C++ extensions for torch tensors: one mechanism, one cache.

Two extensions use it: the batched family's fast path (``tsm_core/batched/fastpath.cpp``,
through ``tsm_core/batched/native.py``) and ``matmul``'s for products routed to cuBLAS
(``tsm_core/tsm2/fastpath.cpp``, through ``tsm_core/tsm2/fastpath.py``). Each is an
`Extension`: compiled with the C++ compiler (``$CXX``, else ``c++``) against the
installed torch's headers and libraries, once per (source, torch version, Python
ABI, compiler, flags), into ``cache_dir()/native/``, and loaded from there by later
processes (milliseconds). No new dependency: a compiler is what torch's own C++
extensions need, and without one the package works as before (callers keep their
Python path, which computes the same results).

An extension built with ``background=True`` never makes a call wait for the compiler:
while its module is missing from the cache, `Extension.get` starts the build in a
thread and returns None until it is ready.

Environment: ``TSM_NATIVE=0`` never builds or loads any of them; ``TSM_NATIVE=1``
makes a failed build an error instead of a warning, and builds in the caller's thread.
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


def mode() -> str:
    """The ``TSM_NATIVE`` switch, normalised.

    Returns
    -------
    str
        ``"0"`` (off), ``"1"`` (required: a failed build raises) or ``"auto"`` (the
        default: a failed build warns and the Python path stays).

    Examples
    --------
    >>> from tsm_core.runtime import native
    >>> native.mode() in ("0", "1", "auto")
    True
    """
    v = _config.text("TSM_NATIVE").lower()
    return {"0": "0", "off": "0", "false": "0", "1": "1", "on": "1", "true": "1"}.get(v, "auto")


def torch_modules():
    """(torch, torch.utils.cpp_extension); importing torch loads libtorch before an
    extension that links it. Raises ImportError where torch is missing."""
    import torch
    from torch.utils import cpp_extension

    return torch, cpp_extension


def build_flags() -> tuple[list[str], list[str]]:
    """The compiler's flags for the installed torch and Python.

    Returns
    -------
    tuple of (list of str, list of str)
        (compile flags, link flags).

    Raises
    ------
    ImportError
        Where torch is not installed.

    Examples
    --------
    >>> from tsm_core.runtime import native
    >>> try:
    ...     cflags, lflags = native.build_flags()
    ... except ImportError:  # no torch here
    ...     cflags, lflags = ["-shared"], ["-ltorch"]
    >>> "-shared" in cflags and "-ltorch" in lflags
    True
    """
    torch, cpp = torch_modules()
    inc = [f"-I{p}" for p in cpp.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cflags = ["-O2", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *inc]
    libs = cpp.library_paths()
    lflags = [*(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
              "-ltorch_python", "-ltorch", "-lc10"]
    return cflags, lflags


class Extension:
    """One C++ extension module for torch: where it is cached, how it is built and loaded,
    and the per-process decision whether it is used.

    Parameters
    ----------
    source : path-like
        The ``.cpp`` file.
    module : str
        The module's name (``PyInit_<module>`` in the source).
    stem : str
        The cached file's name begins with it (``<stem>-<hash><EXT_SUFFIX>``).
    what : str
        What it is, for messages ("the C++ fast path for torch tensors").
    fallback : str
        What callers do without it, for the warning ("batched calls take the Python path").
    background : bool
        Build a missing module in a background thread (`get` returns None meanwhile)
        rather than in the caller's.

    Examples
    --------
    >>> from pathlib import Path
    >>> from tsm_core.runtime.native import Extension
    >>> ext = Extension(Path("demo.cpp"), "tsm_demo", "demo", "a demo", "the Python path")
    >>> ext.status()["decided"]
    False
    """

    def __init__(self, source, module: str, stem: str, what: str, fallback: str,
                 background: bool = False):
        self.source = Path(source)
        self.module = module
        self.stem = stem
        self.what = what
        self.fallback = fallback
        self.background = background
        self._lock = threading.Lock()
        self._state: dict = {}  # "module": the module or None once decided; "error": why not

    def _label(self) -> str:
        return "/".join(self.source.parts[-3:])

    def target(self) -> Path:
        """Where the built module lives: its name hashes everything it was built from."""
        torch, _ = torch_modules()
        from tsm_core.runtime.cache import cache_dir

        h = hashlib.sha256()
        for part in (self.source.read_bytes(), torch.__version__.encode(), sys.version.encode(),
                     os.environ.get("CXX", "c++").encode(), repr(build_flags()).encode()):
            h.update(part)
            h.update(b"\0")
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        return cache_dir() / "native" / f"{self.stem}-{h.hexdigest()[:16]}{suffix}"

    def build(self, path: Path | None = None, *, quiet: bool = False) -> Path:
        """Compile the extension to `path` (default `target()`); returns the path.

        Raises RuntimeError with the compiler's output when it fails. The file appears
        whole or not at all (written beside it, then renamed), so processes building at
        once do not see each other's halves.
        """
        path = Path(path) if path is not None else self.target()
        path.parent.mkdir(parents=True, exist_ok=True)
        cflags, lflags = build_flags()
        cxx = os.environ.get("CXX", "c++")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        if not quiet:
            _log.info("building %s (once, about 15 s): %s", self.what, path)
        errors = []
        # torch's headers compile as C++17 up to now; C++20 should a later torch need it.
        for std in ("-std=c++17", "-std=c++20"):
            cmd = [cxx, std, *cflags, str(self.source), "-o", str(tmp), *lflags]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True)
            except OSError as exc:  # no compiler at all
                raise RuntimeError(f"cannot run the C++ compiler {cxx!r}: {exc}") from exc
            if r.returncode == 0:
                os.replace(tmp, path)
                return path
            errors.append(f"$ {' '.join(cmd)}\n{r.stderr[-4000:]}")
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {self._label()} failed:\n" + "\n".join(errors))

    def _build_once(self, path: Path):
        """`build` unless another process is building the same file: they wait on a
        lock file beside it (where the platform has ``fcntl``), then find it built."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # no advisory locks here: each process builds its own
            fcntl = None
        with open(path.with_name(f".{path.name}.lock"), "a") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                self.build(path)

    def load(self, path: Path):
        """Import the built module at `path`."""
        torch_modules()
        loader = importlib.machinery.ExtensionFileLoader(self.module, str(path))
        spec = importlib.util.spec_from_file_location(self.module, str(path), loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        return mod

    def _decide(self):
        """Load the module (building it first where missing) and record the outcome;
        called under the lock. The warning points at the caller of `get`'s caller
        (_decide, _decide_locked, get, the library's call, the user's)."""
        mod, err = None, None
        m = mode()
        if m == "0":
            err = "switched off by TSM_NATIVE=0"
        else:
            try:
                path = self.target()
                if not path.exists():
                    self._build_once(path)
                mod = self.load(path)
            except ImportError as exc:
                err = f"torch is not importable: {exc}"
            except Exception as exc:  # compiler missing or failing, a bad cache file
                err = f"{type(exc).__name__}: {exc}"
                if m == "1":
                    raise
                warnings.warn(f"tsm: {self.what} is unavailable ({self.fallback}): {err}",
                              RuntimeWarning, stacklevel=5)
        self._state["module"], self._state["error"] = mod, err
        return mod

    def _decide_locked(self):
        with self._lock:
            return self._state["module"] if "module" in self._state else self._decide()

    def _build_in_background(self):
        try:
            self._decide_locked()
        except Exception as exc:  # noqa: BLE001 - recorded; the Python path stays
            self._state.setdefault("module", None)
            self._state.setdefault("error", f"{type(exc).__name__}: {exc}")

    def get(self, wait: bool = False):
        """The extension module, or None: where switched off (``TSM_NATIVE=0``), torch
        is missing, the build failed (a warning says why, once; ``TSM_NATIVE=1`` raises
        instead), or, for a background extension unless `wait`, while it is being built.
        Decided once per process.

        A module already in the cache is loaded at once. A missing one is built in the
        caller's thread, or for a background extension in a thread of its own (calls
        keep their Python path until it is ready); ``TSM_NATIVE=1`` and `wait` build
        in the caller's thread.
        """
        if "module" in self._state:
            return self._state["module"]
        if not self.background or wait or mode() in ("0", "1"):
            return self._decide_locked()
        try:
            ready = self.target().exists()
        except Exception:  # noqa: BLE001 - torch missing: _decide says so
            ready = True
        if ready:
            return self._decide_locked()
        if "thread" not in self._state:
            with self._lock:
                if "thread" not in self._state and "module" not in self._state:
                    t = threading.Thread(target=self._build_in_background,
                                         name=f"tsm-{self.stem}-build", daemon=True)
                    self._state["thread"] = t
                    t.start()
        return None

    def status(self) -> dict:
        """Whether the extension is loaded in this process, and if not, why."""
        st = {"loaded": self._state.get("module") is not None, "decided": "module" in self._state,
              "mode": mode(), "error": self._state.get("error")}
        if self.background:
            st["building"] = "thread" in self._state and "module" not in self._state
        return st

    def reset(self):
        """Forget the decision (tests switch TSM_NATIVE in one process)."""
        with self._lock:
            self._state.clear()

    def functions(self) -> tuple:
        """(target, build, load, get, status, reset): the bound methods a module that
        owns this extension offers under its own names."""
        return self.target, self.build, self.load, self.get, self.status, self.reset

"""Kernel sources, run-time compilation and the compiled-module cache.

Kernels are real ``.cu`` files in ``tsm_core/kernels``; ``#include "x.cuh"`` lines
are replaced by the header's text so that each family compiles as one translation
unit whose hash covers everything it uses. Modules are compiled with CuPy's
``RawModule(code=..., name_expressions=[...])`` and memoised per (device, family,
name expression); CuPy's own on-disk cache makes later processes start fast.

``compile_report`` compiles through NVRTC directly, without a GPU, and returns the
register count and spill figures of one instantiation (used by CI to check that
every configuration the planner can choose compiles for sm_90 without spilling).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PACKAGE_DIR = Path(__file__).resolve().parents[1]
INCLUDE_DIR = PACKAGE_DIR / "include"
# family -> its kernel file, beside the family's launcher
KERNELS = {
    "tsm2r": "tsm2/tsm2r.cu",
    "tsm2l": "tsm2/tsm2l.cu",
    "batched": "batched/batched.cu",
    "gemm": "tiled/gemm.cu",
    "conv": "conv/conv.cu",
    "kmeans": "kmeans/kmeans.cu",
    "kmeans_mma": "kmeans/mma.cu",
    "abft": "abft/abft.cu",
    "kmeans_init": "kmeans/init.cu",
}
OPTIONS = ("-std=c++17",)

_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)


HALF_CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}  # numpy has no bfloat16: by name


def ctype(dtype) -> str:
    """C++ type name of a numpy float dtype, or of "float16" / "bfloat16" (by name:
    numpy has no bfloat16) for the kernels that take half-precision operands."""
    if isinstance(dtype, str) and dtype in HALF_CTYPES:
        return HALF_CTYPES[dtype]
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "float"
    if dtype == np.float64:
        return "double"
    if dtype == np.float16:
        return "__half"
    raise TypeError(f"tsm_core kernels support float32 and float64, not {dtype}")


def _expand(path: Path, seen: set) -> str:
    """The file at `path` with its local includes (resolved in INCLUDE_DIR) inlined, each once."""
    text = path.read_text()

    def repl(match):
        inc = INCLUDE_DIR / match.group(1)
        if inc in seen:
            return ""
        seen.add(inc)
        return _expand(inc, seen)

    return _INCLUDE.sub(repl, text)


def kernel_path(family: str) -> Path:
    """The ``.cu`` file of one kernel family (``KERNELS``)."""
    try:
        return PACKAGE_DIR / KERNELS[family]
    except KeyError:
        raise ValueError(f"unknown kernel family {family!r}; one of {sorted(KERNELS)}") from None


@functools.lru_cache(maxsize=None)
def source(family: str) -> str:
    """Full source of one family's ``.cu`` file with local includes inlined."""
    return _expand(kernel_path(family), set())


@contextlib.contextmanager
def source_from(family: str, path, modules: dict | None = None):
    """Inside the block, `family`'s kernels compile from the file at `path` (another
    version of <family>.cu; its local includes inlined from INCLUDE_DIR) into
    the module cache `modules` (a new one if None): so that a previous version of a
    kernel file can be timed beside the tree's in one process (A/B comparisons).

    Examples
    --------
    >>> from tsm_core.runtime import compile as _compile
    >>> tree = _compile.source("abft")
    >>> with _compile.source_from("abft", _compile.kernel_path("abft")):
    ...     _compile.source("abft") == tree
    True
    """
    global source, _modules
    text = _expand(Path(path), set())
    orig, orig_modules = source, _modules
    source = lambda fam: text if fam == family else orig(fam)  # noqa: E731
    _modules = {} if modules is None else modules
    try:
        yield
    finally:
        source, _modules = orig, orig_modules


@functools.lru_cache(maxsize=None)
def source_hash(family: str | None = None) -> str:
    """Short hash of one family's source, or of all kernel files (autotune keys)."""
    h = hashlib.sha256()
    if family is not None:
        h.update(source(family).encode())
    else:
        for path in sorted([*map(kernel_path, KERNELS), *INCLUDE_DIR.glob("*.cuh")], key=lambda p: p.name):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


_lock = threading.Lock()
_modules: dict = {}


# Kernels compiled for an architecture-specific target: gemm_ws moves registers
# between its warpgroups with setmaxnreg, and the wgmma kernels (batched version 6,
# kmeans_assign_wg) use instructions only sm_90a has (their launchers run them
# on compute capability 9.0 devices only). NVRTC takes the "a" target when CuPy adds
# its own -arch=sm_90 after it.
ARCH_SPECIFIC = {"gemm_ws<": "sm_90a", "tsm_batched_gemm<float, 6>": "sm_90a", "kmeans_assign_wg<": "sm_90a",
                 "kmeans_assign_wgp<": "sm_90a", "kmeans_assign_ws<": "sm_90a"}


def options_for(name_expr: str) -> tuple:
    """NVRTC options of one instantiation: OPTIONS, plus -arch for ARCH_SPECIFIC ones."""
    for prefix, arch in ARCH_SPECIFIC.items():
        if name_expr.startswith(prefix):
            return (f"-arch={arch}", *OPTIONS)
    return OPTIONS


def get_kernel(family: str, name_expr: str):
    """The compiled kernel ``name_expr`` of ``family`` for the current device."""
    import cupy

    dev = cupy.cuda.Device().id
    key = (dev, family, name_expr)
    kern = _modules.get(key)
    if kern is None:
        with _lock:
            kern = _modules.get(key)
            if kern is None:
                mod = cupy.RawModule(code=source(family), options=options_for(name_expr),
                                     name_expressions=[name_expr])
                kern = mod.get_function(name_expr)
                _modules[key] = kern
    return kern


@dataclass(frozen=True)
class CompileReport:
    name_expr: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    log: str

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def compile_report(family: str, name_expr: str, arch: str = "sm_90") -> CompileReport:
    """Compile one instantiation to a cubin through NVRTC (no GPU needed)."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source(family), f"{family}.cu", [], [])
    try:
        nvrtc.addNameExpression(prog, name_expr)
        opts = ["-Xptxas=-v", *OPTIONS]
        # an ARCH_SPECIFIC instantiation keeps its target where `arch` is its base one
        special = options_for(name_expr)[0]
        opts.insert(0, special if special.startswith(f"-arch={arch}") else f"-arch={arch}")
        try:
            nvrtc.compileProgram(prog, opts)
        except Exception as exc:  # the log says why
            raise RuntimeError(f"NVRTC failed on {name_expr}:\n{nvrtc.getProgramLog(prog)}") from exc
        log = nvrtc.getProgramLog(prog)
        lowered = nvrtc.getLoweredName(prog, name_expr)
    finally:
        nvrtc.destroyProgram(prog)
    # ptxas prints a block per entry function; keep the one we asked for.
    block = log[log.find(lowered):] if lowered in log else log
    regs = re.search(r"Used (\d+) registers", block)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block)
    stack = re.search(r"(\d+) bytes stack frame", block)
    return CompileReport(
        name_expr=name_expr,
        arch=arch,
        registers=int(regs.group(1)) if regs else -1,
        spill_stores=int(spill.group(1)) if spill else 0,
        spill_loads=int(spill.group(2)) if spill else 0,
        stack_frame=int(stack.group(1)) if stack else 0,
        log=log,
    )

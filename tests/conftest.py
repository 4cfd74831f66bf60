"""Shared fixtures, the `gpu` marker (such tests are skipped where no GPU is found),
the ``--all-kernels`` option, and a temporary cache folder: the suite never writes
into the user's ~/.cache/tsm.

``TSM_CACHE_DIR`` is set here, when pytest loads this file and before any test
module imports tsm_core, to a folder made for this session (removed at its end);
subprocesses the tests start inherit it. The ``tsm_cache_dir`` fixture (autouse,
session-wide) keeps it set and hands tests its path.

Under pytest-xdist (``-n``) each worker has a cache folder of its own, but their
``native/`` subfolders are one folder, the controller's: the C++ extensions
(``tsm_core/runtime/native.py``) are built once a run rather than once a worker.
Built files are named by the hash of what they were built from and appear whole
(renamed into place), so workers may share them.

``--all-kernels`` compiles every instantiation of the NVRTC sweeps (test_gemm.py,
test_compile.py) instead of their fixed sample (``_sweep.py``).
"""

import os
import shutil
import tempfile
from pathlib import Path

import _sweep
import numpy as np
import pytest

_CACHE_DIR = tempfile.mkdtemp(prefix="tsm-tests-cache-")
os.environ["TSM_CACHE_DIR"] = _CACHE_DIR
# The controller's native/ folder, handed to xdist workers through the environment
# (they inherit it); a worker links its own native/ to it.
_SHARED_NATIVE = "PYTEST_TSM_NATIVE_DIR"
if os.environ.get("PYTEST_XDIST_WORKER") and os.path.isdir(os.environ.get(_SHARED_NATIVE, "")):
    os.symlink(os.environ[_SHARED_NATIVE], os.path.join(_CACHE_DIR, "native"))
else:
    os.makedirs(os.path.join(_CACHE_DIR, "native"))
    os.environ[_SHARED_NATIVE] = os.path.join(_CACHE_DIR, "native")

from tsm_core.runtime import arrays as _arrays  # noqa: E402  (after TSM_CACHE_DIR is set)


def pytest_addoption(parser):
    parser.addoption("--all-kernels", action="store_true", default=False,
                     help="compile every instantiation of the NVRTC sweeps (test_gemm.py, "
                     "test_compile.py), not their fixed sample")


def pytest_configure(config):
    # Before collection imports the test modules, which sample at import.
    _sweep.ALL = bool(config.getoption("--all-kernels"))


def pytest_collection_modifyitems(config, items):
    if _arrays.has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none found (tsm_core.runtime.arrays.has_gpu())")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def tsm_cache_dir():
    """The session's cache folder (``TSM_CACHE_DIR``)."""
    os.environ["TSM_CACHE_DIR"] = _CACHE_DIR
    yield Path(_CACHE_DIR)


@pytest.fixture
def rng():
    """A seeded generator: the same data every run."""
    return np.random.default_rng(20240607)

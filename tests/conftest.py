"""Shared fixtures, the `gpu` marker (such tests are skipped where no GPU is found),
and a temporary cache folder: the suite never writes into the user's ~/.cache/tsm.

``TSM_CACHE_DIR`` is set here, when pytest loads this file and before any test
module imports tsm_core, to a folder made for this session (removed at its end);
subprocesses the tests start inherit it. The ``tsm_cache_dir`` fixture (autouse,
session-wide) keeps it set and hands tests its path.
"""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

_CACHE_DIR = tempfile.mkdtemp(prefix="tsm-tests-cache-")
os.environ["TSM_CACHE_DIR"] = _CACHE_DIR

from tsm_core.runtime import arrays as _arrays  # noqa: E402  (after TSM_CACHE_DIR is set)


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

"""Shared fixtures, and the `gpu` marker: such tests are skipped where no GPU is found."""

import numpy as np
import pytest

from tsm_core.runtime import arrays as _arrays


def pytest_collection_modifyitems(config, items):
    if _arrays.has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none found (tsm_core.runtime.arrays.has_gpu())")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A seeded generator: the same data every run."""
    return np.random.default_rng(20240607)

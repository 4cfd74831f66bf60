"""tsm_datasets.real (bundled with scikit-learn) and tsm_datasets.synthetic (seeded)."""

import numpy as np
import pytest

from tsm_datasets import real, synthetic


@pytest.mark.parametrize("name", real.names())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_loaders(name, dtype):
    X, y = real.load(name, dtype=dtype)
    assert X.dtype == dtype and X.flags.c_contiguous and X.ndim == 2
    assert y.shape == (X.shape[0],) and np.isfinite(X).all()
    assert len(np.unique(y)) >= 2


def test_real_rejects_unknown():
    with pytest.raises(ValueError, match="unknown data set"):
        real.load("mnist")
    with pytest.raises(TypeError):
        real.load("iris", dtype=np.int32)


def test_blobs_seeded_and_independent_of_threads():
    a = synthetic.blobs(200_001, 3, 5, seed=4, threads=1)
    b = synthetic.blobs(200_001, 3, 5, seed=4, threads=4)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    c = synthetic.blobs(200_001, 3, 5, seed=5, threads=2)[0]
    assert not np.array_equal(a[0], c)
    X, y, C = a
    # Points lie near their centre: spread 1, so within 6 sigma per coordinate.
    assert np.abs(X - C[y]).max() < 6.5
    assert 0 < (X != 0).mean()  # never zeros


def test_uniform():
    X = synthetic.uniform(1000, 7, seed=1, dtype=np.float64)
    assert X.dtype == np.float64 and X.min() >= 0 and X.max() < 1
    np.testing.assert_array_equal(X, synthetic.uniform(1000, 7, seed=1, dtype=np.float64))
    with pytest.raises(ValueError):
        synthetic.uniform(0, 3)


def test_package_import_is_light():
    import subprocess
    import sys

    code = "import sys, datasets; print(any(m in sys.modules for m in ('sklearn', 'cupy', 'torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_docstring_examples_run():
    import doctest

    from tsm_datasets import irregular

    for mod in (real, synthetic, irregular):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, mod.__name__

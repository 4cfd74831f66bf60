"""tsm_datasets.irregular: the paper's generator of irregular batches (no GPU needed)."""

import numpy as np
import pytest

from tsm_datasets import irregular as ir


def test_twelve_sets_and_batch_sizes():
    assert len(ir.RANGE_SETS) == 12 and len(set(ir.RANGE_SETS)) == 12
    assert ir.BATCH_SIZES == (8, 16, 32, 64, 128, 256)
    # The paper's example set and the anchors' four sets are in the grid.
    for s in ((512, 128), (128, 128), (512, 512), (1024, 256)):
        assert s in ir.RANGE_SETS
    assert len(ir.cells()) == 72


@pytest.mark.parametrize("mn, k", ir.RANGE_SETS)
def test_ranges_and_irregularity(mn, k):
    s = np.array(ir.irregular_shapes(mn, k, 256, seed=3))
    assert s.shape == (256, 3)
    assert s[:, :2].min() >= 16 and s[:, :2].max() <= mn
    assert s[:, 2].min() >= 16 and s[:, 2].max() <= k
    # Not restricted to powers of two (nor to multiples of 16): most sizes are odd
    # multiples of nothing in particular.
    pow2 = (s & (s - 1)) == 0
    assert pow2.mean() < 0.2
    assert (s % 16 != 0).mean() > 0.5


def test_seeded_and_independent_of_order():
    a = ir.irregular_shapes(256, 128, 32, seed=5)
    ir.irregular_shapes(1024, 512, 8, seed=5)  # drawing another cell first changes nothing
    assert a == ir.irregular_shapes(256, 128, 32, seed=5)
    assert a != ir.irregular_shapes(256, 128, 32, seed=6)
    # A cell's first problems do not depend on the batch size alone: different cells differ.
    assert ir.irregular_shapes(256, 128, 8, seed=5) != a[:8]


def test_batch_operands_signed_nonzero_and_ordered():
    shapes = ir.irregular_shapes(128, 128, 8, seed=0)
    As, Bs = ir.irregular_batch(shapes, dtype=np.float64, seed=1, order="F")
    for (m, n, k), A, B in zip(shapes, As, Bs):
        assert A.shape == (m, k) and B.shape == (k, n)
        assert A.flags.f_contiguous and B.flags.f_contiguous and A.dtype == np.float64
        assert (A < 0).any() and (A > 0).any() and np.all(A != 0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_mn"):
        ir.irregular_shapes(8, 128, 4)
    with pytest.raises(ValueError, match="batch"):
        ir.irregular_shapes(128, 128, -1)
    with pytest.raises(ValueError, match="order"):
        ir.irregular_batch([(2, 2, 2)], order="X")

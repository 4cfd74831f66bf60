"""CPU tests of the launchers' pure rules (no GPU): the split-K choice."""

import math

import pytest

from tsm_core._tsm2 import _choose_splits


@pytest.mark.parametrize("row_blocks, resident, k, kstep", [
    (1, 396, 65536, 8),      # one row block: split k as far as allowed
    (20, 396, 10240, 8),     # m = 10240, column-major float32
    (60, 396, 30720, 8),
    (960, 264, 30720, 128),  # already many waves: no split needed
    (7, 100, 300, 8),        # short k caps the split
])
def test_splits_fill_the_gpu_within_k(row_blocks, resident, k, kstep):
    s = _choose_splits(row_blocks, resident, k, kstep)
    most = max(1, min(64, k // (4 * kstep)))
    assert 1 <= s <= most                     # every split at least 4 k-steps deep
    if row_blocks * most >= 2 * resident:     # two waves are reachable: reached
        assert row_blocks * s >= 2 * resident
    else:                                     # not reachable: as many splits as allowed
        assert s == most


def test_splits_prefer_a_full_last_wave():
    # 960 blocks on 264 slots: 3.6 waves; 2 splits give 7.3 (eff 0.91), 4 give 14.5
    # (eff 0.97): the search takes the fuller last wave only when it is clearly fuller.
    s = _choose_splits(960, 264, 30720, 128)
    waves = 960 * s / 264
    assert waves / math.ceil(waves) >= 0.9

"""The runnable examples in the public docstrings (CPU: numpy inputs)."""

import doctest

import tsm_core.tsm2.api


def test_public_docstring_examples_run():
    result = doctest.testmod(tsm_core.tsm2.api, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0

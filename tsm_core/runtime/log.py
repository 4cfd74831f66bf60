"""Logging: one logger per package (``tsm_core``, ``tsm_apps``), no prints.

Library code calls ``get_logger(__name__)`` and logs; it never configures handlers
except that, where the application has configured none, messages at the level of
``$TSM_LOG`` (INFO by default for the one-time measurements a user should know
about) go to stderr, as they did before logging existed. Silence them with
``logging.getLogger("tsm_core").setLevel(logging.WARNING)`` or ``TSM_LOG=WARNING``;
redirect them by adding a handler of your own.

Examples
--------
>>> import logging
>>> from tsm_core.runtime.log import get_logger
>>> get_logger("tsm_core.tsm2.profile").name
'tsm_core.tsm2.profile'
"""

from __future__ import annotations

import logging
import sys

from tsm_core.runtime import config

_configured: set = set()


class _StderrHandler(logging.StreamHandler):
    """Writes to the sys.stderr of the moment (pytest's capture swaps it), and only
    while the application has no handler of its own: once it configures logging,
    records reach its handlers by propagation, once."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass

    def emit(self, record):
        if not logging.getLogger().handlers:
            super().emit(record)


def _root_of(name: str) -> str:
    return name.split(".", 1)[0]


def get_logger(name: str) -> logging.Logger:
    """The logger ``name``; its package's logger gets a stderr handler the first time,
    unless the application configured logging itself."""
    root = _root_of(name)
    if root not in _configured:
        _configured.add(root)
        top = logging.getLogger(root)
        if not top.handlers and not logging.getLogger().handlers:
            level = (config.text("TSM_LOG") or "INFO").upper()
            h = _StderrHandler()
            h.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            top.addHandler(h)
            top.setLevel(getattr(logging, level, logging.INFO))
    return logging.getLogger(name)

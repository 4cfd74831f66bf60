"""The one on-disk store of tsm's caches: JSON files under ``cache_dir()``, written
atomically and safely across processes.

A write takes an exclusive lock on a sidecar ``.lock`` file, re-reads the file,
merges the caller's change and replaces the file through a temporary in the same
directory (``os.replace``), so two processes that add different keys at once keep
both, and a reader never sees half a file. Where locking is unavailable (no
``fcntl``), writes stay atomic but the last one wins.

Examples
--------
>>> import tempfile
>>> from pathlib import Path
>>> from tsm_core.runtime.cache import JsonStore
>>> s = JsonStore(Path(tempfile.mkdtemp()) / "demo.json")
>>> _ = s.update({"a": 1}); _ = s.update({"b": 2})
>>> s.load()
{'a': 1, 'b': 2}
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from tsm_core.runtime import config

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None


def cache_dir() -> Path:
    """Where tsm keeps its on-disk caches: ``$TSM_CACHE_DIR`` or ``~/.cache/tsm``."""
    d = config.text("TSM_CACHE_DIR")
    return Path(d).expanduser() if d else Path.home() / ".cache" / "tsm"


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(str(path) + ".lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def write_json(path: Path, obj) -> None:
    """Replace ``path`` with ``obj`` as JSON, atomically (a reader sees the old file or
    the new one, never a part)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path, default=None):
    """``path`` parsed, or ``default`` where it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


class JsonStore:
    """A JSON object on disk that several processes update key by key.

    Parameters
    ----------
    path : pathlib.Path
        The file; its folder is made on the first write.
    """

    def __init__(self, path):
        self.path = Path(path)

    def load(self) -> dict:
        """The stored object (empty where there is none)."""
        d = read_json(self.path, {})
        return d if isinstance(d, dict) else {}

    def get(self, key, default=None):
        """One entry."""
        return self.load().get(key, default)

    def update(self, entries: dict) -> dict:
        """Merge ``entries`` into the file under the lock; returns the merged object."""
        with _locked(self.path):
            d = self.load()
            d.update(entries)
            write_json(self.path, d)
        return d

    def clear(self) -> None:
        """Remove the file."""
        with _locked(self.path), contextlib.suppress(FileNotFoundError):
            self.path.unlink()

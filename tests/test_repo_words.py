"""The repository speaks of the project, not of how it was built: no development-round
words (the word session, issue or round followed by a number or a range of numbers, as
in the examples below, which are assembled at run time) in any tracked text file.

Provenance is a date and a commit (docs/lab/, benchmarks/results/h100/README.md).
Ordinary uses of the words stay legal: "a session of torch.distributed", "issue slots
47% busy", "three rounds of 10-rep medians", "rounded to 128".
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A development-round word followed by a number, a "#" number, or a range of them, in
# any case. A number followed by "%" is a measurement ("issue slots 47%"), not a round.
ROUND_WORDS = re.compile(
    r"\b(?:sessions?|issues?|rounds?)\s+#?\d+(?:\s*(?:-|–|to|and)\s*#?\d+)?\b(?!\s*%)",
    re.IGNORECASE,
)

# Text that is not prose: lock files and the like would only add noise. Binary files
# are found by content (a NUL byte in the first 8 KiB), not by name.
SKIP_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".ico", ".so", ".whl", ".gz", ".zip"}


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True,
            check=True, timeout=60,
        ).stdout.strip()
        if Path(top).resolve() != ROOT:
            pytest.skip("the tests are not at the top of a git checkout")
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        pytest.skip("not a git checkout")
    files = [ROOT / name for name in out.decode("utf-8", "surrogateescape").split("\0") if name]
    if not files:
        pytest.skip("no tracked files (not a git checkout)")
    return files


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary or unreadable file."""
    if path.suffix.lower() in SKIP_SUFFIXES or not path.is_file():
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace")


def find_round_words(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) for every development-round word in `text`."""
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        hits.extend((lineno, m.group(0)) for m in ROUND_WORDS.finditer(line))
    return hits


@pytest.mark.parametrize(
    "text",
    # Joined here so that this file does not itself name development rounds.
    [" ".join(p) for p in (("session", "12"), ("Session", "12"), ("sessions", "5-7"),
                           ("Sessions", "14 to 19"), ("issue", "5"), ("issue", "#5"),
                           ("(issue", "5)"), ("issue", "5's figures"), ("round", "3"),
                           ("ROUND", "3"), ("written at the end of session", "22."))],
)
def test_pattern_catches_round_words(text):
    assert find_round_words(text), text


@pytest.mark.parametrize(
    "text",
    ["a session of torch.distributed", "the session's device time", "issue slots 47% busy",
     " ".join(("issue", "70 %")), "three rounds of 10-rep medians", "rounded to 128",
     "round-off bound", "an open issue", "sessions", "tissue 5", "around 3 ms"],
)
def test_pattern_leaves_ordinary_words(text):
    assert not find_round_words(text), text


def test_no_round_words_in_tracked_files():
    offenders = {}
    for path in _tracked_files():
        if path.resolve() == Path(__file__).resolve():
            continue  # this file's own examples of what the pattern catches
        text = _text(path)
        if text is None:
            continue
        hits = find_round_words(text)
        if hits:
            offenders[path.relative_to(ROOT).as_posix()] = hits
    if offenders:
        lines = [f"{name}: {len(hits)} (first at line {hits[0][0]}: {hits[0][1]!r})"
                 for name, hits in sorted(offenders.items())]
        pytest.fail("development-round words in tracked files (say what was measured and "
                    "when: a figure, a date, a commit):\n" + "\n".join(lines))

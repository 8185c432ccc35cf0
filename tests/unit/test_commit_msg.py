"""The commit-msg hook (.ci/commit_msg.py, run by pre-commit): a subject of at most 72 characters passes, a longer
one is refused in one line with a hint; git's comment lines and leading blank lines are not the subject."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.host import REPO

HOOK = REPO / ".ci" / "commit_msg.py"


def hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([sys.executable, str(HOOK), str(path)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "message",
    [
        "docs: " + "x" * 66,
        "# a comment git strips, longer than the limit " + "x" * 40 + "\n\nrun: short\n\nbody " + "y" * 200,
    ],
)
def test_a_subject_of_72_characters_or_fewer_passes(tmp_path: Path, message: str) -> None:
    r = hook(tmp_path, message)
    assert (r.returncode, r.stderr) == (0, "")


def test_a_longer_subject_is_refused_with_a_hint(tmp_path: Path) -> None:
    r = hook(tmp_path, "docs: " + "x" * 67 + "\n\nbody\n")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "73 characters, more than 72" in r.stderr and "HINT:" in r.stderr

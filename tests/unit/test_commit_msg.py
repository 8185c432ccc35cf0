"""The commit-msg hook (.ci/commit_msg.py, run by pre-commit): a subject of at most 72 characters passes, a longer
one is refused in one line with a hint; git's comment lines and leading blank lines are not the subject. CI's
check of every commit after a base (`--since REV`, `make commit-subjects`) names each long one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.host import REPO

HOOK = REPO / ".ci" / "commit_msg.py"
SUBJECTS_SINCE = re.search(r"^SUBJECTS_SINCE := (\S+)", (REPO / "Makefile").read_text(), re.M).group(1)  # type: ignore[union-attr]


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


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "HOME": str(repo), "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def since(repo: Path, base: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HOOK), "--since", base], cwd=repo, capture_output=True, text=True, timeout=30
    )


def test_ci_names_each_commit_after_the_base_whose_subject_is_long(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "old: " + "x" * 80)  # before the base: history, kept
    base = git(tmp_path, "rev-parse", "HEAD")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "docs: " + "x" * 66 + "\n\nbody " + "y" * 100)
    assert (since(tmp_path, base).returncode, since(tmp_path, base).stderr) == (0, "")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "run: " + "z" * 68)
    long = git(tmp_path, "rev-parse", "--short", "HEAD")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "ok: short")
    r = since(tmp_path, base)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"commit-msg: {long}'s subject is 73 characters, more than 72") and "HINT:" in r.stderr


def test_ci_without_the_base_says_why_in_one_line(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "one")
    r = since(tmp_path, "00f6b3b")
    assert r.returncode == 64 and r.stderr.count("\n") == 1 and "cannot list the commits after 00f6b3b" in r.stderr


def test_this_branch_passes_the_check_ci_makes() -> None:
    """What `make commit-subjects` checks, on this checkout (a clone without the base, shallow, skips)."""
    if (
        not (REPO / ".git").exists()
        or subprocess.run(
            ["git", "cat-file", "-e", f"{SUBJECTS_SINCE}^{{commit}}"], cwd=REPO, capture_output=True
        ).returncode
    ):
        pytest.skip(f"no git history holding {SUBJECTS_SINCE} here")
    r = since(REPO, SUBJECTS_SINCE)
    assert (r.returncode, r.stderr) == (0, "")

"""A commit's subject (its first line) is at most 72 characters, so that `git log --oneline`, shortlogs and
e-mailed patches show it whole. pre-commit runs this as the commit-msg hook (.pre-commit-config.yaml); by hand:
`python3 .ci/commit_msg.py FILE` (the message, as git writes it to .git/COMMIT_EDITMSG). CI checks every commit
after a base (`python3 .ci/commit_msg.py --since REV`, `make commit-subjects`): a commit the hook never saw (a
clone without pre-commit, a merge) fails CI, one line per commit."""

from __future__ import annotations

import subprocess
import sys

LIMIT = 72


def subject(message: str) -> str:
    """The first line that is neither blank nor a comment git strips (`#`)."""
    return next((line.rstrip() for line in message.splitlines() if line.strip() and not line.startswith("#")), "")


def _shallow() -> bool:
    probe = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    return probe.stdout.strip() == "true"


def since(base: str) -> int:
    """Every commit reachable from HEAD and not from `base`, merges too: one line for each long subject."""
    span = f"{base}..HEAD"
    if _shallow() and subprocess.run(["git", "cat-file", "-e", f"{base}^{{commit}}"], capture_output=True).returncode:
        # A shallow clone cut after `base`: every commit it holds came after it.
        print(f"commit-msg: a shallow clone without {base}: checking the commits it holds", file=sys.stderr)
        span = "HEAD"
    log = subprocess.run(
        ["git", "log", "--format=%h%x00%B%x01", span], capture_output=True, text=True, encoding="utf-8"
    )
    if log.returncode != 0:
        why = (log.stderr.strip().splitlines() or [f"git log exited {log.returncode}"])[0]
        print(
            f"commit-msg: cannot list the commits after {base}: {why}. HINT: run it in a full clone (not a shallow "
            "one) that holds that commit",
            file=sys.stderr,
        )
        return 64
    rc = 0
    for entry in log.stdout.split("\x01"):
        if "\x00" not in entry:
            continue
        commit, message = entry.strip("\n").split("\x00", 1)
        first = subject(message)
        if len(first) > LIMIT:
            print(
                f"commit-msg: {commit}'s subject is {len(first)} characters, more than {LIMIT}: {first!r}. HINT: "
                "reword it (git rebase -i) before it is merged",
                file=sys.stderr,
            )
            rc = 1
    return rc


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--since":
        return since(argv[2])
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: commit_msg.py FILE | commit_msg.py --since REV", file=sys.stderr)
        return 64
    with open(argv[1], encoding="utf-8") as f:
        first = subject(f.read())
    if len(first) > LIMIT:
        print(
            f"commit-msg: the subject is {len(first)} characters, more than {LIMIT}: {first!r}. HINT: say the rest in "
            "the body, after a blank line",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

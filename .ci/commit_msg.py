"""A commit's subject (its first line) is at most 72 characters, so that `git log --oneline`, shortlogs and
e-mailed patches show it whole. pre-commit runs this as the commit-msg hook (.pre-commit-config.yaml); by hand:
`python3 .ci/commit_msg.py FILE` (the message, as git writes it to .git/COMMIT_EDITMSG)."""

from __future__ import annotations

import sys

LIMIT = 72


def subject(message: str) -> str:
    """The first line that is neither blank nor a comment git strips (`#`)."""
    return next((line.rstrip() for line in message.splitlines() if line.strip() and not line.startswith("#")), "")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: commit_msg.py FILE", file=sys.stderr)
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

"""`hostagent policy check [FILE]`: validate a policy file before the agent reads it (docs/policy.md)."""

from __future__ import annotations

import argparse
import json
import sys

from gpupin.hostagent.policy import DEFAULT_PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DESCRIPTION = """The host's policy: bookings with a limit, quotas per user and group, idle rules and notification
hooks, in one TOML file that the resident agent reads at start and again on SIGHUP (docs/policy.md)."""

CHECK_DESCRIPTION = f"""Validate a policy file: every mistake on a line of its own, `FILE:LINE: KEY: what is wrong`
(an unknown key, a duration such as "4 hours", a user or group this host does not have...), or one line saying what
the policy enforces. Check before `systemctl reload gpupin-hostagent`: an agent given a file with mistakes keeps the
policy it had, and says so. FILE defaults to {DEFAULT_PATH}."""

CHECK_EPILOG = """exit: 0 a good policy; 64 mistakes found (one line each on stderr), or the file cannot be read."""


def add(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "policy",
        help="check the host's policy file (bookings, quotas, idle rules, hooks)",
        description=DESCRIPTION,
    )
    verbs = p.add_subparsers(dest="policy_command", metavar="VERB", required=True)
    check = verbs.add_parser(
        "check",
        help="validate a policy file, one line per mistake",
        description=CHECK_DESCRIPTION,
        epilog=CHECK_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("file", nargs="?", default=DEFAULT_PATH, metavar="FILE", help=f"default {DEFAULT_PATH}")
    check.add_argument(
        "--json",
        action="store_true",
        help="one object on stdout: file, ok, mistakes (a list of lines), policy (the parsed policy, when ok)",
    )


def command(args: argparse.Namespace) -> int:
    from gpupin.core.errors import EX_USAGE, UsageError, printable
    from gpupin.hostagent import PROG
    from gpupin.hostagent.policy import PolicyError, load_policy

    path: str = args.file
    try:
        policy = load_policy(path)
        mistakes: list[str] = []
    except PolicyError as err:
        mistakes = err.mistakes
    except UsageError as err:  # the file cannot be read
        mistakes = [err.message]
    if args.json:
        out = {"file": path, "ok": not mistakes, "mistakes": mistakes, "policy": None if mistakes else policy.as_json()}
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return EX_USAGE if mistakes else 0
    if mistakes:
        sys.stderr.write("".join(f"{PROG} policy: ERROR: {m}\n" for m in mistakes))
        n = len(mistakes)
        sys.stderr.write(f"{PROG} policy: {n} mistake{'s' if n != 1 else ''} in {printable(path)}\n")
        return EX_USAGE
    sys.stdout.write(f"policy: OK {printable(path)}: {policy.summary()}\n")
    return 0

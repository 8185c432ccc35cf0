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
(an unknown key, a duration such as "4 hours"...), or one line saying what the policy enforces. A user or group this
host does not have is a warning (its rule limits no one), never a mistake. Check before `systemctl reload
gpupin-hostagent`: an agent given a file with mistakes keeps the policy it had (at start, the last good one it
saved), and says so. FILE defaults to {DEFAULT_PATH}."""

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
    check.add_argument("file", nargs="?", metavar="FILE", help=f"default {DEFAULT_PATH} (or GPUPIN_POLICY)")
    check.add_argument(
        "--json",
        action="store_true",
        help="one object on stdout: file, ok, mistakes (a list of lines), policy (the parsed policy, when ok)",
    )


def command(args: argparse.Namespace) -> int:
    from gpupin.core.errors import EX_USAGE, UsageError, printable
    from gpupin.hostagent import PROG
    from gpupin.hostagent.policy import PolicyError, load_policy, policy_path

    path: str = args.file or policy_path()
    try:
        policy = load_policy(path)
        mistakes: list[str] = []
    except PolicyError as err:
        mistakes = err.mistakes
    except UsageError as err:  # the file cannot be read
        mistakes = [err.message]
    warnings = list(policy.warnings) if not mistakes else []
    if args.json:
        out = {
            "file": path,
            "ok": not mistakes,
            "mistakes": mistakes,
            "warnings": warnings,
            "policy": None if mistakes else policy.as_json(),
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return EX_USAGE if mistakes else 0
    if mistakes:
        sys.stderr.write("".join(f"{PROG} policy: ERROR: {m}\n" for m in mistakes))
        n = len(mistakes)
        sys.stderr.write(f"{PROG} policy: {n} mistake{'s' if n != 1 else ''} in {printable(path)}\n")
        return EX_USAGE
    sys.stderr.write("".join(f"{PROG} policy: warning: {w}\n" for w in warnings))
    sys.stdout.write(f"policy: OK {printable(path)}: {policy.summary()}\n")
    return 0


EXTEND_DESCRIPTION = """Extend a booking (`hostagent run --for`, or the policy's default) by DURATION (30m, 2h, 1d),
through the resident agent, which keeps the end and stops the container when it comes. Only the container's owner (the
user who booked it, as the agent's socket names the caller) or root may extend it, and only within the policy's
longest booking for the caller (booking.max: the whole booking, from its start, counts). A booking that already
ended is extended from now."""

EXTEND_EPILOG = """exit: 0 extended (the new end on stdout); 64 bad usage, not the owner, no such container, no end to
extend, or past the policy's maximum; 69 no agent answers (GPUPIN_AGENT_SOCKET, else /run/gpupin/hostagent.sock)."""


def add_extend(sub: argparse._SubParsersAction[Any]) -> None:
    e = sub.add_parser(
        "extend",
        help="extend a booking by DURATION (its owner or root, within the policy)",
        description=EXTEND_DESCRIPTION,
        epilog=EXTEND_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("container", metavar="CONTAINER", help="its name or id, as hostagent ls shows it")
    e.add_argument("duration", metavar="DURATION", type=_duration, help="how much longer: 30m, 2h, 1d")
    e.add_argument("--json", action="store_true", help="the agent's answer on stdout: id, name, until, left_s")


def _duration(text: str) -> float:
    from gpupin.hostagent.policy import parse_duration

    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def extend(args: argparse.Namespace) -> int:
    import time

    from gpupin.core.errors import AgentUnavailableError, shown
    from gpupin.hostagent import agentlink
    from gpupin.hostagent.policy import format_duration

    link = agentlink.find()
    if link is None:
        raise AgentUnavailableError(
            f"no resident agent answers at unix://{agentlink.socket_path()}: bookings are kept by the agent",
            "start it (systemctl start gpupin-hostagent), or set GPUPIN_AGENT_SOCKET",
        )
    got = link.call("POST", "/api/extend", {"container": args.container, "seconds": args.duration})
    if args.json:
        sys.stdout.write(json.dumps(got) + "\n")
        return 0
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(got["until"]))
    sys.stdout.write(f"{shown(got['name'])}: booked until {at} (ends in {format_duration(got['left_s'])})\n")
    return 0

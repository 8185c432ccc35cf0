"""`hostagent ls`'s command line: its parser, its help, and the command it runs (the listing, or --swarm's)."""

from __future__ import annotations

import argparse

from gpupin.core.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DESCRIPTION = """List every physical card (NVML) and the containers that hold it (the ledger).

Per card: its index, name, temperature, utilization, memory and power (N/A: the card does not report it), its
UUID and bus id, its MIG devices, the containers that hold it (short id, state, how the engine gives it the card,
`shared` for --share, MISMATCH where the gpupin.devices label says otherwise) and the processes on it (pid, user,
memory, command, container). A card is free, held, or shared: held only by containers started with --share, which
`hostagent run --share` may join. A card is UNHEALTHY, with the reason under it, on a critical XID, volatile
uncorrectable ECC errors, page retirement or row remapping pending or failed, or when NVML has lost it; `run` never
takes it. XIDs are NVML events: ls sees those that arrive while it reads the cards (the host's dmesg keeps older
ones)."""

EPILOG = """When Docker cannot be reached the cards are still listed (holders unknown) and stderr says why.
exit: 0 listed; 64 bad usage; 69 NVML unavailable.

--format fields (str.format: {index}, {name:<24}; N/A when missing; lists joined by commas):
"""


def _interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r}") from None
    if not (0.1 <= seconds <= 86400):
        raise argparse.ArgumentTypeError(f"seconds must be between 0.1 and 86400, not {text}")
    return seconds


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`ls` among hostagent's commands."""
    # The fields' table loads with the parser only: `ls --json` builds none (hostagent.cli's fast path).
    from gpupin.hostagent.ls import template

    ls = sub.add_parser(
        "ls",
        help="list the cards, their load, and who holds them",
        description=DESCRIPTION,
        epilog=EPILOG + template.fields_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ls.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on stdout, for scripts: the host, and per card every field below and "
        "more (holders, MIG devices, processes in full)",
    )
    ls.add_argument("--format", metavar="TEMPLATE", help=template.HELP)
    ls.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="colour the table: auto (default) when stdout is a terminal, NO_COLOR is unset and TERM "
        "is not dumb; always; never",
    )
    ls.add_argument(
        "-w",
        "--watch",
        type=_interval,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="redraw the table in place every SECONDS (default 2) until Ctrl-C",
    )
    ls.add_argument(
        "--swarm",
        action="store_true",
        help="every node of the swarm (from a manager): each card, "
        "the task that holds it, the free ones, and the tasks waiting for cards (with --json or alone)",
    )
    ls.add_argument(
        "--host",
        action="append",
        metavar="URL",
        help="read a resident agent's view instead "
        "(http://HOST:PORT, HOST:PORT or unix://SOCKET; `hostagent serve`); several: one table, the "
        "host in each row (--json: a list)",
    )


def fast(raw: list[str]) -> argparse.Namespace | None:
    """`hostagent ls [--json] [--swarm] [--debug]` without building the parser: argparse and its help formatter cost
    ~5 ms, 5% of what listing 500 containers takes (a benchmarked figure). Anything else goes through argparse."""
    if not raw or raw[0] != "ls" or not set(raw[1:]) <= {"--json", "--swarm", "--debug"}:
        return None
    return argparse.Namespace(
        command="ls",
        json="--json" in raw,
        swarm="--swarm" in raw,
        debug="--debug" in raw,
        format=None,
        color="auto",
        watch=None,
        host=None,
    )


def command(args: argparse.Namespace) -> int:
    if args.host:
        if args.swarm or args.format is not None or args.watch is not None:
            raise UsageError(
                "ls --host takes --json and --color only (not --swarm, --format or --watch)",
                "hostagent ls --host URL [--host URL ...] [--json]",
            )
        from gpupin.hostagent.ls import hosts

        return hosts.command(args.host, args.json, args.color)
    if getattr(args, "swarm", False):
        if args.format is not None or args.watch is not None:
            raise UsageError("ls --swarm takes --json only (not --format or --watch)", "hostagent ls --swarm [--json]")
        from gpupin.hostagent.swarm import ls as swarmls

        return swarmls.command(args.json)
    from gpupin.hostagent.ls import listing

    return listing.command(args.json, args.format, args.color, args.watch)

"""`hostagent compose`'s command line: the parsers and help of `render` and `check`, and the commands they run
(hostagent.compose.command, loaded only when one runs)."""

from __future__ import annotations

import argparse

from gpupin.core.errors import UsageError
from gpupin.hostagent.completion import DIRS, FILES, offer
from gpupin.hostagent.engine.cdi import VIAS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.hostagent.compose.project import ProjectOptions


RENDER_DESCRIPTION = """\
Write the project (FILE, or -f files as docker compose takes them: default compose.yaml with its
override file) as a standard compose file in which every service that asks for GPUs (x-gpupin, a deploy
device request of the nvidia or the cdi driver, CDI names in devices:, gpus:, or runtime: nvidia with
NVIDIA_VISIBLE_DEVICES) is pinned to physical cards by UUID: the device request (driver: cdi where the
daemon serves the cards by CDI, else driver: nvidia with NVIDIA_VISIBLE_DEVICES; --via decides instead),
GPUPIN_EXPECT (proved inside the container by gpupin-entrypoint) and the ledger labels. Counts go
to the best free cards; cards that running containers hold are not given, unless shared. A problem
the rendered file would still have is refused, one line each, and nothing is written: the same lines
`hostagent compose check` prints."""
RENDER_EPILOG = """\
One plain file is edited in place of its GPU keys only: comments, quoting, anchors, merge keys, block
scalars and ${VAR} stay as written. A project of several parts (several -f, an override file, include,
extends, !reset/!override, profiles that leave services out) is written as one merged, self-contained
file that `docker compose -f OUT up` runs alone: compose v2's own `config` where it is installed
(GPUPIN_COMPOSE=none: hostagent's reading of compose's rules), variables substituted.

-o OUT is written all at once (a temporary file beside it, then renamed over it); OUT may not be a
directory or one of the source files. Without -o (or with -o -) the file goes to stdout.

--swarm writes a Docker Swarm stack instead (docker stack deploy -c OUT STACK): Swarm, not render, picks
the cards when it places each task, so each service that asks for `count: N` (x-gpupin, or a deploy
device request) reserves N generic resources of KIND (--kind, default GPU) per task, as
`hostagent swarm node-config` makes the nodes advertise them; replicas each get cards of their own, and
each task gets GPUPIN_REQUIRE=1 (gpupin-entrypoint proves DOCKER_RESOURCE_<KIND>). Refused: cards named
or `all` (a task reserves a number, never named cards), share: true, and, when DOCKER_HOST is a swarm
manager, a KIND no node advertises or more cards per task than any node it may run on has. No NVML is
needed.

exit: 0 written; 64 a malformed file, a request this host (or swarm) cannot meet, or a bad -o; 69 NVML
unusable; 75 running containers hold the cards it needs (they are named)."""
CHECK_DESCRIPTION = """\
Report what would land a job on the wrong card or double-book one, as docker compose would run the
project (FILE, or -f files with the override file, include, extends, profiles and .env as compose reads
them): an index, a count on the first cards, a UUID prefix the runtime refuses; and as render would pin
it: unknown or ambiguous cards, a card given twice, replicas, hand-set pin variables that disagree.
One line per problem: FILE: service NAME: what. HINT: what to do."""
CHECK_EPILOG = """\
--json prints a list of {service, problem, hint, severity, render_fixes}; render_fixes marks a
problem of the file as written that `hostagent compose render` removes.

exit: 0 no error (warnings may be printed); 64 an error; 69 NVML unusable."""


def add_project_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The project's files and what compose reads with them, spelt as `docker compose` spells them."""
    offer(
        parser.add_argument("file", metavar="FILE", nargs="?", help=f"the compose file to {what} (as -f FILE)"), FILES
    )
    offer(
        parser.add_argument(
            "-f",
            "--file",
            dest="files",
            metavar="FILE",
            action="append",
            default=[],
            help="a compose file; several are merged in order, as docker compose -f does "
            "(default: compose.yaml or docker-compose.yml here, with its override file)",
        ),
        FILES,
    )
    parser.add_argument(
        "--profile",
        dest="profiles",
        metavar="NAME",
        action="append",
        default=[],
        help="a profile to enable (several allowed; COMPOSE_PROFILES too)",
    )
    offer(
        parser.add_argument(
            "--env-file",
            dest="env_files",
            metavar="PATH",
            action="append",
            default=[],
            help="the variables file (default: .env in the project directory)",
        ),
        FILES,
    )
    offer(
        parser.add_argument(
            "--project-directory", metavar="DIR", help="the project directory (default: the first file's directory)"
        ),
        DIRS,
    )


def project_options(args: argparse.Namespace) -> ProjectOptions:
    """The project as the command line gives it (FILE first, then each -f)."""
    from gpupin.hostagent.compose.project import ProjectOptions

    files = ([args.file] if args.file else []) + list(args.files)
    return ProjectOptions(files, args.project_directory, args.env_files, args.profiles)


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`compose` and its subcommands among hostagent's commands."""
    c = sub.add_parser(
        "compose",
        help="pin compose services to physical GPUs",
        description="Render or check compose files whose services ask for physical GPUs.",
    )
    csub = c.add_subparsers(dest="compose_command", metavar="SUBCOMMAND")
    raw = argparse.RawDescriptionHelpFormatter
    cr = csub.add_parser(
        "render",
        help="write a standard compose file with every GPU pinned by UUID",
        description=RENDER_DESCRIPTION,
        epilog=RENDER_EPILOG,
        formatter_class=raw,
    )
    add_project_arguments(cr, "render (it is never overwritten)")
    offer(cr.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout"), FILES)
    cr.add_argument(
        "--swarm",
        action="store_true",
        help="write a Docker Swarm stack: each task reserves its cards as generic resources (see below)",
    )
    cr.add_argument(
        "--kind",
        metavar="KIND",
        help="with --swarm: the generic resource kind to reserve (default GPU, "
        "as `hostagent swarm node-config` advertises)",
    )
    cr.add_argument(
        "--via",
        choices=list(VIAS),
        help="pin through CDI (driver: cdi) or the nvidia driver (driver: "
        "nvidia); default: CDI where the daemon serves the cards by CDI",
    )
    cc = csub.add_parser(
        "check",
        help="find unknown, double-booked or index-pinned GPUs",
        description=CHECK_DESCRIPTION,
        epilog=CHECK_EPILOG,
        formatter_class=raw,
    )
    add_project_arguments(cc, "check")
    cc.add_argument("--json", action="store_true", help="the problems as a JSON list")


def command(args: argparse.Namespace) -> int:
    if args.compose_command == "render":
        if args.kind is not None and not args.swarm:
            raise UsageError(
                "--kind goes with --swarm",
                "a plain render pins cards by UUID; a --swarm render reserves generic resources of KIND",
            )
        if args.via is not None and args.swarm:
            raise UsageError(
                "--via goes without --swarm",
                "a --swarm render reserves generic resources; the nodes' runtime decides how the cards reach the task",
            )
        from gpupin.hostagent.compose import command

        if args.swarm:
            from gpupin.hostagent.swarm.resources import DEFAULT_KIND

            return command.stack_command(project_options(args), args.output, args.kind or DEFAULT_KIND)
        return command.render_command(project_options(args), args.output, args.via)
    if args.compose_command == "check":
        from gpupin.hostagent.compose.command import check_command

        return check_command(project_options(args), args.json)
    raise UsageError("hostagent compose needs a subcommand", "hostagent compose render FILE | check FILE")

"""`hostagent compose render|check`: compose services pinned to physical GPUs by UUID, and the files that are not.

A service asks for cards with the extension key `x-gpupin` (the compose spec lets `x-` keys be anywhere):

    x-gpupin:
      gpus: [GPU-95c6, 3]     # any `hostagent run --gpu` SPEC; list order = local-rank order (cuda:0 first)
      # or: count: 2          # N free cards, best first (most free memory, least load)
      share: true             # optional: may share its cards with other services or running pinned containers
      verify: cuda            # optional: GPUPIN_VERIFY for the entrypoint (nvml, cuda, torch)

or in any form docker compose takes: `deploy.resources.reservations.devices` (`driver: nvidia` with `device_ids`
or `count`, or `driver: cdi` with `nvidia.com/gpu=...` names), CDI names in `devices:` and the service-level
`gpus:` (compose v2.30+), or the legacy `runtime: nvidia` with NVIDIA_VISIBLE_DEVICES. `render` resolves every
request against this host's cards (NVML) and the ledger (running containers) and writes a plain compose file
pinned by UUID (hostagent.pin: through CDI where the daemon serves the cards so, else the nvidia driver); `check`
reports what would land a job on the wrong card or double-book one. Both run the same rules.

The modules, in the order a file goes through them:
    model     which model the commands read (project's, or compose v2's own), and what render writes
    project   the project as compose builds it: -f files, the override file, include, extends, profiles,
              !reset/!override; native asks compose v2 (`docker compose config`) for the same model
    interpolate  .env files and ${VAR} in every value
    load      bytes -> text -> YAML -> a plain tree, with the limits (size, depth, aliases, duplicate keys)
    request   what one service asks for: one reader per form (x-gpupin, deploy devices, CDI, gpus:, runtime)
    rules     every check, each written once; `examine` runs them all (and placement) for both commands
    place     the booking rule and the placement of counts on free cards
    render    the rules + placement + the pin, written into a copy of the document
    roundtrip the source text edited where the pin changed the document, and nowhere else (ruamel.yaml)
    stack     `render --swarm`: the same requests as Swarm reservations (Swarm places; render only reserves)
    command   the two CLI adapters: NVML, the ledger, `-o`
    problems  the one Problem type both commands print, one line each

Exit codes (docs/exit-codes.md): 64 a malformed file or a request that cannot mean one card (unknown, ambiguous, a card
given to two services, more cards than the host has, replicas > 1, hand-set pin variables), or a bad `-o`; 75 a
render that cannot place a service only because running containers hold the cards it needs (they are named); 69
NVML unusable. `check` exits 64 when it finds an error, else 0 (warnings alone do not fail it).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from gpupin.hostagent.compose.project import Options

# The --help texts (hostagent.cli builds its parser with them; importing this package loads nothing else).
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
    parser.add_argument("file", metavar="FILE", nargs="?", help=f"the compose file to {what} (as -f FILE)")
    parser.add_argument("-f", "--file", dest="files", metavar="FILE", action="append", default=[],
                        help="a compose file; several are merged in order, as docker compose -f does (default: "
                        "compose.yaml or docker-compose.yml here, with its override file)")
    parser.add_argument("--profile", dest="profiles", metavar="NAME", action="append", default=[],
                        help="a profile to enable (several allowed; COMPOSE_PROFILES too)")
    parser.add_argument("--env-file", dest="env_files", metavar="PATH", action="append", default=[],
                        help="the variables file (default: .env in the project directory)")
    parser.add_argument("--project-directory", metavar="DIR",
                        help="the project directory (default: the first file's directory)")


def project_options(args: argparse.Namespace) -> Options:
    from gpupin.hostagent.compose.project import Options

    files = ([args.file] if args.file else []) + list(args.files)
    return Options(files, args.project_directory, args.env_files, args.profiles)


def render_command(options: Options, output: str | None, swarm: bool = False, kind: str | None = None,
                   via: str | None = None) -> int:
    from gpupin.hostagent.compose import command

    if swarm:
        from gpupin.hostagent.swarm.cluster import DEFAULT_KIND

        return command.stack_command(options, output, kind or DEFAULT_KIND)
    return command.render_command(options, output, via)


def check_command(options: Options, as_json: bool) -> int:
    from gpupin.hostagent.compose.command import check_command

    return check_command(options, as_json)

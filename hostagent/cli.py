"""`hostagent`: pin containers to physical GPUs through the Docker Engine, and never double-book a card.

Results go to stdout, diagnostics to stderr as `hostagent: ERROR: ... HINT: ...` (a traceback only with --debug);
each kind of failure has its exit code (DESIGN.md): 64 bad request, 69 NVML or Docker unavailable, 75 the card is
held, 125 Docker refused the container; `run` otherwise returns the container's own exit code.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from gpupin.entrypoint.errors import EX_USAGE, GpupinError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn

PROG = "hostagent"

RUN_EPILOG = """GPU specs (--gpu): a UUID (GPU-1c5e8f3a-...), a unique UUID prefix (GPU-1c5e), a MIG UUID, an NVML
index as nvidia-smi shows it (2), or a PCI bus id in any form (3b:00.0, 0000:3B:00.0). Several --uuid/--gpu
options give several cards, in local-rank order: the first is cuda:0 in the container.

The container gets --gpus device=UUID..., NVIDIA_VISIBLE_DEVICES, GPUPIN_EXPECT=UUID@BUSID,... (which an image
whose ENTRYPOINT is gpupin-entrypoint verifies) and the ledger label gpupin.devices.

exit: the container's exit code; 64 bad request; 69 NVML or Docker unavailable; 75 the card is held (no --wait);
125 Docker refused the container; 126/127 the command cannot be run or was not found (as docker run).
"""


def _wait_value(text: str) -> float:
    return math.inf if text in ("", "inf", "forever") else float(text)


def _normalise_wait(argv: list[str]) -> list[str]:
    """`--wait` takes an optional number of seconds; a bare `--wait` must not swallow the IMAGE after it."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        if a == "--wait":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            try:
                float(nxt or "x")
                out.append(f"--wait={nxt}")
                i += 2
                continue
            except ValueError:
                out.append("--wait=inf")
                i += 1
                continue
        out.append(a)
        i += 1
    return out


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one `ERROR: ... HINT: ...` line and exit 64, like every other refusal."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: ERROR: {message}. HINT: see `{self.prog} --help`\n")
        sys.exit(EX_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--debug", action="store_true", help="print a traceback with an error")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ls = sub.add_parser("ls", help="list the cards, their memory and load, and who holds them",
                        description="List every physical card (NVML) and the containers that hold it (the ledger).")
    ls.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")

    r = sub.add_parser("run", help="start a container pinned to physical GPUs",
                       usage="hostagent run [options] (--uuid UUID | --gpu SPEC ... | --count N) IMAGE [CMD...]",
                       description="Start a container pinned to physical GPUs, as `docker run` would.",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = r.add_argument_group("which GPUs")
    g.add_argument("--uuid", dest="gpus", action="append", metavar="UUID", default=[], help="a card by UUID")
    g.add_argument("--gpu", dest="gpus", action="append", metavar="SPEC", default=[],
                   help="a card by UUID, prefix, index or bus id")
    g.add_argument("--count", type=int, metavar="N",
                   help="N cards no one holds: the most free memory first, then the least utilization")
    g.add_argument("--share", action="store_true", help="allow cards another pinned container holds")
    g.add_argument("--wait", type=_wait_value, metavar="SECONDS", nargs="?", const=math.inf,
                   help="wait for held cards (forever, or at most SECONDS) instead of exiting 75")
    g.add_argument("--verify", choices=["nvml", "cuda", "torch"], help="GPUPIN_VERIFY for the entrypoint")
    d = r.add_argument_group("as docker run")
    d.add_argument("--name")
    d.add_argument("-e", "--env", action="append", default=[], metavar="KEY[=VALUE]")
    d.add_argument("--env-file", action="append", default=[], metavar="FILE")
    d.add_argument("-v", "--volume", action="append", default=[], metavar="SRC:DST[:OPTS]")
    d.add_argument("--rm", action="store_true", help="remove the container when it exits")
    d.add_argument("-d", "--detach", action="store_true", help="print the container id and return")
    d.add_argument("-w", "--workdir")
    d.add_argument("-u", "--user")
    d.add_argument("--shm-size")
    d.add_argument("--ipc")
    d.add_argument("--network")
    d.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    d.add_argument("--entrypoint")
    d.add_argument("--pull", choices=["missing", "never"], default="missing",
                   help="pull a missing image (default) or refuse")
    d.add_argument("--stop-timeout", type=int, default=10, metavar="SECONDS",
                   help="grace period when Ctrl-C/SIGTERM stops the container (default 10)")
    o = r.add_argument_group("output")
    o.add_argument("--dry-run", action="store_true", help="print the equivalent docker run command; create nothing")
    o.add_argument("--json", action="store_true", help="with --dry-run: the create payload as JSON")
    r.add_argument("image", metavar="IMAGE")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")

    c = sub.add_parser("compose", help="pin compose services to physical GPUs",
                       description="Render or check compose files whose services ask for physical GPUs.")
    csub = c.add_subparsers(dest="compose_command", metavar="SUBCOMMAND")
    cr = csub.add_parser("render", help="write a standard compose file with every GPU pinned by UUID")
    cr.add_argument("file", metavar="FILE")
    cr.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    cc = csub.add_parser("check", help="find unknown, double-booked or index-pinned GPUs")
    cc.add_argument("file", metavar="FILE")
    cc.add_argument("--json", action="store_true", help="the problems as a JSON list")

    s = sub.add_parser("swarm", help="GPU nodes of a Docker Swarm",
                       description="Configure and check the GPU nodes of a Docker Swarm.")
    ssub = s.add_subparsers(dest="swarm_command", metavar="SUBCOMMAND")
    from gpupin.hostagent import swarm as sw  # constants; a light module (no NVML, no docker SDK)

    sn = ssub.add_parser("node-config", help="the generic resources and runtime settings of this node (--check: "
                         "diagnose them)", description="What this GPU node must advertise to Docker Swarm, and "
                         "the runtime settings that make it effective; or, with --check, what is wrong with them.",
                         epilog=NODE_CONFIG_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sn.add_argument("--kind", metavar="KIND", help="the generic resource kind services ask for (default GPU; "
                    "with --check: the kind the node advertises)")
    sn.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    sn.add_argument("--check", action="store_true", help="diagnose this node's daemon.json and toolkit config")
    sn.add_argument("--daemon-json", default=sw.DAEMON_JSON, metavar="PATH",
                    help=f"dockerd's configuration (default {sw.DAEMON_JSON})")
    sn.add_argument("--toolkit-config", default=sw.TOOLKIT_CONFIG, metavar="PATH",
                    help=f"the NVIDIA Container Toolkit's configuration (default {sw.TOOLKIT_CONFIG})")
    sn.add_argument("--runtime-path", metavar="PATH", help=f"the nvidia runtime's path to print in daemon.json "
                    f"(default {sw.RUNTIME_PATH}, as nvidia-ctk writes it)")
    return p


NODE_CONFIG_EPILOG = """Without --check: this host's cards (NVML; the MIG devices of a card in MIG mode) as Swarm
generic resources, and the runtime settings that make them effective:
  daemon.json   node-generic-resources: ["GPU=GPU-<uuid>", ...], default-runtime: nvidia
  config.toml   swarm-resource = "DOCKER_RESOURCE_GPU"   (the NVIDIA Container Toolkit's)
Services then ask `docker service create --generic-resource GPU=1`, and each task gets its own card as
DOCKER_RESOURCE_GPU=<uuid>, which gpupin-entrypoint verifies.

--check reads the node's files and prints one line per problem: a kind the runtime does not read (the
NVIDIA-GPU trap: every task sees every card), swarm-resource unset, UUIDs that are not on this host or are
listed twice, counts or indices instead of UUIDs, a MIG-mode card advertised whole, cards not advertised
(a warning), a default runtime that is not nvidia.

exit: 0 printed, or a check without errors; 64 bad usage, or a check that found errors; 69 NVML unavailable.
"""


def _error(err: GpupinError, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(err.line(PROG))
    return err.exit_code


def _cmd_ls(args: argparse.Namespace) -> int:
    from gpupin.hostagent import listing

    data = listing.gather()
    # Compact JSON: with indent, json falls back to its pure-Python encoder (~20 ms for 500 holders).
    sys.stdout.write(json.dumps(data) + "\n" if args.json else listing.render(data))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from gpupin.hostagent import launch
    from gpupin.hostagent.request import ContainerSpec, RunRequest

    req = RunRequest(
        args.image, args.cmd, gpus=args.gpus, count=args.count, name=args.name, env=args.env,
        env_files=args.env_file, volumes=args.volume, rm=args.rm, detach=args.detach, workdir=args.workdir,
        user=args.user, shm_size=args.shm_size, ipc=args.ipc, network=args.network, labels=args.label,
        entrypoint=args.entrypoint, verify=args.verify, share=args.share, wait=args.wait, dry_run=args.dry_run,
        pull=args.pull, stop_timeout=args.stop_timeout,
    )
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run (a running container's output is its own)")
    if req.dry_run:
        spec = launch.launch(req)
        assert isinstance(spec, ContainerSpec)
        sys.stdout.write(json.dumps(spec.to_dict(), indent=2) + "\n" if args.json else spec.docker_run_line() + "\n")
        return 0
    return launch.run(req)


def _cmd_compose(args: argparse.Namespace) -> int:
    from gpupin.hostagent import compose

    if args.compose_command == "render":
        return compose.render_command(args.file, args.output)
    if args.compose_command == "check":
        return compose.check_command(args.file, args.json)
    raise UsageError("hostagent compose needs a subcommand", "hostagent compose render FILE | check FILE")


def _cmd_swarm(args: argparse.Namespace) -> int:
    if args.swarm_command == "node-config":
        from gpupin.hostagent import nodeconfig

        return nodeconfig.command(args.kind, args.json, args.check, args.daemon_json, args.toolkit_config,
                                  args.runtime_path)
    raise UsageError("hostagent swarm needs a subcommand", "hostagent swarm node-config [--check]")


def _ls_fast(raw: list[str]) -> argparse.Namespace | None:
    """`hostagent ls [--json] [--debug]` without building the parser: argparse and its help formatter cost ~5 ms,
    5% of what listing 500 containers takes (a benchmarked figure). Anything else goes through argparse."""
    if not raw or raw[0] != "ls" or not set(raw[1:]) <= {"--json", "--debug"}:
        return None
    return argparse.Namespace(command="ls", json="--json" in raw, debug="--debug" in raw)


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    fast = _ls_fast(raw)
    if fast is not None:
        try:
            return _cmd_ls(fast)
        except GpupinError as err:
            return _error(err, fast.debug)
    parser = build_parser()
    try:
        args = parser.parse_args(_normalise_wait(raw))
    except SystemExit as exit_:  # --help (0) or a usage error (64, from _Parser.error)
        return int(exit_.code or 0)
    debug = bool(args.debug)
    try:
        if args.command == "ls":
            return _cmd_ls(args)
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "compose":
            return _cmd_compose(args)
        if args.command == "swarm":
            return _cmd_swarm(args)
        parser.print_help(sys.stderr)
        return EX_USAGE
    except GpupinError as err:
        return _error(err, debug)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

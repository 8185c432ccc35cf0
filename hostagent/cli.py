"""`hostagent`: pin containers to physical GPUs through the Docker Engine, and never double-book a card.

Results go to stdout, diagnostics to stderr as `hostagent: ERROR: ... HINT: ...` (a traceback only with --debug);
each kind of failure has its exit code (DESIGN.md): 64 bad request, 69 NVML or Docker unavailable, 75 the card is
held, 125 Docker refused the container; `run` otherwise returns the container's own exit code.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from gpupin.core import __version__
from gpupin.core.contract import LEVELS as VERIFY_LEVELS
from gpupin.core.errors import EX_USAGE, GpupinError, InternalError, UsageError
from gpupin.hostagent.engine.cdi import VIAS
from gpupin.hostagent.run import options as runopts
from gpupin.hostagent.trace import mark

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

PROG = "hostagent"

RUN_EPILOG = """GPU specs (--gpu): a UUID (GPU-1c5e8f3a-...), a unique UUID prefix (GPU-1c5e), a MIG UUID, an NVML
index as nvidia-smi shows it (2), or a PCI bus id in any form (3b:00.0, 0000:3B:00.0). Several --uuid/--gpu
options give several cards, in local-rank order: the first is cuda:0 in the container.

The container gets the cards by UUID, through CDI (--device nvidia.com/gpu=UUID) where the daemon serves them
by CDI (its /info and CDI spec; --via cdi|nvidia decides instead), else through the nvidia driver (--gpus
device=UUID, with NVIDIA_VISIBLE_DEVICES); GPUPIN_EXPECT=UUID@BUSID,... (which an image whose ENTRYPOINT is
gpupin-entrypoint verifies) and the ledger label gpupin.devices either way.

A card is free when no container holds it and no other process uses it: a process of the host, or of a container
that was not given the card, makes it busy (75, naming the pid and user, or the container), and so does a card
whose processes NVML will not list. --share uses such a card on purpose; --count --max-load/--max-memory PCT takes
one that is loaded no more than that.

exit: the container's exit code; 64 bad request; 69 NVML or Docker unavailable; 75 the card is held or in use
by another process (no --wait);
125 Docker refused the container; 126/127 the command cannot be run or was not found (as docker run);
70 an internal error (a bug in hostagent: run again with --debug and report the traceback).
"""


def _wait_value(text: str) -> float:
    try:
        return math.inf if text in ("", "inf", "forever") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r}") from None


def _is_seconds(text: str | None) -> bool:
    if text is None:
        return False
    try:
        _wait_value(text)
    except argparse.ArgumentTypeError:
        return False
    return True


def split_run_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], str | None, list[str]]:
    """(hostagent's options, IMAGE, COMMAND) of `hostagent run ARGV`, as docker run splits its own: options end at
    IMAGE (or at `--`), and everything after IMAGE is the command's, untouched (`--` and options included).

    Which options take a value is read from the run parser itself; an unknown option is left for argparse to
    refuse (with a suggestion). `--wait` takes a value only when the next word is a number of seconds.
    """
    takes: dict[str, str | int | None] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            takes[flag] = action.nargs if action.nargs is not None else (0 if action.const is not None
                                                                         or action.nargs == 0 else 1)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest = argv[i + 1:]
            return list(argv[:i]), (rest[0] if rest else None), list(rest[1:])
        if a.startswith("--"):
            name, eq, _ = a.partition("=")
            n = takes.get(name)
            if eq or not n:
                i += 1
            elif n == "?":
                i += 2 if _is_seconds(argv[i + 1] if i + 1 < len(argv) else None) else 1
            else:
                i += 2
            continue
        if a.startswith("-") and a != "-":
            # A cluster of short options (-dit) or a short option with its value attached (-eKEY=1).
            for j in range(1, len(a)):
                n = takes.get("-" + a[j])
                if n is None or n == 0:
                    if n is None:
                        break
                    continue
                if j + 1 == len(a):
                    i += 1  # the value is the next word
                break
            i += 1
            continue
        return list(argv[:i]), a, list(argv[i + 1:])
    return list(argv), None, []


# argparse's wording (3.11: quoted choices; 3.12.8 and later: bare ones).
_INVALID_CHOICE = re.compile(r"argument (?P<arg>\S+): invalid choice: (?P<word>.*) \(choose from (?P<choices>.*)\)$")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one `ERROR: ... HINT: ...` line and exit 64, like every other refusal."""

    argv: Sequence[str] = ()  # what main() was given, for the hint's subcommand

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    @staticmethod
    def refuse(message: str, hint: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: ERROR: {message}. HINT: {hint}\n")
        sys.exit(EX_USAGE)

    def error(self, message: str) -> NoReturn:
        # argparse reports a subcommand's unknown options from the top parser: suggest from, and point to, the
        # subcommand that was asked for.
        command = next((a for a in self.argv if a in self._subcommands()), None) if self.prog == PROG else None
        where = f"{PROG} {command}" if command else self.prog
        hint = f"see `{where} --help`"
        choice = _INVALID_CHOICE.match(message)
        if choice:  # a mistyped command or choice: the visible choices, and the nearest one
            import difflib

            word = choice["word"].strip("'\"")
            names = [c.strip().strip("'\"") for c in choice["choices"].split(",")]
            names = [c for c in names if not c.startswith("__")]  # __complete is completion's, not a user's
            message = f"argument {choice['arg']}: invalid choice: {word!r} (choose from {', '.join(names)})"
            close = difflib.get_close_matches(word, names, n=1)
            if close:
                hint = f"did you mean {close[0]}? {hint}"
        if message.startswith("unrecognized arguments: "):
            import difflib

            word = message.split(": ", 1)[1].split()[0].split("=")[0]
            parser = self._subcommands().get(command or "", self)
            flags = [f for a in parser._actions for f in a.option_strings]
            close = difflib.get_close_matches(word, flags, n=1)
            if close:
                hint = f"did you mean {close[0]}? {hint}"
        self.refuse(message, hint)


def build_parser() -> _Parser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--debug", action="store_true", help="print a traceback with an error")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    from gpupin.hostagent.ls import template as lsformat  # the fields' table; a light module

    ls = sub.add_parser("ls", help="list the cards, their load, and who holds them",
                        description=LS_DESCRIPTION, epilog=LS_EPILOG + lsformat.fields_help(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("--json", action="store_true",
                    help="one JSON object on stdout, for scripts: the host, and per card every field below and "
                         "more (holders, MIG devices, processes in full)")
    ls.add_argument("--format", metavar="TEMPLATE", help=lsformat.HELP)
    ls.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                    help="colour the table: auto (default) when stdout is a terminal, NO_COLOR is unset and TERM "
                         "is not dumb; always; never")
    ls.add_argument("-w", "--watch", type=_interval, nargs="?", const=2.0, metavar="SECONDS",
                    help="redraw the table in place every SECONDS (default 2) until Ctrl-C")
    ls.add_argument("--swarm", action="store_true", help="every node of the swarm (from a manager): each card, "
                    "the task that holds it, the free ones, and the tasks waiting for cards (with --json or alone)")

    r = sub.add_parser("run", help="start a container pinned to physical GPUs", allow_abbrev=False,
                       usage="hostagent run [OPTIONS] (--uuid UUID | --gpu SPEC ... | --count N) IMAGE "
                             "[COMMAND [ARG...]]",
                       description="Start a container pinned to physical GPUs, as `docker run` would. Options go "
                                   "before IMAGE; everything after IMAGE is the container's command, untouched.",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # IMAGE and COMMAND are split off by split_run_argv (as docker run does); these two lines document them.
    r.add_argument("image", metavar="IMAGE", nargs="?", help="the image to run (pulled when missing, see --pull)")
    r.add_argument("cmd", metavar="COMMAND", nargs="*",
                   help="the command and its arguments (default: the image's CMD), passed untouched")
    r.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print a traceback with an error")
    g = r.add_argument_group("which GPUs")
    g.add_argument("--uuid", dest="gpus", action="append", metavar="UUID", default=[], help="a card by UUID")
    g.add_argument("--gpu", dest="gpus", action="append", metavar="SPEC", default=[],
                   help="a card by UUID, prefix, index, bus id or MIG device (see below)")
    g.add_argument("--count", type=int, metavar="N",
                   help="N cards no container holds and no other process uses: the most free memory first, then "
                        "the least utilization")
    g.add_argument("--max-load", type=float, metavar="PCT",
                   help="with --count: also take cards that other processes use, when their GPU utilization is at "
                        "most PCT percent (as GPUtil's maxLoad, in percent)")
    g.add_argument("--max-memory", type=float, metavar="PCT",
                   help="with --count: also take cards that other processes use, when at most PCT percent of their "
                        "memory is used")
    g.add_argument("--share", action="store_true",
                   help="share on purpose: allow cards that containers started with --share hold, and cards that "
                        "other processes use")
    g.add_argument("--wait", type=_wait_value, metavar="SECONDS", nargs="?", const=math.inf,
                   help="wait for held cards (forever, or at most SECONDS) instead of exiting 75")
    g.add_argument("--verify", choices=list(VERIFY_LEVELS), help="GPUPIN_VERIFY for the entrypoint")
    g.add_argument("--via", choices=list(VIAS), help="pin through CDI (--device nvidia.com/gpu=UUID) or the nvidia "
                   "driver (--gpus device=UUID); default: CDI where the daemon serves the cards by CDI")
    d = r.add_argument_group("as docker run")
    for opt in runopts.OPTIONS:
        kw: dict[str, Any] = {"dest": opt.dest, "help": opt.help}
        if opt.kind == runopts.FLAG:
            kw["action"] = "store_true"
        else:
            kw["metavar"] = opt.metavar or opt.dest.upper()
            if opt.kind == runopts.APPEND:
                kw.update(action="append", default=[])
        d.add_argument(*opt.flags, **kw)
    o = r.add_argument_group("output")
    o.add_argument("--dry-run", action="store_true", help="print the equivalent docker run command; create nothing")
    o.add_argument("--json", action="store_true", help="with --dry-run: the create payload as JSON")

    comp = sub.add_parser("completion", help="print the shell completion script for bash or zsh",
                          description="Print the shell completion script: eval \"$(hostagent completion bash)\" in "
                                      "~/.bashrc, or eval \"$(hostagent completion zsh)\" in ~/.zshrc after compinit.")
    comp.add_argument("shell", choices=["bash", "zsh"], help="the shell")
    hidden = sub.add_parser("__complete")  # what completion asks at completion time (no help: not listed)
    hidden.add_argument("what", choices=["gpus"])

    c = sub.add_parser("compose", help="pin compose services to physical GPUs",
                       description="Render or check compose files whose services ask for physical GPUs.")
    csub = c.add_subparsers(dest="compose_command", metavar="SUBCOMMAND")
    from gpupin.hostagent import compose  # the help texts; the commands load when they run

    raw = argparse.RawDescriptionHelpFormatter
    cr = csub.add_parser("render", help="write a standard compose file with every GPU pinned by UUID",
                         description=compose.RENDER_DESCRIPTION, epilog=compose.RENDER_EPILOG, formatter_class=raw)
    cr.add_argument("file", metavar="FILE", help="the compose file to render (it is never overwritten)")
    cr.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    cr.add_argument("--swarm", action="store_true", help="write a Docker Swarm stack: each task reserves its cards "
                    "as generic resources (see below)")
    cr.add_argument("--kind", metavar="KIND", help="with --swarm: the generic resource kind to reserve (default GPU, "
                    "as `hostagent swarm node-config` advertises)")
    cr.add_argument("--via", choices=list(VIAS), help="pin through CDI (driver: cdi) or the nvidia driver (driver: "
                    "nvidia); default: CDI where the daemon serves the cards by CDI")
    cc = csub.add_parser("check", help="find unknown, double-booked or index-pinned GPUs",
                         description=compose.CHECK_DESCRIPTION, epilog=compose.CHECK_EPILOG, formatter_class=raw)
    cc.add_argument("file", metavar="FILE", help="the compose file to check")
    cc.add_argument("--json", action="store_true", help="the problems as a JSON list")

    s = sub.add_parser("swarm", help="GPU nodes of a Docker Swarm",
                       description="Configure and check the GPU nodes of a Docker Swarm.")
    ssub = s.add_subparsers(dest="swarm_command", metavar="SUBCOMMAND")
    from gpupin.hostagent.swarm import cluster as sw  # constants; a light module (no NVML, no docker SDK)

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


LS_DESCRIPTION = """List every physical card (NVML) and the containers that hold it (the ledger).

Per card: its index, name, temperature, utilization, memory and power (N/A: the card does not report it), its
UUID and bus id, its MIG devices, the containers that hold it (short id, state, how the engine gives it the card,
`shared` for --share, MISMATCH where the gpupin.devices label says otherwise) and the processes on it (pid, user,
memory, command, container). A card is free, held, or shared: held only by containers started with --share, which
`hostagent run --share` may join."""

LS_EPILOG = """When Docker cannot be reached the cards are still listed (holders unknown) and stderr says why.
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


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)


def _error(err: GpupinError, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(err.line(PROG))
    return err.exit_code


def _cmd_ls(args: argparse.Namespace) -> int:
    if getattr(args, "swarm", False):
        if args.format is not None or args.watch is not None:
            raise UsageError("ls --swarm takes --json only (not --format or --watch)", "hostagent ls --swarm [--json]")
        from gpupin.hostagent.swarm import ls as swarmls

        return swarmls.command(args.json)
    from gpupin.hostagent.ls import listing

    return listing.command(args.json, args.format, args.color, args.watch)


def _cmd_run(args: argparse.Namespace) -> int:
    from gpupin.hostagent.run import launch
    from gpupin.hostagent.run.request import ContainerSpec, RunRequest

    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run (a running container's output is its own)")
    if args.interactive and args.tty and not args.dry_run and not sys.stdin.isatty():
        raise UsageError("-it needs a terminal, but the input is not a TTY", "drop -t to pipe input with -i")
    req = RunRequest(args.image, args.cmd, gpus=args.gpus, count=args.count, share=args.share, wait=args.wait,
                     verify=args.verify, dry_run=args.dry_run, via=args.via, max_load=args.max_load,
                     max_memory=args.max_memory,
                     **{opt.dest: getattr(args, opt.dest) for opt in runopts.OPTIONS})
    if req.dry_run:
        spec = launch.launch(req)
        assert isinstance(spec, ContainerSpec)
        if args.json:
            from docker.constants import DEFAULT_DOCKER_API_VERSION

            sys.stdout.write(json.dumps(spec.to_dict(DEFAULT_DOCKER_API_VERSION), indent=2) + "\n")
        else:
            sys.stdout.write(spec.docker_run_line() + "\n")
        return 0
    return launch.run(req)


def _cmd_compose(args: argparse.Namespace) -> int:
    from gpupin.hostagent import compose

    if args.compose_command == "render":
        if args.kind is not None and not args.swarm:
            raise UsageError("--kind goes with --swarm", "a plain render pins cards by UUID; a --swarm render "
                             "reserves generic resources of KIND")
        if args.via is not None and args.swarm:
            raise UsageError("--via goes without --swarm", "a --swarm render reserves generic resources; the "
                             "nodes' runtime decides how the cards reach the task")
        return compose.render_command(args.file, args.output, args.swarm, args.kind, args.via)
    if args.compose_command == "check":
        return compose.check_command(args.file, args.json)
    raise UsageError("hostagent compose needs a subcommand", "hostagent compose render FILE | check FILE")


def _cmd_swarm(args: argparse.Namespace) -> int:
    if args.swarm_command == "node-config":
        from gpupin.hostagent.swarm import nodeconfig

        return nodeconfig.command(args.kind, args.json, args.check, args.daemon_json, args.toolkit_config,
                                  args.runtime_path)
    raise UsageError("hostagent swarm needs a subcommand", "hostagent swarm node-config [--check]")


def _ls_fast(raw: list[str]) -> argparse.Namespace | None:
    """`hostagent ls [--json] [--swarm] [--debug]` without building the parser: argparse and its help formatter cost
    ~5 ms, 5% of what listing 500 containers takes (a benchmarked figure). Anything else goes through argparse."""
    if not raw or raw[0] != "ls" or not set(raw[1:]) <= {"--json", "--swarm", "--debug"}:
        return None
    return argparse.Namespace(command="ls", json="--json" in raw, swarm="--swarm" in raw, debug="--debug" in raw,
                              format=None, color="auto", watch=None)


def _exit_now(code: int) -> None:
    """End `hostagent run` (the program, not a call of main()) without the interpreter's teardown: tearing down the
    docker SDK's and requests' modules costs ~25 ms after the container has already ended (`make bench`'s phase
    breakdown). What teardown would do that matters is done first: the output flushed, the threads that must end
    (the ledger lock's release) joined."""
    import threading

    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a closed pipe: nothing more can be said anyway
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    mark("main")
    raw = list(sys.argv[1:] if argv is None else argv)
    fast = _ls_fast(raw)
    if fast is not None:
        try:
            return _cmd_ls(fast)
        except GpupinError as err:
            return _error(err, fast.debug)
        except Exception as err:
            return _error(InternalError(f"internal error: {type(err).__name__}: {err}"), fast.debug)
    parser = build_parser()
    parser.argv = raw
    try:
        run_at = raw.index("run") if "run" in raw else -1
        if run_at >= 0 and all(a.startswith("-") for a in raw[:run_at]):
            # `hostagent [--debug] run OPTIONS IMAGE COMMAND...`: argparse sees the options only.
            options, image, cmd = split_run_argv(raw[run_at + 1:], _subparser(parser, "run"))
            for word in options:
                name = word.split("=", 1)[0]
                if name in runopts.REFUSED:
                    _Parser.refuse(f"hostagent run does not take {name}", runopts.REFUSED[name])
                if name in runopts.NOT_TAKEN:
                    _Parser.refuse(f"hostagent run does not take docker run's {name}", runopts.NOT_TAKEN_HINT)
            args = parser.parse_args([*raw[:run_at + 1], *options])
            args.image, args.cmd = image, cmd
        else:
            args = parser.parse_args(raw)
    except SystemExit as exit_:  # --help (0) or a usage error (64, from _Parser.error)
        return int(exit_.code or 0)
    debug = bool(args.debug)
    try:
        if args.command == "ls":
            return _cmd_ls(args)
        if args.command == "run":
            mark("parsed")
            code = _cmd_run(args)
            mark("done")
            if argv is None:
                _exit_now(code)
            return code
        if args.command == "compose":
            return _cmd_compose(args)
        if args.command == "swarm":
            return _cmd_swarm(args)
        if args.command == "completion":
            from gpupin.hostagent import completion

            return completion.main(args.shell, parser)
        if args.command == "__complete":
            from gpupin.hostagent.completion import gpu_specs

            sys.stdout.write("".join(s + "\n" for s in gpu_specs()))
            return 0
        parser.print_help()  # no command: help, as `docker` alone prints it
        return 0
    except GpupinError as err:
        return _error(err, debug)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug: still one line (the traceback with --debug), and a code of its own
        return _error(InternalError(f"internal error: {type(err).__name__}: {err}"), debug)


if __name__ == "__main__":
    sys.exit(main())

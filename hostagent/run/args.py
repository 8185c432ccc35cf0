"""`hostagent run`'s command line: its parser (gpupin's options, then docker run's from hostagent.run.options), the
split of ARGV into options, IMAGE and COMMAND as docker run splits its own, and the command it runs."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys

from gpupin.core.contract import LEVELS as VERIFY_LEVELS
from gpupin.core.errors import UsageError, printable
from gpupin.hostagent.completion import COMMAND, GPUS, offer
from gpupin.hostagent.engine.cdi import VIAS
from gpupin.hostagent.run import options as runopts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from gpupin.hostagent.run.request import RunRequest

EPILOG = """GPU specs (--gpu): a UUID (GPU-1c5e8f3a-...), a unique UUID prefix (GPU-1c5e), a MIG UUID, an NVML
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

The docker run options are read as docker reads them: bool flags take =true/=false (--rm=false, -d=true) and
cluster (-itd); sizes take docker's units (16g = 16GB = 16GiB); `-v ./data:/data` is a bind of ./data.

exit: the container's exit code; 64 bad request; 69 NVML or Docker unavailable, or the card is unhealthy; 75 the
card is held or in use by another process (no --wait), or a quota of the host's policy is used up;
125 Docker refused the container; 126/127 the command cannot be run or was not found (as docker run);
70 an internal error (a bug in hostagent: run again with --debug and report the traceback).
"""


def _wait_value(text: str) -> float:
    from gpupin.hostagent.run.values import wait_seconds

    try:
        return wait_seconds(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _for_value(text: str) -> float:
    from gpupin.hostagent.policy import parse_duration  # here: a run without --for loads none of the policy

    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _is_seconds(text: str | None) -> bool:
    """Whether the word after --wait is its value: a wait (`300`, `5m`), or a negative one (`-5m`), which its type
    refuses in one line: no option starts with a digit, and IMAGE would be the wait's mistake."""
    if text is None:
        return False
    if text[:1] == "-" and text[1:2].isdigit():
        return True
    try:
        _wait_value(text)
    except argparse.ArgumentTypeError:
        return False
    return True


_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def go_parse_bool(text: str) -> bool:
    """A bool flag's `=VALUE`, as Go's strconv.ParseBool (docker's flags) reads it; ValueError if not a bool."""
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(text)


class BoolFlag(argparse._StoreTrueAction):
    """docker run's bool flag: `--rm` alone, or `--rm=true`/`--rm=false` (the last one given wins). A value is
    taken only after `=`: split_run_argv never gives it the next word, and bool_values writes short ones long
    (argparse would read `-it` as -i with the value "t")."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.nargs = "?"

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if isinstance(values, str):
            try:
                values = go_parse_bool(values)
            except ValueError:
                raise argparse.ArgumentError(self, f"{values!r} is not a boolean: use true or false") from None
        setattr(namespace, self.dest, bool(values))


def help_width() -> int:
    """The width argparse gives --help, found as shutil.get_terminal_size finds it (COLUMNS, else the terminal,
    else 80; less 2) without importing shutil, which brings zlib, bz2 and lzma into every run's start-up."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Bool flags shown as flags (`--rm`), not with the optional value BoolFlag takes after `=`; the width
    without shutil (help_width)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, help_width() if width is None else width)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, BoolFlag):
            return ", ".join(action.option_strings)
        return super()._format_action_invocation(action)


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`run` among hostagent's commands."""
    # No -h: docker run's -h is --hostname; --help alone asks for help, as there.
    r = sub.add_parser(
        "run",
        help="start a container pinned to physical GPUs",
        allow_abbrev=False,
        add_help=False,
        usage="hostagent run [OPTIONS] (--uuid UUID | --gpu SPEC ... | --count N) IMAGE [COMMAND [ARG...]]",
        description="Start a container pinned to physical GPUs, as `docker run` would. Options go "
        "before IMAGE; everything after IMAGE is the container's command, untouched.",
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    # IMAGE and COMMAND are split off by split_run_argv (as docker run does); these two lines document them.
    r.add_argument("image", metavar="IMAGE", nargs="?", help="the image to run (pulled when missing, see --pull)")
    offer(
        r.add_argument(
            "cmd",
            metavar="COMMAND",
            nargs="*",
            help="the command and its arguments (default: the image's CMD), passed untouched",
        ),
        COMMAND,
    )
    r.add_argument("--help", action="help", help="show this help message and exit")
    r.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="print a traceback with an error")
    g = r.add_argument_group("which GPUs")
    offer(
        g.add_argument("--uuid", dest="gpus", action="append", metavar="UUID", default=[], help="a card by UUID"), GPUS
    )
    offer(
        g.add_argument(
            "--gpu",
            dest="gpus",
            action="append",
            metavar="SPEC",
            default=[],
            help="a card by UUID, prefix, index, bus id or MIG device (see below)",
        ),
        GPUS,
    )
    g.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="N healthy cards no container holds and no other process uses: the most free memory "
        "first, then the least utilization",
    )
    g.add_argument(
        "--max-load",
        type=float,
        metavar="PCT",
        help="with --count: also take cards that other processes use, when their GPU utilization is at "
        "most PCT percent (as GPUtil's maxLoad, in percent)",
    )
    g.add_argument(
        "--max-memory",
        type=float,
        metavar="PCT",
        help="with --count: also take cards that other processes use, when at most PCT percent of their memory is used",
    )
    g.add_argument(
        "--share",
        action="store_true",
        help="share on purpose: allow cards that containers started with --share hold, and cards that "
        "other processes use",
    )
    g.add_argument(
        "--wait",
        type=_wait_value,
        metavar="SECONDS",
        nargs="?",
        const=math.inf,
        help="wait for held cards (forever, or at most SECONDS: a number, or a duration as --for takes it: 90s, "
        "5m, 2h) instead of exiting 75; with the agent "
        "up, in its fair queue (`hostagent queue`)",
    )
    g.add_argument(
        "--for",
        dest="book_for",
        type=_for_value,
        metavar="DURATION",
        help="book the cards for this long (90m, 4h, 2d): then the resident agent stops the container as docker "
        "stop does; the host's policy gives a default and a maximum (docs/policy.md), `hostagent extend` more",
    )
    g.add_argument("--verify", choices=list(VERIFY_LEVELS), help="GPUPIN_VERIFY for the entrypoint")
    g.add_argument(
        "--via",
        choices=list(VIAS),
        help="pin through CDI (--device nvidia.com/gpu=UUID) or the nvidia "
        "driver (--gpus device=UUID); default: CDI where the daemon serves the cards by CDI",
    )
    d = r.add_argument_group("as docker run")
    for opt in runopts.OPTIONS:
        kw: dict[str, Any] = {"dest": opt.dest, "help": opt.help}
        if opt.kind == runopts.FLAG:
            kw.update(action=BoolFlag, default=None)  # None: not given (docker sends --init only when given)
        else:
            kw["metavar"] = opt.metavar or opt.dest.upper()
            if opt.kind == runopts.APPEND:
                kw.update(action="append", default=[])
        action = d.add_argument(*opt.flags, **kw)
        if opt.complete:
            offer(action, opt.complete)
    o = r.add_argument_group("output")
    o.add_argument(
        "--dry-run",
        action="store_true",
        help="print the equivalent docker run command; create nothing (values from env files and the "
        "environment not shown)",
    )
    o.add_argument("--json", action="store_true", help="with --dry-run: the create payload as JSON")


def split_run_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], str | None, list[str]]:
    """(hostagent's options, IMAGE, COMMAND) of `hostagent run ARGV`, as docker run splits its own: options end at
    IMAGE (or at `--`), and everything after IMAGE is the command's, untouched (`--` and options included).

    Which options take a value is read from the run parser itself; an unknown option is left for argparse to
    refuse (with a suggestion). `--wait` takes a value only when the next word is a wait (seconds, or a duration: 5m).
    """
    takes = _takes(parser)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest = argv[i + 1 :]
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
        return list(argv[:i]), a, list(argv[i + 1 :])
    return list(argv), None, []


def misplaced(
    options: Sequence[str], image: str | None, cmd: Sequence[str], parser: argparse.ArgumentParser
) -> tuple[str, str] | None:
    """(what, hint) when the words right after IMAGE are run's own options (`hostagent run IMAGE --gpu 1`): they
    are the command's, as docker run has it, so the request names no card. None when they are not (a command's own
    options come after its name: `IMAGE python3 --gpu 1`). Asked only when no GPU option came before IMAGE."""
    if image is None or not cmd or cmd[0] == "--":
        return None
    late, then, rest = split_run_argv(list(cmd), parser)
    takes = _takes(parser)
    names = [w.split("=", 1)[0] if w.startswith("--") else w[:2] for w in late if w.startswith("-") and w != "-"]
    if not names or any(n not in takes for n in names):
        return None
    fixed = [*options, *late, image, *([then] if then is not None else []), *rest]
    return (
        f"{printable(' '.join(late))} {'comes' if len(names) == 1 else 'come'} after the image {printable(image)}: "
        "it is passed to the command",
        f"put run's options before IMAGE: hostagent run {printable(shlex.join(fixed))}",
    )


def _takes(parser: argparse.ArgumentParser) -> dict[str, str | int | None]:
    """How many words each option takes: 0, 1, or "?" (--wait's optional seconds)."""
    takes: dict[str, str | int | None] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if isinstance(action, (BoolFlag, argparse._HelpAction)):
                takes[flag] = 0
            else:
                takes[flag] = action.nargs if action.nargs is not None else (0 if action.const is not None else 1)
    return takes


def bool_values(options: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`options` with every short bool flag in its long form (`-itd` -> `--interactive --tty --detach`,
    `-d=false` -> `--detach=false`), which BoolFlag reads: a cluster ends at an option that takes a value (the rest
    of the word is its value), as in docker's flags (pflag)."""
    long_of = {f: a.option_strings[-1] for a in parser._actions if isinstance(a, BoolFlag) for f in a.option_strings}
    out: list[str] = []
    for word in options:
        if word.startswith("--") or not word.startswith("-"):
            out.append(word)
            continue
        j = 1
        while j < len(word):
            flag = "-" + word[j]
            if flag not in long_of:  # takes a value (attached, or the next word), or unknown: argparse's
                out.append("-" + word[j:])
                break
            if word[j + 1 : j + 2] == "=":
                out.append(f"{long_of[flag]}={word[j + 2 :]}")
                break
            out.append(long_of[flag])
            j += 1
    return out


def _negatives_attached(options: Sequence[str]) -> list[str]:
    """`--for -5m` as `--for=-5m`: argparse reads a word that starts with `-` as an option ("expected one
    argument"); attached, the value reaches its type, which says what is wrong with it."""
    out: list[str] = []
    for word in options:
        if out and out[-1] in ("--for", "--wait") and word[:1] == "-" and word[1:2].isdigit():
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def refusal(options: Sequence[str]) -> tuple[str, str] | None:
    """(what, hint) for the first docker run option among `options` that hostagent refuses by name, else None."""
    for word in options:
        name = word.split("=", 1)[0]
        if name in runopts.REFUSED:
            return f"hostagent run does not take {name}", runopts.REFUSED[name]
        if name in runopts.NOT_TAKEN:
            return f"hostagent run does not take docker run's {name}", runopts.NOT_TAKEN_HINT
    return None


def parse(words: Sequence[str], parser: argparse.ArgumentParser, top: Sequence[str] = ()) -> argparse.Namespace:
    """`hostagent [TOP] run WORDS` parsed by `parser` (hostagent.parser's, whole or run's only): options split from
    IMAGE and COMMAND as docker run splits them, bool flags read as docker reads them, a refused option refused by
    name (UsageError). The one parse of a run's words."""
    from gpupin.hostagent.completion import subcommands

    run_parser = subcommands(parser)["run"]
    written, image, cmd = split_run_argv(words, run_parser)
    options = _negatives_attached(bool_values(written, run_parser))
    refused = refusal(options)
    if refused is not None:
        raise UsageError(printable(refused[0]), refused[1])
    args = parser.parse_args([*top, "run", *options])
    args.image, args.cmd = image, cmd
    args.misplaced = misplaced(written, image, cmd, run_parser)
    return args


def request(args: argparse.Namespace, stdin_tty: Callable[[], bool], **reading: Any) -> RunRequest:
    """The RunRequest of parsed words, after the checks between options; `stdin_tty` says whether the caller's
    input is a terminal (asked only for -it), `reading` what the options may read (RunRequest's environ, reads)."""
    from gpupin.hostagent.run.request import RunRequest

    if not args.gpus and args.count is None and getattr(args, "misplaced", None) is not None:
        raise UsageError(*args.misplaced)
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run (a running container's output is its own)")
    if args.interactive and args.tty and not args.detach and not args.dry_run and not stdin_tty():
        raise UsageError("-it needs a terminal, but the input is not a TTY", "drop -t to pipe input with -i")
    return RunRequest(
        args.image,
        args.cmd,
        gpus=args.gpus,
        count=args.count,
        share=args.share,
        wait=args.wait,
        book_for=args.book_for,
        verify=args.verify,
        dry_run=args.dry_run,
        via=args.via,
        max_load=args.max_load,
        max_memory=args.max_memory,
        **reading,
        **{opt.dest: getattr(args, opt.dest) for opt in runopts.OPTIONS},
    )


def command(args: argparse.Namespace) -> int:
    from gpupin.hostagent.run.request import ContainerSpec

    req = request(args, lambda: sys.stdin.isatty())
    if req.dry_run:
        from gpupin.hostagent.run import launch

        spec = launch.launch(req)
        assert isinstance(spec, ContainerSpec)
        if args.json:
            from gpupin.hostagent.engine.client import MAX_API

            sys.stdout.write(json.dumps(spec.to_dict(MAX_API), indent=2) + "\n")
        else:
            sys.stdout.write(spec.docker_run_line() + "\n")
        return 0
    from gpupin.hostagent.run import via_agent

    code = via_agent.run(req)  # a pull is this process's own even so (its credentials, its terminal)
    if code is not None:
        return code
    from gpupin.hostagent.run import launch

    return launch.run(req)

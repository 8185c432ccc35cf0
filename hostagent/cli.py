"""`hostagent`: pin containers to physical GPUs through the Docker Engine, and never double-book a card.

Results go to stdout, diagnostics to stderr as `hostagent: ERROR: ... HINT: ...` (a traceback only with --debug);
each kind of failure has its exit code (docs/exit-codes.md): 64 bad request, 69 NVML or Docker unavailable, 75 the
card is held, 125 Docker refused the container; `run` otherwise returns the container's own exit code.

This module is the entry point: the top-level parser, and the dispatch to each command. Each command's own parser,
help and checks of its options are beside it, in its package: hostagent.ls.args, hostagent.run.args (with the
split of `run`'s ARGV), hostagent.compose.args, hostagent.swarm.args, hostagent.doctor, hostagent.serve.args,
hostagent.queue.args and hostagent.policy.args.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from gpupin.core import __version__
from gpupin.core.errors import GpupinError, InternalError, UsageError
from gpupin.hostagent import PROG, completion, help_width, mark
from gpupin.hostagent.ls import args as ls_args
from gpupin.hostagent.run import args as run_args

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

# argparse's wording (3.11: quoted choices; 3.12.8 and later: bare ones).
_INVALID_CHOICE = re.compile(r"argument (?P<arg>\S+): invalid choice: (?P<word>.*) \(choose from (?P<choices>.*)\)$")


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, its width found without shutil (gpupin.hostagent.help_width)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, help_width() if width is None else width)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one `ERROR: ... HINT: ...` line and exit 64, like every other refusal."""

    argv: Sequence[str] = ()  # what main() was given, for the hint's subcommand

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kw)

    @staticmethod
    def refuse(message: str, hint: str) -> NoReturn:
        from gpupin.core.errors import printable

        err = UsageError(printable(message), hint)  # argparse puts the user's words in as given: one line still
        sys.stderr.write(err.line(PROG))
        sys.exit(err.exit_code)

    def error(self, message: str) -> NoReturn:
        # argparse reports a subcommand's unknown options from the top parser: suggest from, and point to, the
        # subcommand that was asked for.
        command = next((a for a in self.argv if a in completion.subcommands(self)), None) if self.prog == PROG else None
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

            words = message.split(": ", 1)[1].split()  # argparse joins them with blanks: `ls ''` gives none
            word = words[0].split("=")[0] if words else ""
            if not words:
                message = "unrecognized arguments: '' (an empty word)"
            parser = completion.subcommands(self).get(command or "", self)
            flags = [f for a in parser._actions for f in a.option_strings]
            close = difflib.get_close_matches(word, flags, n=1)
            if close:
                hint = f"did you mean {close[0]}? {hint}"
        self.refuse(message, hint)


def build_parser(run_only: bool = False) -> _Parser:
    """The whole command line; `run_only`: the top options and `run` alone, for `hostagent [--debug] run ...`,
    whose start-up then pays for no other command's modules (`make bench`'s run phases)."""
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--debug", action="store_true", help="print a traceback with an error")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    if run_only:
        run_args.add(sub)
        return p
    from gpupin.hostagent import doctor
    from gpupin.hostagent.compose import args as compose_args
    from gpupin.hostagent.policy import args as policy_args
    from gpupin.hostagent.serve import args as serve_args
    from gpupin.hostagent.swarm import args as swarm_args

    ls_args.add(sub)
    run_args.add(sub)
    comp = sub.add_parser(
        "completion",
        help="print the shell completion script for bash, zsh or fish",
        description='Print the shell completion script: eval "$(hostagent completion bash)" in '
        '~/.bashrc, eval "$(hostagent completion zsh)" in ~/.zshrc after compinit, '
        "or hostagent completion fish | source in ~/.config/fish/config.fish.",
    )
    comp.add_argument("shell", choices=list(completion.SHELLS), help="the shell")
    hidden = sub.add_parser("__complete")  # what completion asks at completion time (no help: not listed)
    hidden.add_argument("what", choices=["gpus"])
    compose_args.add(sub)
    swarm_args.add(sub)
    doctor.add(sub)
    serve_args.add(sub)
    from gpupin.hostagent.queue import args as queue_args

    queue_args.add(sub)
    policy_args.add(sub)
    policy_args.add_extend(sub)
    from gpupin.hostagent.record import report

    report.add(sub)
    return p


def _error(err: GpupinError, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(err.line(PROG))
    return err.exit_code


def _internal(err: Exception) -> InternalError:
    """A bug: still one line (the traceback with --debug), and a code of its own."""
    return InternalError(f"internal error: {type(err).__name__}: {err}")


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
    fast = ls_args.fast(raw)
    if fast is not None:
        try:
            return ls_args.command(fast)
        except GpupinError as err:
            return _error(err, fast.debug)
        except Exception as err:
            return _error(_internal(err), fast.debug)
    run_at = raw.index("run") if "run" in raw else -1
    parser = build_parser(run_only=run_at >= 0 and set(raw[:run_at]) <= {"--debug"})
    parser.argv = raw
    try:
        if run_at >= 0 and all(a.startswith("-") for a in raw[:run_at]):
            # `hostagent [--debug] run OPTIONS IMAGE COMMAND...`: argparse sees the options only.
            run_parser = completion.subcommands(parser)["run"]
            written, image, cmd = run_args.split_run_argv(raw[run_at + 1 :], run_parser)
            options = run_args.bool_values(written, run_parser)
            refused = run_args.refusal(options)
            if refused is not None:
                _Parser.refuse(*refused)
            args = parser.parse_args([*raw[: run_at + 1], *options])
            args.image, args.cmd = image, cmd
            args.misplaced = run_args.misplaced(written, image, cmd, run_parser)
        else:
            args = parser.parse_args(raw)
    except SystemExit as exit_:  # --help (0) or a usage error (64, from _Parser.error)
        return int(exit_.code or 0)
    debug = bool(args.debug)
    try:
        if args.command == "ls":
            return ls_args.command(args)
        if args.command == "run":
            mark("parsed")
            code = run_args.command(args)
            mark("done")
            if argv is None:
                _exit_now(code)
            return code
        if args.command == "compose":
            from gpupin.hostagent.compose import args as compose_args

            return compose_args.command(args)
        if args.command == "swarm":
            from gpupin.hostagent.swarm import args as swarm_args

            return swarm_args.command(args)
        if args.command == "doctor":
            from gpupin.hostagent import doctor

            return doctor.command(args.root, args.json)
        if args.command == "serve":
            from gpupin.hostagent.serve import args as serve_args

            return serve_args.command(args)
        if args.command == "queue":
            from gpupin.hostagent.queue import args as queue_args

            return queue_args.command(args)
        if args.command == "usage":
            from gpupin.hostagent.record import report

            return report.command(args)
        if args.command == "policy":
            from gpupin.hostagent.policy import args as policy_args

            return policy_args.command(args)
        if args.command == "extend":
            from gpupin.hostagent.policy import args as policy_args

            return policy_args.extend(args)
        if args.command == "completion":
            return completion.main(args.shell, parser)
        if args.command == "__complete":
            sys.stdout.write("".join(s + "\n" for s in completion.gpu_specs()))
            return 0
        parser.print_help()  # no command: help, as `docker` alone prints it
        return 0
    except GpupinError as err:
        return _error(err, debug)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug
        return _error(_internal(err), debug)


if __name__ == "__main__":
    sys.exit(main())

"""`hostagent`: pin containers to physical GPUs through the Docker Engine, and never double-book a card. This module
is the entry point: the dispatch to each command, its imports made when a command needs them. The top-level parser
is hostagent.parser; each command's own parser is in its package (hostagent.run.args, hostagent.ls.args, ...).
Refusals are one `ERROR: ... HINT: ...` line with their exit code (docs/exit-codes.md).
"""

from __future__ import annotations

import os
import sys

from gpupin.core.errors import GpupinError, InternalError
from gpupin.hostagent import PROG, mark

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpupin.hostagent.parser import Parser


def build_parser(run_only: bool = False) -> Parser:
    """The whole command line; `run_only`: the top options and `run` alone (hostagent.parser.run_only)."""
    from gpupin.hostagent import parser as parsers

    if run_only:
        return parsers.run_only()
    from gpupin.hostagent import completion, doctor
    from gpupin.hostagent.authz import args as authz_args
    from gpupin.hostagent.compose import args as compose_args
    from gpupin.hostagent.ls import args as ls_args
    from gpupin.hostagent.policy import args as policy_args
    from gpupin.hostagent.run import args as run_args
    from gpupin.hostagent.serve import args as serve_args
    from gpupin.hostagent.swarm import args as swarm_args

    p = parsers.top()
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
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
    authz_args.add(sub)
    from gpupin.hostagent.queue import args as queue_args

    queue_args.add(sub)
    policy_args.add(sub)
    policy_args.add_extend(sub)
    from gpupin.hostagent.record import report

    report.add(sub)
    __import__("gpupin.hostagent.setup", fromlist=["add"]).add(sub)
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
    threading = sys.modules.get("threading")  # not loaded: no such thread (start_thread's helpers are daemons)
    if threading is not None:
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
    if raw[:1] != ["run"]:  # `ls`'s own quick parse; a run pays for none of ls's modules
        from gpupin.hostagent.ls import args as ls_args

        fast = ls_args.fast(raw)
        if fast is not None:
            try:
                return ls_args.command(fast)
            except GpupinError as err:
                return _error(err, fast.debug)
            except Exception as err:
                return _error(_internal(err), fast.debug)
    from gpupin.hostagent import completion
    from gpupin.hostagent.run import args as run_args

    run_at = raw.index("run") if "run" in raw else -1
    parser = build_parser(run_only=run_at >= 0 and set(raw[:run_at]) <= {"--debug"})
    parser.argv = raw
    try:
        if run_at >= 0 and all(a.startswith("-") for a in raw[:run_at]):
            # `hostagent [--debug] run OPTIONS IMAGE COMMAND...`: argparse sees the options only.
            args = run_args.parse(raw[run_at + 1 :], parser, raw[:run_at])
        else:
            args = parser.parse_args(raw)
    except SystemExit as exit_:  # --help (0) or a usage error (64, from hostagent.parser.Parser.error)
        return int(exit_.code or 0)
    except GpupinError as err:  # an option refused by name
        return _error(err, "--debug" in raw[:run_at])
    debug = bool(args.debug)
    try:
        if args.command == "ls":
            from gpupin.hostagent.ls import args as ls_args

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
        if args.command == "authz":
            from gpupin.hostagent.authz import args as authz_args

            return authz_args.command(args)
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
        if args.command == "setup":
            from gpupin.hostagent import setup

            return setup.command(args)
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

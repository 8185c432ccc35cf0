"""hostagent's parsers: argparse made to refuse as every other refusal does (one `ERROR: ... HINT: ...` line, exit
64), its top-level options, and the parser of `hostagent [--debug] run` alone. The whole command line is hostagent.cli's
(build_parser); each command's own options are beside it, in its package (hostagent.ls.args, hostagent.run.args,
...)."""

from __future__ import annotations

import argparse
import re
import sys

from gpupin.core import __version__
from gpupin.core.errors import UsageError
from gpupin.hostagent import PROG, completion
from gpupin.hostagent.run import args as run_args
from gpupin.hostagent.run.args import help_width

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

DESCRIPTION = "`hostagent`: pin containers to physical GPUs through the Docker Engine, and never double-book a card."
# argparse's wording (3.11: quoted choices; 3.12.8 and later: bare ones).
_INVALID_CHOICE = r"argument (?P<arg>\S+): invalid choice: (?P<word>.*) \(choose from (?P<choices>.*)\)$"


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, its width found without shutil (gpupin.hostagent.run.args.help_width)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None):
        super().__init__(prog, indent_increment, max_help_position, help_width() if width is None else width)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one `ERROR: ... HINT: ...` line and exit 64, like every other refusal."""

    argv: Sequence[str] = ()  # what main() was given, for the hint's subcommand

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", Formatter)
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
        choice = re.match(_INVALID_CHOICE, message)
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


def top() -> Parser:
    """The top-level parser, without commands: --debug and --version."""
    p = Parser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--debug", action="store_true", help="print a traceback with an error")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return p


def run_only() -> Parser:
    """The top options and `run` alone, for `hostagent [--debug] run ...`, whose start-up then pays for no other
    command's modules (`make bench`'s run phases)."""
    p = top()
    run_args.add(p.add_subparsers(dest="command", metavar="COMMAND"))
    return p

"""What completion knows of the command line, read from argparse's parsers: each command's subcommands, options
and positionals, and what each value is (its choices, or what `offer` says beside the add_argument)."""

from __future__ import annotations

import argparse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

FILES = "files"  # a path on this host
DIRS = "dirs"  # a folder on this host
GPUS = "gpus"  # a GPU spec, from NVML
COMMAND = "command"  # from this positional on, the words are another program's (default completion)


def offer(action: argparse.Action, what: str | Sequence[str]) -> argparse.Action:
    """Say what completion offers for an action's value: FILES, DIRS, GPUS, COMMAND, or these words."""
    setattr(action, "complete", what)  # noqa: B010 -- an attribute of our own on argparse's object
    return action


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of a parser by name (hidden ones, such as `__complete`, included), or {} when it has none."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


class Arg:
    """An option or a positional as a shell sees it: its spellings (none: a positional), whether it takes a value
    (and whether that value may be left out), and what its value is: `values` (words) or `kind`."""

    __slots__ = ("flags", "help", "kind", "metavar", "optional", "takes", "values")

    def __init__(self, action: argparse.Action) -> None:
        self.flags = list(action.option_strings)
        self.help = " ".join((action.help or "").split())
        self.metavar = str(action.metavar or action.dest).lower()
        self.takes = action.nargs != 0 and not isinstance(
            action, (argparse._StoreTrueAction, argparse._HelpAction, argparse._VersionAction, argparse._CountAction)
        )
        self.optional = action.nargs == "?"
        complete = getattr(action, "complete", None)
        words = action.choices if action.choices is not None else (None if isinstance(complete, str) else complete)
        self.values = [str(w) for w in words] if words is not None else None
        self.kind = complete if isinstance(complete, str) else None


class Command:
    """One command: its path ("", "run", "compose render"), the subcommands a user is offered (not the hidden
    `__complete`) with their help, its options and its positionals."""

    def __init__(self, path: str, parser: argparse.ArgumentParser) -> None:
        self.path = path
        self.children = {name: p for name, p in subcommands(parser).items() if not name.startswith("_")}
        helps = {
            choice.dest: choice.help or ""
            for group in parser._actions
            if isinstance(group, argparse._SubParsersAction)
            for choice in group._choices_actions
        }
        self.subcommands = {name: helps.get(name, "") for name in self.children}
        plain = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
        self.options = [Arg(a) for a in plain if a.option_strings]
        self.positionals = [Arg(a) for a in plain if not a.option_strings]

    def takes(self) -> list[str]:
        """The spellings of the options that take a value (always, not only maybe)."""
        return [f for o in self.options if o.takes and not o.optional for f in o.flags]

    def stop(self) -> int | None:
        """The positional (by position) from which on the words are another program's, if any."""
        return next((i for i, p in enumerate(self.positionals) if p.kind == COMMAND), None)


def commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Command]:
    """Every command, the top one first, then each subcommand's, depth first."""
    command = Command(path, parser)
    yield command
    for name, sub in command.children.items():
        yield from commands(sub, f"{path} {name}".strip())

"""Shell completion for bash, zsh and fish (`hostagent completion bash|zsh|fish`), generated from the CLI's own
parsers: the subcommands, the options, and what each value is are read from argparse's actions, so a shell offers
exactly what hostagent takes, and a new option or choice needs no second list.

What a value is comes from where the option is declared: argparse's `choices` (--via, --verify, --color, ...), or
`offer(action, ...)` beside the add_argument for the rest (as shtab's `action.complete`): words that argparse does
not check itself (--restart's policies, docker run's --pull), FILES, DIRS, GPUS, or COMMAND (a positional from
which on the words are another program's: `run`'s command after IMAGE). GPU specs come from NVML at completion
time, through `hostagent __complete gpus` (hidden; prints nothing on failure).

    eval "$(hostagent completion bash)"                          # in ~/.bashrc
    eval "$(hostagent completion zsh)"                           # in ~/.zshrc, after compinit
    hostagent completion fish | source                           # in ~/.config/fish/config.fish

Not shtab: it writes no fish (tqdm/shtab#134), and a GPU spec from NVML and run's stop at IMAGE would need hooks
of our own in each shell anyway; argcomplete answers a TAB by running the whole program (its imports, NVML).
"""

from __future__ import annotations

import sys

from gpupin.hostagent.completion.model import COMMAND, DIRS, FILES, GPUS, commands, offer, subcommands

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

__all__ = ["COMMAND", "DIRS", "FILES", "GPUS", "SHELLS", "gpu_specs", "main", "offer", "subcommands"]

SHELLS = ("bash", "zsh", "fish")


def gpu_specs() -> list[str]:
    """What --gpu accepts on this host, for completion: indices, UUIDs, bus ids, MIG devices."""
    from gpupin.core import nvml

    try:
        cards = nvml.list_cards(mig=True, tolerate_lost=True)
    except Exception:
        return []
    out: list[str] = []
    for c in cards:
        out += [str(c.index), *([c.uuid] if c.uuid else []), *([str(c.bus_id)] if c.bus_id else [])]
        out += [m.uuid for m in c.mig_devices] + [f"{c.index}:{m.index}" for m in c.mig_devices]
    return out


def main(shell: str, parser: argparse.ArgumentParser) -> int:
    from gpupin.hostagent.completion import bash, fish, zsh

    script = {"bash": bash.script, "zsh": zsh.script, "fish": fish.script}[shell]
    sys.stdout.write(script(list(commands(parser))))
    return 0

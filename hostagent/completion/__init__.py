"""Shell completion for bash, zsh and fish (`hostagent completion bash|zsh|fish`), generated from the CLI's own
parsers, so a shell offers exactly what hostagent takes and a new option needs no second list. What a value is
comes from argparse's `choices`, or `offer(action, ...)` beside the add_argument; GPU specs come from NVML at
completion time (`hostagent __complete gpus`). Why not shtab or argcomplete: docs/run.md, "Shell completion".
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

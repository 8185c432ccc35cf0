"""`hostagent swarm`'s command line: the parser and help of `node-config`, and the command it runs
(hostagent.swarm.nodeconfig, loaded only when it runs)."""

from __future__ import annotations

import argparse

from gpupin.core.errors import UsageError
from gpupin.hostagent.completion import FILES, offer
from gpupin.hostagent.swarm.resources import DAEMON_JSON, RUNTIME_PATH, TOOLKIT_CONFIG

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`swarm` and its subcommand among hostagent's commands."""
    s = sub.add_parser(
        "swarm", help="GPU nodes of a Docker Swarm", description="Configure and check the GPU nodes of a Docker Swarm."
    )
    ssub = s.add_subparsers(dest="swarm_command", metavar="SUBCOMMAND")
    sn = ssub.add_parser(
        "node-config",
        help="the generic resources and runtime settings of this node (--check: diagnose them)",
        description="What this GPU node must advertise to Docker Swarm, and "
        "the runtime settings that make it effective; or, with --check, what is wrong with them.",
        epilog=NODE_CONFIG_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sn.add_argument(
        "--kind",
        metavar="KIND",
        help="the generic resource kind services ask for (default GPU; with --check: the kind the node advertises)",
    )
    sn.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    sn.add_argument("--check", action="store_true", help="diagnose this node's daemon.json and toolkit config")
    offer(
        sn.add_argument(
            "--daemon-json",
            default=DAEMON_JSON,
            metavar="PATH",
            help=f"dockerd's configuration (default {DAEMON_JSON})",
        ),
        FILES,
    )
    offer(
        sn.add_argument(
            "--toolkit-config",
            default=TOOLKIT_CONFIG,
            metavar="PATH",
            help=f"the NVIDIA Container Toolkit's configuration (default {TOOLKIT_CONFIG})",
        ),
        FILES,
    )
    offer(
        sn.add_argument(
            "--runtime-path",
            metavar="PATH",
            help=f"the nvidia runtime's path to print in daemon.json (default {RUNTIME_PATH}, as nvidia-ctk writes it)",
        ),
        FILES,
    )


def command(args: argparse.Namespace) -> int:
    if args.swarm_command == "node-config":
        from gpupin.hostagent.swarm import nodeconfig

        return nodeconfig.command(
            args.kind, args.json, args.check, args.daemon_json, args.toolkit_config, args.runtime_path
        )
    raise UsageError("hostagent swarm needs a subcommand", "hostagent swarm node-config [--check]")

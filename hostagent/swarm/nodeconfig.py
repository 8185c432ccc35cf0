"""`hostagent swarm node-config`: what a GPU node must advertise to Docker Swarm, and a check of a node that does.

Swarm gives a task its cards only when three settings agree (daemon.json's `node-generic-resources` by UUID and
`default-runtime: nvidia`, the toolkit's `swarm-resource`), and nothing errors when they do not: every task
then sees every card (docs/swarm.md, "Node setup"). Without `--check` it prints them for this host's cards;
with it, hostagent.swarm.nodecheck diagnoses the node.
"""

from __future__ import annotations

import json
import sys

from gpupin.core import nvml
from gpupin.core.errors import EX_USAGE, GpuUnavailableError, UsageError
from gpupin.hostagent.swarm.nodecheck import check, read_daemon_json, read_toolkit_config
from gpupin.hostagent.swarm.resources import (
    DAEMON_JSON,
    DEFAULT_KIND,
    RUNTIME_NAME,
    RUNTIME_PATH,
    SWARM_RESOURCE,
    TOOLKIT_CONFIG,
    advertisable,
    card_json,
    check_kind,
    env_var,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core.nvml import Card


def render(
    cards: Sequence[Card],
    kind: str = DEFAULT_KIND,
    runtime_path: str = RUNTIME_PATH,
    daemon_json: str = DAEMON_JSON,
    toolkit_config: str = TOOLKIT_CONFIG,
) -> dict[str, Any]:
    """The settings that make this host's cards Swarm resources of `kind` (what --json prints)."""
    check_kind(kind)
    adverts, skipped = advertisable(cards)
    if not adverts:
        left = "; ".join(f"index {c.index}: {why}" for c, why in skipped) or "NVML lists no card"
        raise GpuUnavailableError(
            f"this host has no card to advertise to Swarm ({left})",
            "check `nvidia-smi`; a card in MIG mode needs MIG devices (`nvidia-smi mig`)",
        )
    terms = [f"{kind}={a.uuid}" for a in adverts]
    return {
        "kind": kind,
        "variable": env_var(kind),
        "resources": [dict(card_json(a), term=t) for a, t in zip(adverts, terms)],
        "skipped": [{"index": c.index, "uuid": c.uuid, "why": why} for c, why in skipped],
        "daemon_json": {
            "node-generic-resources": terms,
            "default-runtime": RUNTIME_NAME,
            "runtimes": {RUNTIME_NAME: {"path": runtime_path}},
        },
        "toolkit_config": {SWARM_RESOURCE: env_var(kind)},
        "paths": {"daemon_json": daemon_json, "toolkit_config": toolkit_config},
    }


def render_text(data: dict[str, Any]) -> str:
    paths, kind = data["paths"], data["kind"]
    n_mig = sum(1 for r in data["resources"] if r["parent"])
    what = f"{len(data['resources']) - n_mig} card(s)" + (f" and {n_mig} MIG device(s)" if n_mig else "")
    lines = [
        f"# Docker Swarm resources of this host: {what}, kind {kind}.",
        f"# 1. Merge into {paths['daemon_json']}, then restart dockerd:",
        json.dumps(data["daemon_json"], indent=2),
        f"# 2. Set at the top of {paths['toolkit_config']} (before any [section]):",
        f'{SWARM_RESOURCE} = "{data["toolkit_config"][SWARM_RESOURCE]}"',
        f"# 3. Services ask for cards by count: docker service create --generic-resource {kind}=1 IMAGE ...",
        f"#    (a stack file: deploy.resources.reservations.generic_resources, discrete_resource_spec kind {kind})",
    ]
    lines += [
        f"# Left out: index {s['index']}{' ' + s['uuid'] if s['uuid'] else ''}: {s['why']}" for s in data["skipped"]
    ]
    lines.append("# Then check the node: hostagent swarm node-config --check")
    return "\n".join(lines) + "\n"


def command(
    kind: str | None, as_json: bool, do_check: bool, daemon_json: str, toolkit_config: str, runtime_path: str | None
) -> int:
    """`hostagent swarm node-config`: 0 (printed, or a clean check), 64 (a check found errors, or bad usage),
    69 (NVML unusable)."""
    if kind is not None:
        check_kind(kind)
    if do_check and runtime_path is not None:
        raise UsageError(
            "--runtime-path goes with printing the settings, not with --check",
            "--check reads the runtime's path from daemon.json",
        )
    cards = nvml.list_cards(mig=True, tolerate_lost=True)
    if not do_check:
        data = render(cards, kind or DEFAULT_KIND, runtime_path or RUNTIME_PATH, daemon_json, toolkit_config)
        sys.stdout.write(json.dumps(data, indent=2) + "\n" if as_json else render_text(data))
        return 0
    result = check(read_daemon_json(daemon_json), read_toolkit_config(toolkit_config), cards, kind)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        for f in result.findings:
            sys.stdout.write(f.line() + "\n")
        if result.ok:
            sys.stdout.write(result.summary() + "\n")
    return 0 if result.ok else EX_USAGE

"""`hostagent ls --swarm`: every node of a Docker Swarm, every card it advertises, which task of which service holds
each, the free ones, and the tasks that wait for cards, with Swarm's own reason. Read from a manager (/nodes,
/tasks, /services) in one listing; only this node's cards are resolved through NVML. Exit 69 when Docker is
unavailable or the daemon is no manager (docs/swarm.md, "What the swarm holds").
"""

from __future__ import annotations

import sys

from gpupin.core.errors import GpupinError
from gpupin.hostagent.swarm.resources import GenericResource, card_json, lookup, names_a_gpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.hostagent.swarm.cluster import Cluster, Node, Task


def _task(t: Task, cluster: Cluster, nodes: dict[str, Node]) -> dict[str, Any]:
    service = cluster.services.get(t.service_id, t.service_id[:12])
    node = nodes.get(t.node_id)
    return {
        "id": t.id,
        "name": t.name(service),
        "service": service,
        "service_id": t.service_id,
        "slot": t.slot,
        "state": t.state,
        "desired_state": t.desired,
        "node": node.hostname if node else t.node_id or None,
        "container_id": t.container_id or None,
    }


def _resource(
    r: GenericResource, holder: dict[str, Any] | None, cards: Sequence[Card] | None, advertised: bool = True
) -> dict[str, Any]:
    found = lookup(r.value, cards) if cards else None
    return {
        "kind": r.kind,
        "value": r.value,
        "card": card_json(found) if found is not None else None,
        "held_by": holder,
        "advertised": advertised,
    }


def gather(cluster: Cluster, local: tuple[str, Sequence[Card]] | None = None) -> dict[str, Any]:
    """The listing as data (what --json prints). `local`: the node this host is and its cards as NVML sees them,
    or None when unknown."""
    self_id, local_cards = local if local is not None else ("", None)
    nodes = {n.id: n for n in cluster.nodes}
    held: dict[tuple[str, str, str], dict[str, Any]] = {}  # (node, kind, value) -> the task holding it
    discrete_used: dict[tuple[str, str], int] = {}
    for t in cluster.tasks:
        if not t.holds:
            continue
        for r in t.assigned:
            if r.discrete:
                key2 = (t.node_id, r.kind)
                discrete_used[key2] = discrete_used.get(key2, 0) + int(r.value)
            else:
                held[(t.node_id, r.kind, r.value)] = _task(t, cluster, nodes)
    out_nodes: list[dict[str, Any]] = []
    for n in sorted(cluster.nodes, key=lambda n: (n.role != "manager", n.hostname, n.id)):
        cards = local_cards if n.id == self_id else None
        named = [r for r in n.resources if not r.discrete]
        rows = [_resource(r, held.pop((n.id, r.kind, r.value), None), cards) for r in named]
        # A task holding what its node no longer advertises (a daemon.json changed under it): still held.
        rows += [
            _resource(GenericResource(kind, value), task, cards, advertised=False)
            for (node_id, kind, value), task in sorted(held.items())
            if node_id == n.id
        ]
        out_nodes.append(
            {
                "id": n.id,
                "hostname": n.hostname,
                "role": n.role,
                "leader": n.leader,
                "self": n.id == self_id,
                "availability": n.availability,
                "state": n.state,
                "addr": n.addr,
                "schedulable": n.schedulable,
                "resources": rows,
                "discrete": [
                    {"kind": r.kind, "total": int(r.value), "used": discrete_used.get((n.id, r.kind), 0)}
                    for r in n.resources
                    if r.discrete
                ],
            }
        )
    pending = [
        {
            **_task(t, cluster, nodes),
            "why": t.err or t.message or "not placed yet",
            "reserves": [r.term for r in t.reserves],
        }
        for t in cluster.tasks
        if t.waiting
    ]
    pending.sort(key=lambda p: (p["service"], p["slot"], p["id"]))
    every = [r for n in out_nodes for r in n["resources"]]
    return {
        "node_id": self_id or None,
        "nodes": out_nodes,
        "pending": pending,
        "summary": {
            "nodes": len(out_nodes),
            "resources": len(every),
            "held": sum(1 for r in every if r["held_by"]),
            "free": sum(1 for r in every if not r["held_by"]),
            "pending": len(pending),
        },
    }


# --- text ------------------------------------------------------------------------------------------------------


def _held_by(r: dict[str, Any], node: dict[str, Any]) -> str:
    h = r["held_by"]
    if h is None:
        return "free" if node["schedulable"] else f"free (node {node['availability']}, {node['state']})"
    text = f"{h['name']} ({h['id'][:12]}, {h['state']})"
    if not r["advertised"]:
        text += " [no longer advertised by the node]"
    if node["state"] != "ready":
        # Swarm keeps the last state a node reported until it comes back (and then stops what it was told to).
        text += f" [node {node['state']}: as last reported]"
    return text


def render(data: dict[str, Any]) -> str:
    rows = [("NODE", "ROLE", "STATUS", "RESOURCE", "BUS ID", "NAME", "HELD BY")]
    for n in data["nodes"]:
        role = "leader" if n["leader"] else n["role"]
        status = f"{n['state']}/{n['availability']}"
        first = (n["hostname"] + (" *" if n["self"] else ""), role, status)
        if not n["resources"] and not n["discrete"]:
            rows.append((*first, "-", "", "", "no generic resources"))
        for i, r in enumerate(n["resources"]):
            card = r["card"] or {}
            rows.append(
                (
                    *(first if i == 0 else ("", "", "")),
                    f"{r['kind']}={r['value']}",
                    card.get("bus_id") or "-",
                    card.get("name") or "-",
                    _held_by(r, n),
                )
            )
        for j, d in enumerate(n["discrete"]):
            rows.append(
                (
                    *(first if not n["resources"] and j == 0 else ("", "", "")),
                    f"{d['kind']}={d['total']}",
                    "",
                    "",
                    f"{d['used']} of {d['total']} reserved",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    for p in data["pending"]:
        reserves = f" (reserves {', '.join(p['reserves'])})" if p["reserves"] else ""
        lines.append(f"PENDING  {p['name']} ({p['id'][:12]}){reserves}: {p['why']}")
    s = data["summary"]
    lines.append(
        f"{s['nodes']} node(s), {s['resources']} advertised resource(s): {s['held']} held, {s['free']} "
        f"free; {s['pending']} task(s) pending"
    )
    return "\n".join(lines) + "\n"


# --- the command -----------------------------------------------------------------------------------------------


def local_node(cluster: Cluster) -> tuple[str, list[Card]] | None:
    """The node this host is, and its cards: when hostagent talks to its own daemon (a unix socket), the node that
    advertises cards NVML sees here (UUIDs are unique across machines). Anything NVML cannot do leaves the cards
    unresolved; it never fails the listing."""
    from gpupin.hostagent import engine

    if engine.endpoint().unix_path is None or not any(
        names_a_gpu(r.value) for n in cluster.nodes for r in n.resources if not r.discrete
    ):
        return None
    try:
        from gpupin.core import nvml

        cards = nvml.list_cards(mig=True, tolerate_lost=True)
    except Exception:
        return None
    here = {c.uuid for c in cards if c.uuid} | {m.uuid for c in cards for m in c.mig_devices}
    for n in cluster.nodes:
        if any(not r.discrete and r.value in here for r in n.resources):
            return n.id, cards
    return None


def command(as_json: bool) -> int:
    """`hostagent ls --swarm [--json]`."""
    import json

    from gpupin.hostagent import engine
    from gpupin.hostagent.swarm import cluster as swarm

    try:
        cluster = swarm.read(engine.reader(timeout=10))
    except GpupinError:
        raise
    except Exception as err:
        if not engine.is_daemon_failure(err):
            raise
        raise engine.failure(err, "reading the swarm") from None
    data = gather(cluster, local_node(cluster))
    sys.stdout.write(json.dumps(data) + "\n" if as_json else render(data))
    return 0

"""The ledger's rows for cards reached through device nodes: `--device` files and folders, bind mounts of GPU
nodes that the device cgroup lets through, device-cgroup rules that let the container make its own node, and
`--privileged` with the NVIDIA toolkit. Nodes count by the major:minor they grant (gpupin.hostagent.ledger.nodes):
on a daemon of this host by what is there, symlinks resolved; on another, by name."""

from __future__ import annotations

from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger import nodes
from gpupin.hostagent.ledger.grant import Grant, Host, cdi_gpus, host_config, nvidia_requests, runtime

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any


def _minors(path: str, host: Host, deep: bool) -> tuple[list[int] | None, bool]:
    """The card minors a host path reaches (None: every card) and whether it reaches any GPU node at all."""
    if host.local:
        try:
            found = nodes.local_nodes(path, deep)
        except nodes.TooBig:
            return None, True
        if found is not None:
            cards = [m for _, major, minor in found if (m := nodes.card_minor(major, minor)) is not None]
            return cards, bool(found)
    minors = nodes.named_minors(path)
    return minors, nodes.named(path) or bool(minors)


def device_files(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`--device PATH`: a GPU node, or a folder whose every GPU node docker hands over (/dev/nvidiaN is the card
    of minor N; nvidiactl, nvidia-uvm and the caps name no card)."""
    grants = []
    for dev in host_config(c).get("Devices") or []:
        path = str(dev.get("PathOnHost") or "")
        if cdi.parse(path) is not None:
            continue  # a CDI name (the cdi row)
        minors, reaches = _minors(path, host, deep=True)
        if not reaches:
            continue
        uuids, unknown = host.by_minors(minors, path)
        if not (uuids or unknown):
            continue  # nvidiactl, nvidia-uvm, the caps: needed beside a card, name none
        grants.append(Grant("device-file", f"--device {path}", uuids, unknown))
    return grants


class Rule:
    """One device-cgroup rule (`TYPE MAJOR:MINOR ACCESS`, as `--device-cgroup-rule` writes it) as it concerns
    the cards: the card minors it allows (None: all), and whether it lets a node be made (`m`) or opened."""

    __slots__ = ("make", "minors", "open", "text")

    def __init__(self, text: str, minors: list[int] | None, access: str) -> None:
        self.text = text
        self.minors = minors
        self.make = "m" in access
        self.open = "r" in access or "w" in access

    @classmethod
    def parse(cls, text: str) -> Rule | None:
        """The rule when it allows NVIDIA's major 195 (`c 195:* rwm`, `a *:* rwm`, `a`), else None."""
        parts = text.split()
        if parts == ["a"]:
            return cls(text, None, "rwm")
        if len(parts) != 3 or parts[0] not in ("a", "c"):
            return None
        major, _, minor = parts[1].partition(":")
        if major not in ("*", str(nodes.NVIDIA_MAJOR)):
            return None
        if minor == "*":
            return cls(text, None, parts[2])
        if not minor.isdigit() or nodes.card_minor(nodes.NVIDIA_MAJOR, int(minor)) is None:
            return None
        return cls(text, [int(minor)], parts[2])


def _rules(c: Mapping[str, Any]) -> list[Rule]:
    return [r for r in (Rule.parse(str(t)) for t in host_config(c).get("DeviceCgroupRules") or []) if r is not None]


def _within(minors: list[int] | None, allowed: list[int] | None) -> list[int] | None:
    """The minors of both (None: all)."""
    if allowed is None:
        return minors
    return allowed if minors is None else [m for m in minors if m in allowed]


def _can_mknod(c: Mapping[str, Any]) -> bool:
    """CAP_MKNOD, which docker keeps by default, unless dropped (and not added back)."""
    hc = host_config(c)

    def names(key: str) -> set[str]:
        return {str(x).upper().removeprefix("CAP_") for x in hc.get(key) or []}

    return not ({"MKNOD", "ALL"} & names("CapDrop")) or bool({"MKNOD", "ALL"} & names("CapAdd"))


def device_cgroup(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """A device-cgroup rule granting major 195 (`--device-cgroup-rule 'c 195:* rwm'`) with `m`, in a container
    that keeps CAP_MKNOD: it can make /dev/nvidiaN itself and open it, mount or none."""
    if not _can_mknod(c):
        return []
    grants = []
    for rule in _rules(c):
        if rule.make and rule.open:
            uuids, unknown = host.by_minors(rule.minors, "195")
            grants.append(Grant("device-cgroup", f"--device-cgroup-rule '{rule.text}'", uuids, unknown))
    return grants


def _binds(c: Mapping[str, Any]) -> Sequence[tuple[str, str]]:
    """(host path, container path) of each bind mount, as the daemon records them (Mounts: -v and --mount)."""
    return [
        (str(m.get("Source") or ""), str(m.get("Destination") or ""))
        for m in c.get("Mounts") or []
        if m.get("Type") == "bind"
    ]


def bind_mounts(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """A bind mount of GPU nodes (`-v /dev:/dev`, a folder holding `c 195:1`) that a device-cgroup rule lets the
    container open: the cards of the nodes it brings in, within what the rule allows."""
    rules = [r for r in _rules(c) if r.open]
    if not rules:
        return []
    grants = []
    for source, target in _binds(c):
        minors, reaches = _minors(source, host, deep=False)
        if not reaches:
            continue
        for rule in rules:
            allowed = _within(minors, rule.minors)
            if allowed is None or allowed:  # a node that names no card grants none
                uuids, unknown = host.by_minors(allowed, source)
                grants.append(
                    Grant("bind-mount", f"-v {source}:{target} --device-cgroup-rule '{rule.text}'", uuids, unknown)
                )
    return grants


def privileged(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`--privileged` with the NVIDIA driver put in by the toolkit (the nvidia runtime, a --gpus request, or an
    nvidia.com/gpu CDI device): a privileged container gets every /dev/nvidiaN of the host, so every card, whatever
    NVIDIA_VISIBLE_DEVICES or the request says."""
    if not host_config(c).get("Privileged"):
        return []
    name = runtime(c)
    if host.is_nvidia_runtime(name):
        return [Grant("privileged", f"--privileged --runtime {name}", host.every_card())]
    if nvidia_requests(c):
        return [Grant("privileged", "--privileged --gpus", host.every_card())]
    if cdi_gpus(c):
        return [Grant("privileged", f"--privileged --device {cdi.KIND}", host.every_card())]
    return []

"""Docker Swarm's generic resources, as a GPU node advertises them, matched to the cards NVML sees: the pure core
of `node-config`. It parses a node's resources in both spellings (daemon.json's strings, the engine's node
description) as swarmkit does, names the variable a kind becomes, says what a host should advertise (cards, or
MIG devices where MIG is on) and which card each value is (docs/swarm.md, "How a node's resources are read").
"""

from __future__ import annotations

import re

from gpupin.core.contract import SWARM_PREFIX
from gpupin.core.errors import GpuSpecError, UsageError
from gpupin.core.identity import is_full_uuid, is_uuid_like
from gpupin.core.resolve import Target, resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card

DEFAULT_KIND = "GPU"
DAEMON_JSON = "/etc/docker/daemon.json"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
RUNTIME_PATH = "nvidia-container-runtime"  # what `nvidia-ctk runtime configure --runtime=docker` writes
RUNTIME_NAME = "nvidia"  # the runtime daemon.json names, as its default-runtime
SWARM_RESOURCE = "swarm-resource"  # the toolkit's setting that names the variable its hook reads
# What `docker service create --generic-resource` and daemon.json accept as a kind without surprises: no `=`
# or `,` (the separators), no blanks (trimmed away), nothing a shell or an env file would mangle.
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_KIND_HINT = "a kind is letters, digits, '_', '.' and '-' (GPU is what the NVIDIA toolkit's default reads)"


class GenericResourceError(UsageError):
    """Generic resources that Docker itself would refuse to parse (exit 64)."""


def check_kind(kind: str) -> str:
    if not _KIND.fullmatch(kind):
        raise UsageError(f"{kind!r} is not a usable generic resource kind", _KIND_HINT)
    return kind


def env_var(kind: str) -> str:
    """The variable Swarm gives a task for the resources of `kind` (swarmkit's EnvFormat)."""
    return (SWARM_PREFIX + kind).upper()


class GenericResource:
    """One generic resource of a node: a named one (`GPU=GPU-1c5e...`) or a discrete count (`GPU=4`)."""

    __slots__ = ("discrete", "kind", "value")

    def __init__(self, kind: str, value: str, discrete: bool = False) -> None:
        self.kind = kind
        self.value = value
        self.discrete = discrete

    @property
    def term(self) -> str:
        """The daemon.json spelling."""
        return f"{self.kind}={self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GenericResource) and (self.kind, self.value, self.discrete) == (
            other.kind,
            other.value,
            other.discrete,
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.value, self.discrete))

    def __repr__(self) -> str:
        return f"GenericResource({self.term}{', discrete' if self.discrete else ''})"


def _is_int(text: str) -> bool:
    try:
        int(text, 10)
    except ValueError:
        return False
    return True


def parse_terms(terms: Iterable[str], source: str = "node-generic-resources") -> list[GenericResource]:
    """Parse daemon.json's `node-generic-resources` (or dockerd's `--node-generic-resource` values) as swarmkit
    does; raise GenericResourceError where dockerd would refuse to start. The order of the terms is kept."""
    by_kind: dict[str, list[str]] = {}
    for term in terms:
        if not isinstance(term, str):
            raise GenericResourceError(f"{source}: {term!r} is not a string", 'write each as "KIND=VALUE"')
        parts = term.split("=")
        if len(parts) != 2:
            raise GenericResourceError(
                f"{source}: {term!r} is not KIND=VALUE", 'write each resource as "GPU=GPU-<uuid>", one per card'
            )
        by_kind.setdefault(parts[0].strip(), []).append(parts[1].strip())
    out: list[GenericResource] = []
    for kind, values in by_kind.items():
        if len(values) == 1 and _is_int(values[0]):
            if int(values[0]) < 0:
                raise GenericResourceError(
                    f"{source}: {kind}={values[0]} is a negative count", f"advertise one {kind}=<UUID> per card"
                )
            out.append(GenericResource(kind, values[0], discrete=True))
        elif not any(_is_int(v) for v in values):
            out.extend(GenericResource(kind, v) for v in values)
        else:
            raise GenericResourceError(
                f"{source}: {kind} mixes counts and names ({', '.join(values)})",
                f"name each card by UUID: {kind}=GPU-<uuid>",
            )
    return out


def from_engine(resources: Iterable[Mapping[str, Any]] | None) -> list[GenericResource]:
    """A node's resources as the engine describes them (`docker node inspect`:
    .Description.Resources.GenericResources, or what Swarm gave a task)."""
    out: list[GenericResource] = []
    for r in resources or ():
        named, discrete = r.get("NamedResourceSpec"), r.get("DiscreteResourceSpec")
        if isinstance(named, dict):
            out.append(GenericResource(str(named.get("Kind", "")), str(named.get("Value", ""))))
        elif isinstance(discrete, dict):
            out.append(GenericResource(str(discrete.get("Kind", "")), str(discrete.get("Value", 0)), True))
    return out


def card_json(target: Target) -> dict[str, Any]:
    """A card or MIG device as the JSON outputs show it."""
    return {
        "uuid": target.uuid,
        "index": target.card.index,
        "bus_id": str(target.card.bus_id),
        "name": target.name,
        "parent": target.card.uuid if target.mig is not None else None,
    }


def advertisable(cards: Sequence[Card]) -> tuple[list[Target], list[tuple[Card, str]]]:
    """What a node should advertise, in NVML order: each whole card, or, for a card in MIG mode, each of its MIG
    devices (the whole card is no CUDA device then). Also the cards left out, each with why."""
    adverts: list[Target] = []
    skipped: list[tuple[Card, str]] = []
    for card in cards:
        if card.error is not None or card.uuid is None:
            skipped.append((card, f"NVML cannot read it: {card.error}"))
        elif card.mig_mode:
            if not card.mig_devices:
                skipped.append((card, "MIG mode is on but no MIG device is configured"))
            adverts.extend(Target(card, m) for m in card.mig_devices)
        else:
            adverts.append(Target(card))
    return adverts, skipped


def names_a_gpu(value: str) -> bool:
    """Whether a resource value is meant as a GPU or MIG UUID (full, or a prefix of one)."""
    return is_uuid_like(value)


def lookup(value: str, cards: Sequence[Card]) -> Target | None:
    """The card or MIG device a full UUID names on this host (the shared resolver's rules), or None. A prefix names
    nothing here: the runtime takes only full UUIDs."""
    if not is_full_uuid(value):
        return None
    try:
        return resolve(value, cards)
    except GpuSpecError:
        return None


def gpu_kinds(resources: Iterable[GenericResource]) -> list[str]:
    """The kinds (in order of appearance) under which a node advertises GPU or MIG UUIDs."""
    kinds: list[str] = []
    for r in resources:
        if not r.discrete and names_a_gpu(r.value) and r.kind not in kinds:
            kinds.append(r.kind)
    return kinds

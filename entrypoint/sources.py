"""Where the expectation comes from: readers tried in order, the first that names cards wins (docs/design.md,
Expectation sources).

A reader answers an `Expectation`, a `Fallback` (indices only: taken when no later source names cards), a
reason (set but names no card: said in the unpinned line), None (absent), or ELSEWHERE (it hands over to
another source). A reader that needs NVML asks the `Context`, which reads the cards once, and only then.
"""

from __future__ import annotations

import os

from gpupin.core.contract import (
    DEVICE_LIST_DIR,
    DEVICE_LIST_DIR_VAR,
    DRA_DIR,
    DRA_DIR_VAR,
    EXPECT_VAR,
    NVD_VAR,
    SLURM_GPU_VARS,
    SWARM_PREFIX,
    VOID,
    nvd_keyword,
)
from gpupin.core.errors import CardUnhealthyError, GpupinError, shorten, shown
from gpupin.core.expectation import Expectation, ExpectedCard, parse_expect
from gpupin.core.identity import WHOLE, index_key, is_full_uuid, is_uuid_like

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Union

    from gpupin.core.nvml import Card
    from gpupin.core.resolve import Target

    Answer = Union[Expectation, "Fallback", str, None, "_Elsewhere"]

# The Kubernetes device plugin's volume-mounts strategy: NVIDIA_VISIBLE_DEVICES names DEVICE_LIST_DIR, which holds
# an empty file per device, named by its id. GPUPIN_DEVICE_LIST_DIR moves it (for tests; never needed in a pod).


class _Elsewhere:
    """A source that points at another one (NVIDIA_VISIBLE_DEVICES naming the device plugin's folder)."""


ELSEWHERE = _Elsewhere()


class Fallback:
    """An expectation from indices: the order of the devices a runtime was told to give, not their identity."""

    __slots__ = ("expectation",)

    def __init__(self, expectation: Expectation) -> None:
        self.expectation = expectation


class Context:
    """What a reader may use: the environment, and the cards NVML sees (read on first use, at most once)."""

    __slots__ = ("_cards", "_read_cards", "env")

    def __init__(self, env: Mapping[str, str], cards: Callable[[], list[Card]] | None = None) -> None:
        self.env = env
        self._read_cards = cards
        self._cards: list[Card] | None = None

    def cards(self) -> list[Card]:
        if self._cards is None:
            if self._read_cards is None:
                from gpupin.core import nvml

                # A lost card stops only what asked for it (gpupin.entrypoint.align.plan): read the others.
                self._cards = nvml.list_cards(mig=True, tolerate_lost=True)
            else:
                self._cards = self._read_cards()
        return self._cards

    @property
    def cards_read(self) -> list[Card] | None:
        """The cards, if a reader already needed them (the caller then need not ask NVML again)."""
        return self._cards


def _uuid_list(value: str) -> list[str] | None:
    """The entries of a comma list when every one is UUID-like, else None."""
    entries = [e.strip() for e in value.split(",")]
    if not entries or not all(entries) or not all(is_uuid_like(e) for e in entries):
        return None
    return entries


def gpupin_expect(ctx: Context) -> Answer:
    """GPUPIN_EXPECT, written by hostagent, compose rendering or by hand. Set but malformed is an error."""
    value = ctx.env.get(EXPECT_VAR)
    return None if value is None else parse_expect(value)


def dra_metadata(ctx: Context) -> Answer:
    """Kubernetes DRA device metadata (KEP-5304): the GPUs of the claims this container references, as the DRA
    driver records them (gpupin.entrypoint.dra). One stat where there is none (GPUPIN_DRA_METADATA_DIR moves the
    folder, for tests)."""
    path = ctx.env.get(DRA_DIR_VAR) or DRA_DIR
    if not os.path.isdir(path):
        return None
    from gpupin.entrypoint import dra  # only in a DRA pod: start-up stays short elsewhere

    return dra.read(path, ctx.cards)


def _by_index(ctx: Context, entries: list[str], keys: list[tuple[int, int]], source: str, named: str) -> Answer:
    """Cards named by host NVML index or MIG `i:j`, as far as they can be known here (the module's docstring)."""
    from gpupin.core.resolve import Target, resolve

    cards = ctx.cards()
    seen = [Target(c, m) for c in cards for m in (c.mig_devices if c.mig_mode else [None])]
    if len(set(keys)) != len(keys):
        return f"{named} lists a device twice"
    targets: list[Target] = []
    if len(seen) == len(keys):  # exactly the named devices are here: the k-th smallest name is the k-th seen
        ranked = sorted(keys)
        for key in keys:
            target = seen[ranked.index(key)]
            if (key[1] != WHOLE) != (target.mig is not None):
                return (
                    f"{named} names {'a MIG device' if key[1] != WHOLE else 'a whole card'} where this container "
                    f"sees {'a MIG device' if target.mig is not None else 'a whole card'}"
                )
            targets.append(target)
        how = f"indices renumbered by the runtime: the {len(seen)} device(s) it exposed, in bus order"
    else:
        try:
            targets = [resolve(e, cards) for e in entries]
        except GpupinError:
            return (
                f"{named} names devices by host index, which the {len(seen)} device(s) NVML sees here cannot "
                "resolve (a container sees only the devices it was given, numbered from 0)"
            )
        how = "indices as NVML numbers this host's cards"
    lost = [t.card for t in targets if t.card.uuid is None]
    if lost:
        raise CardUnhealthyError(
            f"{named} names the card at NVML index {lost[0].index}, which NVML cannot read "
            f"({lost[0].error or 'unreadable'})",
            "see `nvidia-smi` and the kernel log (Xid 79: "
            "fallen off the bus); a lost card needs a reset (`nvidia-smi -r`) or a reboot",
        )
    return Fallback(Expectation([ExpectedCard(t.uuid, t.card.bus_id) for t in targets], source, f"{named} ({how})"))


def _named(ctx: Context, entries: list[str], source: str, named: str, ordered: bool = True) -> Answer:
    """Devices named by a runtime or scheduler: full UUIDs (in the order given, or, `ordered=False`, NVML's),
    else indices and MIG pairs; a reason for anything else."""
    if entries and all(is_full_uuid(e) for e in entries):
        if not ordered:
            position = {u: i for i, c in enumerate(ctx.cards()) for u in (c.uuid, *(m.uuid for m in c.mig_devices))}
            entries = sorted(entries, key=lambda e: (position.get(e, len(position)), e))
        return parse_expect(",".join(entries), source)
    keys = [index_key(e) for e in entries]
    if entries and all(k is not None for k in keys):
        return _by_index(ctx, entries, [k for k in keys if k is not None], source, named)
    return f"{named} names no card by UUID or index"


def nvidia_visible_devices(ctx: Context) -> Answer:
    """NVIDIA_VISIBLE_DEVICES when it names cards: UUIDs (docker --gpus device=UUID, the Kubernetes device
    plugin), indices and MIG pairs where they can be resolved (--gpus device=1, the plugin's index strategy)."""
    value = ctx.env.get(NVD_VAR)
    if value is None:
        return None
    v = nvd_keyword(value)
    if v == VOID:
        return f"{NVD_VAR}=void: the cards came through CDI, which names none inside the container"
    if v == "":
        return f"{NVD_VAR} is empty: no GPU was asked for"
    if v is not None:
        return f"{NVD_VAR}={v} names no particular card"
    if value.strip() in (DEVICE_LIST_DIR, ctx.env.get(DEVICE_LIST_DIR_VAR)):
        return ELSEWHERE  # the device plugin's folder: its reader reads it
    entries = [e.strip() for e in value.split(",")]
    named = f"{NVD_VAR}={shown(value)}"
    if all(is_uuid_like(e) for e in entries) and not all(is_full_uuid(e) for e in entries):
        return f"{named} names no card by full UUID"  # the toolkit takes whole UUIDs only
    return _named(ctx, entries, NVD_VAR, named)


def device_list_dir(ctx: Context) -> Answer:
    """The Kubernetes device plugin's volume-mounts strategy: one empty file per device in
    /var/run/nvidia-container-devices (GPUPIN_DEVICE_LIST_DIR), named by its id (a UUID, or an index with the
    plugin's index strategy); subfolders (`imex/`) name no GPU. The folder has no order: UUIDs are taken in NVML's."""
    path = ctx.env.get(DEVICE_LIST_DIR_VAR) or DEVICE_LIST_DIR
    named = ctx.env.get(NVD_VAR, "").strip() in (path, DEVICE_LIST_DIR)
    try:
        with os.scandir(path) as it:
            ids = sorted(e.name for e in it if not e.is_dir())
    except OSError as err:
        return f"{NVD_VAR} names {path}, which cannot be read ({err.strerror})" if named else None
    if not ids:
        return f"{path} (the device plugin's volume-mounts list) names no device" if named else None
    return _named(ctx, ids, path, f"{path} lists {','.join(ids)}", ordered=False)


def swarm_resources(ctx: Context) -> Answer:
    """Swarm's generic resources: DOCKER_RESOURCE_<KIND>, named after the resource kind (the toolkit's default
    is DOCKER_RESOURCE_GPU, tried first). They are the cards the task reserved, so they are all the runtime may
    expose (`sole`): more visible cards mean the runtime did not read the variable."""
    keys = sorted(k for k in ctx.env if k.startswith(SWARM_PREFIX))
    keys.sort(key=lambda k: (k != "DOCKER_RESOURCE_GPU", "GPU" not in k.upper(), k))
    for key in keys:
        if _uuid_list(ctx.env[key]) is not None:
            expectation = parse_expect(ctx.env[key], key)
            expectation.sole = _swarm_fallback(key, ctx.env.get(NVD_VAR))
            return expectation
    return f"{', '.join(keys)} name(s) no GPU UUID" if keys else None


def _swarm_fallback(key: str, nvd: str | None) -> str:
    """Why a Swarm task sees cards it did not reserve: the NVIDIA runtime reads DOCKER_RESOURCE_<KIND> only when
    its config's swarm-resource names it, and otherwise falls back to NVIDIA_VISIBLE_DEVICES (`all` in CUDA
    images): the node advertises a kind its runtime does not read (Docker's example kind NVIDIA-GPU against the
    toolkit's DOCKER_RESOURCE_GPU is the classic case)."""
    here = f" ({NVD_VAR}={shorten(nvd, 40)} here)" if nvd is not None else ""
    return (
        f"the NVIDIA runtime did not read {key}: the node advertises {key[len(SWARM_PREFIX) :]} resources, but "
        f"its runtime's swarm-resource does not name {key}, so it fell back to {NVD_VAR}{here}; run `hostagent "
        f"swarm node-config --check` on that node (`docker service ps` names it) and set swarm-resource = "
        f'"{key}" in its /etc/nvidia-container-runtime/config.toml'
    )


def slurm_allocation(ctx: Context) -> Answer:
    """Slurm's SLURM_STEP_GPUS / SLURM_JOB_GPUS (places in the node's gres.conf), in the order of Slurm's
    CUDA_VISIBLE_DEVICES."""
    if not any(v in ctx.env for v in SLURM_GPU_VARS):
        return None
    from gpupin.entrypoint import slurm  # only inside a Slurm job (it reads gres.conf): start-up stays short elsewhere

    return slurm.read(ctx.env, ctx.cards)


# (what the unpinned line calls the source when it is absent, its reader): docs/design.md, Expectation sources.
READERS: Sequence[tuple[str, Callable[[Context], Answer]]] = (
    (EXPECT_VAR, gpupin_expect),
    ("", dra_metadata),  # a folder: not named among the unset ones
    (NVD_VAR, nvidia_visible_devices),
    ("", device_list_dir),  # a folder, not a variable: not named among the unset ones
    (SWARM_PREFIX + "*", swarm_resources),
    ("/".join(SLURM_GPU_VARS), slurm_allocation),
)


class Found:
    """The expectation (or None) and, for the unpinned line, why the sources tried before named no card."""

    __slots__ = ("context", "expectation", "reasons")

    def __init__(self, expectation: Expectation | None, reasons: list[str], context: Context) -> None:
        self.expectation = expectation
        self.reasons = reasons
        self.context = context

    def why_unpinned(self) -> str:
        """One clause that says why no source named a card."""
        return "; ".join(self.reasons)


def find(env: Mapping[str, str], cards: Callable[[], list[Card]] | None = None) -> Found:
    """Try the readers in order; the first that names cards gives the expectation, else the first fallback."""
    ctx = Context(env, cards)
    reasons: list[str] = []
    absent: list[str] = []
    fallback: Fallback | None = None
    for name, reader in READERS:
        answer = reader(ctx)
        if isinstance(answer, Expectation):
            return Found(answer, reasons, ctx)
        if isinstance(answer, Fallback):
            fallback = fallback or answer
        elif answer is None:
            if name:
                absent.append(name)
        elif isinstance(answer, str):
            reasons.append(answer)
    if fallback is not None:
        return Found(fallback.expectation, reasons, ctx)
    if absent:
        reasons.append(f"{', '.join(absent)} unset")
    return Found(None, reasons, ctx)


def from_environ(env: Mapping[str, str]) -> Expectation | None:
    """The expectation from the first source that names physical cards, or None."""
    return find(env).expectation

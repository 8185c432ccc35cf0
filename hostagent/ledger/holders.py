"""The holders of each card: what the engine gives each container (the rows of
gpupin.hostagent.ledger.holding_forms.FORMS)
and the processes no grant explains; pure functions over inspect data and the cards. Also when a container holds
(`holding`: docs/ledger.md, "When a container holds"), which gpupin labels are its own rather than its image's,
and whether gpupin-entrypoint proved its cards (`verified`). docs/design.md, "The ledger".
"""

from __future__ import annotations

from gpupin.core.contract import EXPECT_VAR, LABEL_PREFIX
from gpupin.core.contract import LABEL as LABEL  # the ledger reads the labels the pin writes
from gpupin.core.contract import SHARED_LABEL as SHARED_LABEL
from gpupin.core.errors import EX_MISALIGNED, EX_UNAVAILABLE, EX_USAGE, GpupinError, shown
from gpupin.core.resolve import resolve
from gpupin.hostagent.ledger import booking, lease
from gpupin.hostagent.ledger.holding_forms import WAY, grants
from gpupin.hostagent.ledger.lease import OWNER_LABEL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.hostagent.ledger.booking import Booking
    from gpupin.hostagent.ledger.holding_forms import CardGrant, HostCards


LIVE_STATES = frozenset({"running", "paused", "restarting"})
_NEVER_STARTED = "0001-01-01T00:00:00Z"
STARTING = "being started by hostagent"  # why a created container holds while its hostagent's lease lives


def holding(inspect: Mapping[str, Any], lease_state: str | None = None) -> str | None:
    """Why the container holds its cards now, or None when it does not."""
    st = inspect.get("State") or {}
    status = str(st.get("Status") or "")
    if status in LIVE_STATES:
        return status
    if status == "created":
        return STARTING if lease_state == lease.LIVE else None
    if status != "exited" or str(st.get("StartedAt") or _NEVER_STARTED).startswith("0001-"):
        return None  # dead, removing, or never started: the daemon's restore starts none of them
    policy = (inspect.get("HostConfig") or {}).get("RestartPolicy") or {}
    name = policy.get("Name") or "no"
    if name in ("always", "unless-stopped"):
        # unless-stopped: whether it was stopped by hand (then it stays down) is not in the Engine API; counted.
        return f"stopped, restart={name}"
    if name == "on-failure" and int(st.get("ExitCode") or 0) != 0:
        retries = int(policy.get("MaximumRetryCount") or 0)
        if retries == 0 or int(inspect.get("RestartCount") or 0) < retries:
            return "stopped, restart=on-failure"
    return None


def worth_inspecting(state: str, lease_state: str | None) -> bool:
    """Whether a container of this list state may hold cards, so that its full inspect data must be read."""
    return state in LIVE_STATES or state == "exited" or (state == "created" and lease_state == lease.LIVE)


def gpupin_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX)}


def not_inherited(labels: Mapping[str, str], image_labels: Mapping[str, str]) -> dict[str, str]:
    """The container's labels without the gpupin labels it inherited from its image (`image_labels`)."""
    ours = gpupin_labels(labels)
    if not ours or not gpupin_labels(image_labels):
        return dict(labels)
    if OWNER_LABEL in ours and ours[OWNER_LABEL] != image_labels.get(OWNER_LABEL):
        return dict(labels)  # signed by the hostagent that made it, which wrote them all
    return {k: v for k, v in labels.items() if not (k in ours and image_labels.get(k) == v)}


# The entrypoint's refusals: it stops before the workload with one of these (docs/exit-codes.md).
_REFUSALS = frozenset({EX_MISALIGNED, EX_UNAVAILABLE, EX_USAGE})


def verified(inspect: Mapping[str, Any]) -> bool | None:
    """Whether gpupin-entrypoint proved the container's cards, where the container says so: its process is
    gpupin-entrypoint and its environment names an expectation (GPUPIN_EXPECT). The entrypoint starts the workload
    only once every card is proven, and otherwise exits with a refusal: so True once the container runs or has ended
    otherwise, False when it ended with a refusal; None when the container does not say (another entrypoint, or no
    expectation)."""
    path = str(inspect.get("Path") or "")
    env = (inspect.get("Config") or {}).get("Env") or ()
    if path.rsplit("/", 1)[-1] != "gpupin-entrypoint" or not any(e.startswith(EXPECT_VAR + "=") for e in env):
        return None
    st = inspect.get("State") or {}
    if str(st.get("Status") or "") == "exited":
        return int(st.get("ExitCode") or 0) not in _REFUSALS
    return True


FROM_STATE = "from the state"  # Holder(why=FROM_STATE): it holds while its state is a live one


# --- holders ---------------------------------------------------------------------------------------------------


class Holder:
    """A container that holds (or, pinned by hostagent, once held) cards: what the engine gives it, what its
    label says, and why it holds now (`why`; None: it does not)."""

    __slots__ = (
        "booking",
        "grants",
        "holds",
        "how",
        "id",
        "image",
        "inspected",
        "label",
        "name",
        "pinned",
        "shared",
        "started",
        "state",
        "uuids",
        "verified",
        "via",
        "why",
    )
    process = False  # a process that uses the card (ledger.processes), not a container given it

    def __init__(
        self,
        id: str,
        name: str,
        state: str,
        uuids: Sequence[str],
        pinned: bool,
        how: str,
        shared: bool = False,
        *,
        why: str | None = FROM_STATE,
        label: Sequence[str] | None = None,
        grants: Sequence[CardGrant] = (),
        inspected: bool = False,
        image: str | None = None,
        verified: bool | None = None,
        started: str | None = None,
        booking: Booking | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.state = state
        self.uuids = tuple(dict.fromkeys(uuids))
        self.pinned = pinned  # carries the gpupin.devices label
        self.how = how  # "gpupin" for a pinned container given what its label says, else how the engine gave them
        self.shared = shared  # gpupin.shared=true: it lets --share requests use its cards
        self.why = (state if state in LIVE_STATES else None) if why is FROM_STATE else why
        self.holds = self.why is not None
        self.label = tuple(label) if label is not None else (tuple(self.uuids) if pinned else None)
        self.grants = tuple(grants)
        self.inspected = inspected  # read in full: `uuids` is what the engine gives, not what a label says
        # Which way the engine gives them, a word per FORMS row (CDI, --gpus, ...); None: not read in full.
        self.via = "+".join(dict.fromkeys(WAY[g.form] for g in self.grants)) or None
        self.image = image  # as the container was created from it (a name, or an id)
        self.verified = verified  # gpupin.hostagent.ledger.holders.verified: None where the container does not say
        self.started = started  # the engine's State.StartedAt (RFC 3339) for one read in full that has started
        self.booking = booking  # who booked it, and until when (its gpupin.booking label)

    @property
    def mismatch(self) -> bool:
        """A label that is not what the engine gives (known for containers read in full)."""
        return self.inspected and self.label is not None and set(self.label) != set(self.uuids)

    def describe(self) -> str:
        # The name, the label and how the engine gives the cards (an environment value) are the container's to
        # choose: shown by the one rule, so that another user's refusal line stays one readable line.
        parts = [self.id[:12], self.state]
        if self.how != "gpupin":
            parts.append(shown(self.how, 500))
        elif self.via:
            parts.append(f"gpupin via {self.via}")
        if self.mismatch:
            parts.append(f"MISMATCH: labelled {','.join(shown(x) for x in self.label or ())}")
        if self.holds and self.why != self.state:
            parts.append(str(self.why))
        return f"{shown(self.name)} ({', '.join(parts)})"

    def __repr__(self) -> str:
        return f"Holder({self.describe()}: {','.join(self.uuids)})"


def name_of(data: Mapping[str, Any]) -> str:
    """A container's name, from its list summary or its inspect data."""
    names = data.get("Names") or [data.get("Name") or ""]
    return str(names[0]).lstrip("/")


def _label_uuids(value: str, cards: Sequence[Card]) -> list[str]:
    """The label's entries as UUIDs (a hand-written index or prefix resolves; an unknown entry stays as written)."""
    out = []
    for entry in (e.strip() for e in value.split(",")):
        if entry:
            try:
                out.append(resolve(entry, cards).uuid)
            except GpupinError:
                out.append(entry)
    return out


def holder(
    inspect: Mapping[str, Any], host: HostCards, lease_state: str | None = None, labels: Mapping[str, str] | None = None
) -> Holder | None:
    """A container read in full (`docker inspect`): what the engine gives it; None when it has no card and no
    ledger label. `labels`: its own gpupin labels (gpupin.hostagent.ledger.holders.not_inherited), else all of its
    labels."""
    if labels is None:
        labels = (inspect.get("Config") or {}).get("Labels") or {}
    given = grants(inspect, host)
    label = _label_uuids(labels[LABEL], host.cards) if labels.get(LABEL) else None
    if not given and label is None:
        return None
    uuids = [u for g in given for u in g.uuids]
    how = "; ".join(g.how for g in given) or "no GPU device"
    if label is not None and set(label) == set(uuids):
        how = "gpupin"
    return Holder(
        str(inspect["Id"]),
        name_of(inspect),
        str((inspect.get("State") or {}).get("Status") or "unknown"),
        uuids,
        label is not None,
        how,
        labels.get(SHARED_LABEL, "") == "true",
        why=holding(inspect, lease_state),
        label=label,
        grants=given,
        inspected=True,
        image=(inspect.get("Config") or {}).get("Image"),
        verified=verified(inspect),
        started=_started(inspect),
        booking=booking.of(labels, _started_at(inspect)),
    )


def _started(inspect: Mapping[str, Any]) -> str | None:
    at = str((inspect.get("State") or {}).get("StartedAt") or "")
    return at if at and not at.startswith("0001-") else None


def _started_at(inspect: Mapping[str, Any]) -> float | None:
    """State.StartedAt in seconds since the epoch (None: never started, or unreadable): a compose booking's start."""
    from gpupin.hostagent.engine.reads import created_time

    at = _started(inspect)
    try:
        return None if at is None else created_time(at)
    except (ValueError, IndexError):
        return None


def label_holder(
    summary: Mapping[str, Any], cards: Sequence[Card], labels: Mapping[str, str] | None = None
) -> Holder | None:
    """A pinned container that holds nothing now (stopped for good, or created and abandoned), from its list
    summary: its label says which cards it is for, so that `ls` can show it under them. `labels` as in holder."""
    if labels is None:
        labels = summary.get("Labels") or {}
    if not labels.get(LABEL):
        return None
    uuids = _label_uuids(labels[LABEL], cards)
    return Holder(
        str(summary["Id"]),
        name_of(summary),
        str(summary.get("State") or "unknown"),
        uuids,
        True,
        "gpupin",
        labels.get(SHARED_LABEL, "") == "true",
        why=None,
        label=uuids,
        image=summary.get("Image"),
        booking=booking.of(labels),
    )


def starting_holder(summary: Mapping[str, Any], host: HostCards, labels: Mapping[str, str]) -> Holder:
    """A container in the middle of its start, which the daemon does not let be inspected until the start ends
    (the NVIDIA hook runs there): it holds what the label of the hostagent that starts it says, or, without one,
    every card (what it will be given is not known until then)."""
    label = _label_uuids(labels[LABEL], host.cards) if labels.get(LABEL) else None
    how = "gpupin" if label is not None else "its devices are not known until its start ends"
    return Holder(
        str(summary["Id"]),
        name_of(summary),
        str(summary.get("State") or "created"),
        label if label is not None else host.every_card(),
        label is not None,
        how,
        labels.get(SHARED_LABEL, "") == "true",
        why=STARTING,
        label=label,
        booking=booking.of(labels),
    )


def held(holders: Iterable[Holder]) -> dict[str, list[Holder]]:
    """Card (or MIG device) UUID -> the containers that hold it now."""
    out: dict[str, list[Holder]] = {}
    for h in holders:
        if h.holds:
            for u in h.uuids:
                out.setdefault(u, []).append(h)
    return out


def blocking(busy: Mapping[str, Sequence[Holder]], share: bool) -> dict[str, list[Holder]]:
    """The holders in the way of a request: all of them, or for a --share request those that do not share
    (a container started without --share, or never by hostagent, keeps its cards to itself; a --share request
    shares deliberately with the processes that use a card)."""
    out: dict[str, list[Holder]] = {}
    for uuid, holders in busy.items():
        them = [h for h in holders if not (share and (h.shared or h.process))]
        if them:
            out[uuid] = them
    return out

"""The listing as typed objects: what `hostagent ls` and the resident agent know of each card, its MIG devices, its
holders and its processes. The agent's parts (idle rule, bookings, queue, metrics, record) read these attributes;
`to_json()` is the one serializer of `ls --json` and /api/ls (its keys and their order are the contract that
tests/golden holds byte for byte), and `from_json()` reads such an object back (a test's, or another host's)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpupin.core import JSONObject as JSON  # the JSON form each type is written to and read from


class _Value:
    """Equal when of one type with equal fields (`_fields`, in the JSON's order), as a dataclass is: the agent
    compares each view with the last one. Written out: dataclasses would cost `ls` ~30 ms of imports and code
    generated at import."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._fields)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self._fields)})"


class Health(_Value):
    """`healthy`: True, False or None (unknown); `reasons`: why it is not healthy; `since`: ISO 8601, where known."""

    _fields = ("healthy", "reasons", "since")
    __slots__ = _fields

    def __init__(
        self,
        healthy: bool | None = None,
        reasons: list[str] | None = None,
        since: str | None = None,
    ) -> None:
        self.healthy = healthy
        self.reasons = [] if reasons is None else reasons
        self.since = since

    def to_json(self) -> JSON:
        return {"healthy": self.healthy, "reasons": list(self.reasons), "since": self.since}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Health:
        return cls(d.get("healthy"), list(d.get("reasons") or ()), d.get("since"))


class Grant(_Value):
    """One way the engine gives a container cards (a FORMS row: CDI, --gpus, ...), the UUIDs it names."""

    _fields = ("form", "how", "uuids", "unknown")
    __slots__ = _fields

    def __init__(
        self,
        form: str,
        how: str,
        uuids: list[str],
        unknown: list[str],
    ) -> None:
        self.form = form
        self.how = how
        self.uuids = uuids
        self.unknown = unknown

    def to_json(self) -> JSON:
        return {"form": self.form, "how": self.how, "uuids": list(self.uuids), "unknown": list(self.unknown)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Grant:
        return cls(d.get("form", ""), d.get("how", ""), list(d.get("uuids") or ()), list(d.get("unknown") or ()))


class BookingShown(_Value):
    """A holder's booking as listed: its owner, since and until when (an extension's end, when extended), and the
    whole seconds left (0 once past)."""

    _fields = ("uid", "since", "until", "left_s")
    __slots__ = _fields

    def __init__(
        self,
        uid: int | None,
        since: int,
        until: float | None,
        left_s: int | None,
    ) -> None:
        self.uid = uid
        self.since = since
        self.until = until
        self.left_s = left_s

    def to_json(self) -> JSON:
        return {"uid": self.uid, "since": self.since, "until": self.until, "left_s": self.left_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BookingShown:
        return cls(d.get("uid"), d.get("since", 0), d.get("until"), d.get("left_s"))


class OwnerShown(_Value):
    """Who owns a holder: `uid` and `name` the user the resident agent created it for (the uid it took at accept:
    proven, `verified`), else None; `claimed_uid` the uid its `gpupin.booking` label names where that is not proven
    (a claim: anyone with the daemon's socket writes any label). `name` is the uid's where it has none."""

    _fields = ("uid", "name", "verified", "claimed_uid")
    __slots__ = _fields

    def __init__(
        self, uid: int | None = None, name: str | None = None, verified: bool = False, claimed_uid: int | None = None
    ) -> None:
        self.uid = uid
        self.name = name
        self.verified = verified
        self.claimed_uid = claimed_uid

    def to_json(self) -> JSON:
        return {"uid": self.uid, "name": self.name, "verified": self.verified, "claimed_uid": self.claimed_uid}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OwnerShown:
        return cls(d.get("uid"), d.get("name"), bool(d.get("verified")), d.get("claimed_uid"))


class HolderShown(_Value):
    """A container that holds (or is labelled for, or held) a card, as listed (gpupin.hostagent.ledger.holders)."""

    __slots__ = _fields = (
        "id",
        "name",
        "state",
        "pinned",
        "how",
        "via",
        "shared",
        "holds",
        "why",
        "uuids",
        "label",
        "mismatch",
        "grants",
        "describe",
        "image",
        "verified",
        "started",
        "booking",
        "owner",
        "warned",
    )

    def __init__(
        self,
        id: str,
        name: str,
        state: str,
        pinned: bool = False,
        how: str = "",
        via: str | None = None,
        shared: bool = False,
        holds: bool = False,
        why: str | None = None,
        uuids: list[str] | None = None,
        label: list[str] | None = None,
        mismatch: bool = False,
        grants: list[Grant] | None = None,
        describe: str = "",
        image: str | None = None,
        verified: bool | None = None,
        started: str | None = None,
        booking: BookingShown | None = None,
        owner: OwnerShown | None = None,
        warned: str | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.state = state
        self.pinned = pinned
        self.how = how
        self.via = via
        self.shared = shared
        self.holds = holds
        self.why = why
        self.uuids = [] if uuids is None else uuids
        self.label = label
        self.mismatch = mismatch
        self.grants = [] if grants is None else grants
        self.describe = describe
        self.image = image
        self.verified = verified
        self.started = started
        self.booking = booking
        self.owner = owner  # None: not known (an agent of an earlier version)
        self.warned = warned  # enforce mode on's refusal, where the authorization plugin let it in under warn

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "pinned": self.pinned,
            "how": self.how,
            "via": self.via,
            "shared": self.shared,
            "holds": self.holds,
            "why": self.why,
            "uuids": list(self.uuids),
            "label": list(self.label) if self.label is not None else None,
            "mismatch": self.mismatch,
            "grants": [g.to_json() for g in self.grants],
            "describe": self.describe,
            "image": self.image,
            "verified": self.verified,
            "started": self.started,
            "booking": self.booking.to_json() if self.booking is not None else None,
            "owner": self.owner.to_json() if self.owner is not None else None,
            "warned": self.warned,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HolderShown:
        booking, label, owner = d.get("booking"), d.get("label"), d.get("owner")
        return cls(
            d.get("id", ""),
            d.get("name", ""),
            d.get("state", ""),
            bool(d.get("pinned")),
            d.get("how", ""),
            d.get("via"),
            bool(d.get("shared")),
            bool(d.get("holds")),
            d.get("why"),
            list(d.get("uuids") or ()),
            list(label) if label is not None else None,
            bool(d.get("mismatch")),
            [Grant.from_json(g) for g in d.get("grants") or ()],
            d.get("describe", ""),
            d.get("image"),
            d.get("verified"),
            d.get("started"),
            BookingShown.from_json(booking) if booking is not None else None,
            OwnerShown.from_json(owner) if isinstance(owner, dict) else None,
            d.get("warned") if isinstance(d.get("warned"), str) else None,
        )


class RootlessOwner(_Value):
    """Whose rootless container a process is in: the uid the kernel names, its user, the runtime, in words."""

    _fields = ("uid", "user", "runtime", "whose")
    __slots__ = _fields

    def __init__(
        self,
        uid: int,
        user: str | None,
        runtime: str | None,
        whose: str,
    ) -> None:
        self.uid = uid
        self.user = user
        self.runtime = runtime
        self.whose = whose

    def to_json(self) -> JSON:
        return {"uid": self.uid, "user": self.user, "runtime": self.runtime, "whose": self.whose}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RootlessOwner:
        return cls(d.get("uid", -1), d.get("user"), d.get("runtime"), d.get("whose", ""))


class ProcessShown(_Value):
    """A compute process on a card, attributed to its container or the host (gpupin.hostagent.ledger.processes)."""

    __slots__ = _fields = (
        "pid",
        "type",
        "owner",
        "user",
        "command",
        "container_id",
        "container",
        "foreign",
        "escape",
        "rootless",
        "describe",
        "used_memory_mib",
        "mig_uuid",
    )

    def __init__(
        self,
        pid: int,
        type: str = "C",
        owner: str = "unknown",
        user: str | None = None,
        command: str | None = None,
        container_id: str | None = None,
        container: str | None = None,
        foreign: bool | None = None,
        escape: bool = False,
        rootless: RootlessOwner | None = None,
        describe: str = "",
        used_memory_mib: int | None = None,
        mig_uuid: str | None = None,
    ) -> None:
        self.pid = pid
        self.type = type
        self.owner = owner
        self.user = user
        self.command = command
        self.container_id = container_id
        self.container = container
        self.foreign = foreign
        self.escape = escape
        self.rootless = rootless
        self.describe = describe
        self.used_memory_mib = used_memory_mib
        self.mig_uuid = mig_uuid

    def to_json(self) -> JSON:
        return {
            "pid": self.pid,
            "type": self.type,
            "owner": self.owner,
            "user": self.user,
            "command": self.command,
            "container_id": self.container_id,
            "container": self.container,
            "foreign": self.foreign,
            "escape": self.escape,
            "rootless": self.rootless.to_json() if self.rootless is not None else None,
            "describe": self.describe,
            "used_memory_mib": self.used_memory_mib,
            "mig_uuid": self.mig_uuid,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessShown:
        rootless = d.get("rootless")
        return cls(
            d.get("pid", 0),
            d.get("type", "C"),
            d.get("owner", "unknown"),
            d.get("user"),
            d.get("command"),
            d.get("container_id"),
            d.get("container"),
            d.get("foreign"),
            bool(d.get("escape")),
            RootlessOwner.from_json(rootless) if rootless else None,
            d.get("describe", ""),
            d.get("used_memory_mib"),
            d.get("mig_uuid"),
        )


class Occupancy(_Value):
    """Who uses a card or a MIG device: held, busy (a use no grant explains), its state (free, held, shared, busy,
    unknown), why that is unknown, and the use NVML names no process for."""

    _fields = ("held", "busy", "state", "unknown", "unseen")
    __slots__ = _fields

    def __init__(
        self,
        held: bool | None = None,
        busy: bool | None = None,
        state: str = "unknown",
        unknown: str | None = None,
        unseen: str | None = None,
    ) -> None:
        self.held = held
        self.busy = busy
        self.state = state
        self.unknown = unknown
        self.unseen = unseen


class MigShown(_Value):
    __slots__ = _fields = (
        "uuid",
        "index",
        "gpu_instance_id",
        "compute_instance_id",
        "name",
        "memory_total_mib",
        "memory_used_mib",
        "use",
    )

    def __init__(
        self,
        uuid: str,
        index: int | None = None,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
        name: str | None = None,
        memory_total_mib: int | None = None,
        memory_used_mib: int | None = None,
        use: Occupancy | None = None,
    ) -> None:
        self.uuid = uuid
        self.index = index
        self.gpu_instance_id = gpu_instance_id
        self.compute_instance_id = compute_instance_id
        self.name = name
        self.memory_total_mib = memory_total_mib
        self.memory_used_mib = memory_used_mib
        self.use = Occupancy() if use is None else use

    def to_json(self) -> JSON:
        u = self.use
        return {
            "uuid": self.uuid,
            "index": self.index,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "held": u.held,
            "busy": u.busy,
            "state": u.state,
            "unknown": u.unknown,
            "unseen": u.unseen,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MigShown:
        return cls(
            d.get("uuid", ""),
            d.get("index"),
            d.get("gpu_instance_id"),
            d.get("compute_instance_id"),
            d.get("name"),
            d.get("memory_total_mib"),
            d.get("memory_used_mib"),
            _occupancy(d),
        )


class IdleWarning(_Value):
    """The policy's idle rule warned this card's holder `container`, idle since `since`; `stop_at`: when it is
    stopped (None: warned only)."""

    _fields = ("container", "since", "stop_at")
    __slots__ = _fields

    def __init__(
        self,
        container: str,
        since: float,
        stop_at: float | None,
    ) -> None:
        self.container = container
        self.since = since
        self.stop_at = stop_at

    def to_json(self) -> JSON:
        return {"container": self.container, "since": self.since, "stop_at": self.stop_at}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IdleWarning:
        return cls(d.get("container", ""), d.get("since", 0), d.get("stop_at"))


class CardShown(_Value):
    """A physical card as listed: NVML's readings (None: the card does not give one), its health, who uses it,
    and (the resident agent only) how long it has been idle."""

    __slots__ = _fields = (
        "index",
        "uuid",
        "bus_id",
        "name",
        "memory_total_mib",
        "memory_used_mib",
        "memory_free_mib",
        "utilization_gpu",
        "mig_mode",
        "mig_devices",
        "compute_processes",
        "compute_capability",
        "error",
        "health",
        "use",
        "shared",
        "holders",
        "mislabelled",
        "temperature_c",
        "power_draw_w",
        "power_limit_w",
        "processes",
        "idle_seconds",
        "idle",
        "idle_warning",
    )

    # compute_processes: None: NVML could not list them
    # shared: held only by containers that let --share requests in
    # mislabelled: labelled for it, given other cards
    # idle_seconds, idle, idle_warning: one reading cannot tell idle from a pause; only the resident agent
    # (gpupin.hostagent.serve.idle) fills them.
    def __init__(
        self,
        index: int,
        uuid: str | None = None,
        bus_id: str | None = None,
        name: str | None = None,
        memory_total_mib: int | None = None,
        memory_used_mib: int | None = None,
        memory_free_mib: int | None = None,
        utilization_gpu: int | None = None,
        mig_mode: bool | None = None,
        mig_devices: list[MigShown] | None = None,
        compute_processes: int | None = 0,
        compute_capability: str | None = None,
        error: str | None = None,
        health: Health | None = None,
        use: Occupancy | None = None,
        shared: bool | None = None,
        holders: list[HolderShown] | None = None,
        mislabelled: list[HolderShown] | None = None,
        temperature_c: int | None = None,
        power_draw_w: float | None = None,
        power_limit_w: float | None = None,
        processes: list[ProcessShown] | None = None,
        idle_seconds: float | None = None,
        idle: bool | None = None,
        idle_warning: IdleWarning | None = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.bus_id = bus_id
        self.name = name
        self.memory_total_mib = memory_total_mib
        self.memory_used_mib = memory_used_mib
        self.memory_free_mib = memory_free_mib
        self.utilization_gpu = utilization_gpu
        self.mig_mode = mig_mode
        self.mig_devices = [] if mig_devices is None else mig_devices
        self.compute_processes = compute_processes
        self.compute_capability = compute_capability
        self.error = error
        self.health = health
        self.use = Occupancy() if use is None else use
        self.shared = shared
        self.holders = [] if holders is None else holders
        self.mislabelled = [] if mislabelled is None else mislabelled
        self.temperature_c = temperature_c
        self.power_draw_w = power_draw_w
        self.power_limit_w = power_limit_w
        self.processes = [] if processes is None else processes
        self.idle_seconds = idle_seconds
        self.idle = idle
        self.idle_warning = idle_warning

    def to_json(self) -> JSON:
        u = self.use
        return {
            "index": self.index,
            "uuid": self.uuid,
            "bus_id": self.bus_id,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "memory_free_mib": self.memory_free_mib,
            "utilization_gpu": self.utilization_gpu,
            "mig_mode": self.mig_mode,
            "mig_devices": [m.to_json() for m in self.mig_devices],
            "compute_processes": self.compute_processes,
            "compute_capability": self.compute_capability,
            "error": self.error,
            "health": self.health.to_json() if self.health is not None else None,
            "held": u.held,
            "busy": u.busy,
            "state": u.state,
            "unknown": u.unknown,
            "unseen": u.unseen,
            "shared": self.shared,
            "holders": [h.to_json() for h in self.holders],
            "mislabelled": [h.to_json() for h in self.mislabelled],
            "temperature_c": self.temperature_c,
            "power_draw_w": self.power_draw_w,
            "power_limit_w": self.power_limit_w,
            "processes": [p.to_json() for p in self.processes],
            "idle_seconds": self.idle_seconds,
            "idle": self.idle,
            "idle_warning": self.idle_warning.to_json() if self.idle_warning is not None else None,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CardShown:
        health, warning = d.get("health"), d.get("idle_warning")
        return cls(
            d.get("index", 0),
            d.get("uuid"),
            d.get("bus_id"),
            d.get("name"),
            d.get("memory_total_mib"),
            d.get("memory_used_mib"),
            d.get("memory_free_mib"),
            d.get("utilization_gpu"),
            d.get("mig_mode"),
            [MigShown.from_json(m) for m in d.get("mig_devices") or ()],
            d.get("compute_processes", 0),
            d.get("compute_capability"),
            d.get("error"),
            Health.from_json(health) if health is not None else None,
            _occupancy(d),
            d.get("shared"),
            [HolderShown.from_json(h) for h in d.get("holders") or ()],
            [HolderShown.from_json(h) for h in d.get("mislabelled") or ()],
            d.get("temperature_c"),
            d.get("power_draw_w"),
            d.get("power_limit_w"),
            [ProcessShown.from_json(p) for p in d.get("processes") or ()],
            d.get("idle_seconds"),
            d.get("idle"),
            IdleWarning.from_json(warning) if warning is not None else None,
        )


def _occupancy(d: Mapping[str, Any]) -> Occupancy:
    return Occupancy(d.get("held"), d.get("busy"), d.get("state", "unknown"), d.get("unknown"), d.get("unseen"))


class DockerState(_Value):
    """Where the daemon is and whether it answered (when not, who holds which card is unknown)."""

    _fields = ("host", "available", "error")
    __slots__ = _fields

    def __init__(
        self,
        host: str | None = None,
        available: bool = True,
        error: str | None = None,
    ) -> None:
        self.host = host
        self.available = available
        self.error = error

    def to_json(self) -> JSON:
        return {"host": self.host, "available": self.available, "error": self.error}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DockerState:
        return cls(d.get("host"), bool(d.get("available", True)), d.get("error"))


class RecordState(_Value):
    """The resident agent's record: its file, and what could not be written to it (a full disk), if anything."""

    _fields = ("path", "degraded")
    __slots__ = _fields

    def __init__(
        self,
        path: str | None,
        degraded: str | None,
    ) -> None:
        self.path = path
        self.degraded = degraded

    def to_json(self) -> JSON:
        return {"path": self.path, "degraded": self.degraded}


class Listing(_Value):
    """The host's cards at one reading: what `ls --json` prints and the resident agent's view."""

    _fields = ("hostname", "driver_version", "cuda_driver_version", "docker", "gpus", "record")
    __slots__ = _fields

    # record: the resident agent's (gpupin.hostagent.record); a one-shot `ls` keeps none
    def __init__(
        self,
        hostname: str = "",
        driver_version: str | None = None,
        cuda_driver_version: str | None = None,
        docker: DockerState | None = None,
        gpus: list[CardShown] | None = None,
        record: RecordState | None = None,
    ) -> None:
        self.hostname = hostname
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.docker = DockerState() if docker is None else docker
        self.gpus = [] if gpus is None else gpus
        self.record = record

    def to_json(self) -> JSON:
        return {
            "hostname": self.hostname,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "docker": self.docker.to_json(),
            "gpus": [g.to_json() for g in self.gpus],
            "record": self.record.to_json() if self.record is not None else None,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Listing:
        record = d.get("record")
        return cls(
            d.get("hostname", ""),
            d.get("driver_version"),
            d.get("cuda_driver_version"),
            DockerState.from_json(d.get("docker") or {}),
            [CardShown.from_json(g) for g in d.get("gpus") or ()],
            RecordState(record.get("path"), record.get("degraded")) if record else None,
        )

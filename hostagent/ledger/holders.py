"""The ledger: who holds which card, read from what the Docker Engine gives each container (docs/design.md,
"The ledger").

What a container holds is what the engine gives it. `FORMS` is the one table of the ways a container can hold a
card, each row read from the container's `docker inspect` data; `hostagent run`'s conflict check, `hostagent ls`
and compose all read holders through it. A new way is one reader function and one row.

Containers that hostagent starts also carry the label `gpupin.devices=UUID[,UUID...]` (and `gpupin.shared=true`
with --share): the label says what was meant, never what is held; one that disagrees with the devices is shown as
a mismatch. There is no state file: a container that is gone holds nothing.

When a container holds what it was given: gpupin.hostagent.ledger.holding. Processes hold too: those no grant
explains are holders of their own (gpupin.hostagent.ledger.uses). Pure functions over inspect data and the cards.
"""

from __future__ import annotations

import re

from gpupin.core.contract import ALL, NONE, VOID, nvd_keyword
from gpupin.core.contract import LABEL as LABEL  # the ledger reads the labels the pin writes
from gpupin.core.contract import SHARED_LABEL as SHARED_LABEL
from gpupin.core.errors import GpupinError
from gpupin.core.identity import is_uuid_like
from gpupin.core.resolve import by_minor, resolve
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger.holding import LIVE_STATES, holding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card

# The capabilities moby's nvidia device driver answers to (daemon/nvidia_linux.go): a request with no driver
# goes to it when one of its capability sets is made only of these.
NVIDIA_CAPABILITIES = frozenset({"gpu", "nvidia", "compute", "compat32", "graphics", "utility", "video", "display"})
_DEVICE_FILE = re.compile(r"(?:.*/)?nvidia([0-9]+)")
FROM_STATE = "from the state"  # Holder(why=FROM_STATE): it holds while its state is a live one


class Host:
    """What the readers need to know of this host: its cards (NVML), and which runtimes are NVIDIA's."""

    def __init__(self, cards: Sequence[Card], runtimes: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.cards = cards
        self._runtimes = runtimes  # name -> path, from the daemon's /info, asked only when needed
        self._known: Mapping[str, str] | None = None

    def is_nvidia_runtime(self, name: str) -> bool:
        """`nvidia`, or a runtime the daemon runs from an nvidia-container-runtime binary under another name."""
        if name == "nvidia":
            return True
        if name in ("", "runc", "io.containerd.runc.v2", "io.containerd.runtime.v1.linux"):
            return False
        if self._known is None:
            self._known = self._runtimes() if self._runtimes is not None else {}
        path = self._known.get(name, "")
        return path.rsplit("/", 1)[-1].startswith("nvidia-container-runtime")

    def every_card(self) -> list[str]:
        return [c.uuid for c in self.cards if c.uuid]


class Grant:
    """Cards given to a container one way: the form (a FORMS row), how it was asked, and the UUIDs it names
    (card or MIG device UUIDs); `unknown` keeps ids this host's cards do not answer to."""

    __slots__ = ("form", "how", "unknown", "uuids")

    def __init__(self, form: str, how: str, uuids: Sequence[str], unknown: Sequence[str] = ()) -> None:
        self.form = form
        self.how = how
        self.uuids = tuple(dict.fromkeys(uuids))
        self.unknown = tuple(unknown)

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "how": self.how, "uuids": list(self.uuids), "unknown": list(self.unknown)}


def _ids(specs: Iterable[str], host: Host) -> tuple[list[str], list[str]]:
    """Device ids as the toolkit reads them (UUID, index, MIG UUID, `i:j`, bus id, `all`) -> (UUIDs, unknown)."""
    uuids: list[str] = []
    unknown: list[str] = []
    for raw in specs:
        spec = raw.strip()
        if not spec:
            continue
        if nvd_keyword(spec) == ALL:
            uuids += host.every_card()
            continue
        try:
            uuids.append(resolve(spec, host.cards).uuid)
        except GpupinError:
            unknown.append(spec)
    return uuids, unknown


def _nvidia_requests(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out = []
    for req in (c.get("HostConfig") or {}).get("DeviceRequests") or []:
        driver = req.get("Driver") or ""
        groups = req.get("Capabilities") or []
        if driver == "nvidia" or (not driver and any(set(g or ()) <= NVIDIA_CAPABILITIES for g in groups)):
            out.append(req)
    return out


def _cdi_requests(c: Mapping[str, Any]) -> list[list[str]]:
    """The CDI names of each CDI device request (the CDI driver's requests: `docker run --device VENDOR/CLASS=
    NAME`), and those given as device paths (HostConfig.Devices), which an engine that takes them there injects
    too; one list per request."""
    host_config = c.get("HostConfig") or {}
    out = [[str(i) for i in req.get("DeviceIDs") or []] for req in host_config.get("DeviceRequests") or []
           if req.get("Driver") == cdi.CDI]
    paths = [str(d.get("PathOnHost") or "") for d in host_config.get("Devices") or []]
    named = [p for p in paths if cdi.parse(p) is not None]
    return [*out, named] if named else out


def _cdi_gpus(c: Mapping[str, Any]) -> list[list[str]]:
    """The nvidia.com/gpu device names of each CDI request (other kinds name no GPU)."""
    out = []
    for names in _cdi_requests(c):
        devices = [d for d in (cdi.gpu_device(n) for n in names) if d is not None]
        if devices:
            out.append(devices)
    return out


def _env(c: Mapping[str, Any], key: str) -> str | None:
    value = None
    for entry in (c.get("Config") or {}).get("Env") or []:
        k, eq, v = entry.partition("=")
        if eq and k == key:
            value = v  # the last one wins, as the toolkit reads the process environment
    return value


def _runtime(c: Mapping[str, Any]) -> str:
    return str((c.get("HostConfig") or {}).get("Runtime") or "")


# --- the table: each way a container can hold cards, read from `docker inspect` -------------------------------

def _device_requests(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`--gpus` / DeviceRequests for the nvidia driver: ids, a count (the daemon hands out indices 0..N-1,
    daemon/nvidia_linux.go), or all (count -1)."""
    grants = []
    for req in _nvidia_requests(c):
        ids = [str(i) for i in req.get("DeviceIDs") or []]
        count = int(req.get("Count") or 0)
        if ids:
            uuids, unknown = _ids(ids, host)
            how = "--gpus device=" + ",".join(ids)
        elif count < 0:
            uuids, unknown, how = host.every_card(), [], "--gpus all"
        elif count > 0:
            uuids, unknown = _ids([str(i) for i in range(count)], host)
            how = f"--gpus {count}"
        else:
            continue
        grants.append(Grant("device-request", how, uuids, unknown))
    return grants


def _cdi_devices(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """CDI device requests of NVIDIA's kind (`docker run --device nvidia.com/gpu=...`, compose `driver: cdi`):
    each name as NVIDIA's spec names a card (index, UUID, MIG UUID, `i:j`, `gpuN`/`migI:J`, `all`), read as the
    identity core reads specs. Other kinds name no GPU."""
    grants = []
    for devices in _cdi_gpus(c):
        uuids, unknown = _ids([cdi.as_spec(d) for d in devices], host)
        grants.append(Grant("cdi", " ".join(f"--device {cdi.name(d)}" for d in devices), uuids, unknown))
    return grants


def _runtime_env(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """The nvidia runtime reading NVIDIA_VISIBLE_DEVICES (the image's own value counts: CUDA images set `all`).
    A device request's value comes last in the process environment and wins, and an nvidia.com/gpu CDI spec sets
    it to `void`, so then this form gives nothing."""
    runtime = _runtime(c)
    if not host.is_nvidia_runtime(runtime) or _nvidia_requests(c) or _cdi_gpus(c):
        return []
    value = _env(c, "NVIDIA_VISIBLE_DEVICES")
    if value is None or nvd_keyword(value) in ("", VOID, NONE):
        return []
    uuids, unknown = _ids(value.split(","), host)
    return [Grant("nvidia-runtime", f"--runtime {runtime} NVIDIA_VISIBLE_DEVICES={value}", uuids, unknown)]


def _swarm_resources(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """A Swarm task under the nvidia runtime: the cards Swarm gave it, DOCKER_RESOURCE_<KIND>=<UUID>[,...], which
    the runtime exposes when its swarm-resource setting names the variable (when it does not, the task gets
    NVIDIA_VISIBLE_DEVICES, the row above, which counts too: the ledger does not read the node's toolkit config).
    Only values that are all UUIDs name cards: a discrete resource (DOCKER_RESOURCE_SSD=1) is a count, no index."""
    runtime = _runtime(c)
    if not host.is_nvidia_runtime(runtime) or _nvidia_requests(c):
        return []
    grants = []
    for entry in (c.get("Config") or {}).get("Env") or []:
        key, eq, value = entry.partition("=")
        if not (eq and key.startswith("DOCKER_RESOURCE_")):
            continue
        values = [v.strip() for v in value.split(",")]
        if values and all(is_uuid_like(v) for v in values):
            uuids, unknown = _ids(values, host)
            grants.append(Grant("swarm-resource", f"Swarm {key}={value}", uuids, unknown))
    return grants


def _device_files(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`--device /dev/nvidiaN`: the card whose minor number is N (nvidiactl, nvidia-uvm and the caps files name
    no card)."""
    grants = []
    for dev in (c.get("HostConfig") or {}).get("Devices") or []:
        path = str(dev.get("PathOnHost") or "")
        m = _DEVICE_FILE.fullmatch(path)
        if not m:
            continue
        try:
            uuids, unknown = [by_minor(int(m.group(1)), host.cards).uuid], []
        except GpupinError:
            uuids, unknown = [], [path]
        grants.append(Grant("device-file", f"--device {path}", uuids, unknown))
    return grants


def _privileged(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`--privileged` with the NVIDIA driver put in by the toolkit (the nvidia runtime, a --gpus request, or an
    nvidia.com/gpu CDI device): a privileged container gets every /dev/nvidiaN of the host, so every card, whatever
    NVIDIA_VISIBLE_DEVICES or the request says."""
    if not (c.get("HostConfig") or {}).get("Privileged"):
        return []
    runtime = _runtime(c)
    if host.is_nvidia_runtime(runtime):
        return [Grant("privileged", f"--privileged --runtime {runtime}", host.every_card())]
    if _nvidia_requests(c):
        return [Grant("privileged", "--privileged --gpus", host.every_card())]
    if _cdi_gpus(c):
        return [Grant("privileged", f"--privileged --device {cdi.KIND}", host.every_card())]
    return []


class Form:
    """One row of the table: a name, the way in a word (what `ls` says of a pinned holder), and how the cards
    given that way are read from `docker inspect` data."""

    __slots__ = ("name", "read", "way")

    def __init__(self, name: str, way: str, read: Callable[[Mapping[str, Any], Host], list[Grant]]) -> None:
        self.name = name
        self.way = way
        self.read = read


FORMS: tuple[Form, ...] = (
    Form("device-request", "--gpus", _device_requests),
    Form("cdi", "CDI", _cdi_devices),
    Form("nvidia-runtime", "--runtime nvidia", _runtime_env),
    Form("swarm-resource", "a Swarm generic resource", _swarm_resources),
    Form("device-file", "device file", _device_files),
    Form("privileged", "--privileged", _privileged),
)
_WAY = {f.name: f.way for f in FORMS}


def grants(inspect: Mapping[str, Any], host: Host) -> list[Grant]:
    """Every way the engine gives this container cards, in FORMS order."""
    return [g for form in FORMS for g in form.read(inspect, host)]


# --- holders ---------------------------------------------------------------------------------------------------

class Holder:
    """A container that holds (or, pinned by hostagent, once held) cards: what the engine gives it, what its
    label says, and why it holds now (`why`; None: it does not)."""

    __slots__ = ("grants", "holds", "how", "id", "inspected", "label", "name", "pinned", "shared", "state", "uuids",
                 "via", "why")
    process = False  # a process that uses the card (ledger.uses), not a container given it

    def __init__(self, id: str, name: str, state: str, uuids: Sequence[str], pinned: bool, how: str,
                 shared: bool = False, *, why: str | None = FROM_STATE, label: Sequence[str] | None = None,
                 grants: Sequence[Grant] = (), inspected: bool = False) -> None:
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
        self.via = "+".join(dict.fromkeys(_WAY[g.form] for g in self.grants)) or None

    @property
    def mismatch(self) -> bool:
        """A label that is not what the engine gives (known for containers read in full)."""
        return self.inspected and self.label is not None and set(self.label) != set(self.uuids)

    def describe(self) -> str:
        parts = [self.id[:12], self.state]
        if self.how != "gpupin":
            parts.append(self.how)
        elif self.via:
            parts.append(f"gpupin via {self.via}")
        if self.mismatch:
            parts.append(f"MISMATCH: labelled {','.join(self.label or ())}")
        if self.holds and self.why != self.state:
            parts.append(str(self.why))
        return f"{self.name} ({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "state": self.state, "pinned": self.pinned, "how": self.how,
                "via": self.via, "shared": self.shared, "holds": self.holds, "why": self.why, "uuids": list(self.uuids),
                "label": list(self.label) if self.label is not None else None, "mismatch": self.mismatch,
                "grants": [g.to_dict() for g in self.grants], "describe": self.describe()}

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


def holder(inspect: Mapping[str, Any], host: Host, lease_state: str | None = None) -> Holder | None:
    """A container read in full (`docker inspect`): what the engine gives it; None when it has no card and no
    ledger label."""
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    given = grants(inspect, host)
    label = _label_uuids(labels[LABEL], host.cards) if labels.get(LABEL) else None
    if not given and label is None:
        return None
    uuids = [u for g in given for u in g.uuids]
    how = "; ".join(g.how for g in given) or "no GPU device"
    if label is not None and set(label) == set(uuids):
        how = "gpupin"
    return Holder(str(inspect["Id"]), name_of(inspect), str((inspect.get("State") or {}).get("Status") or "unknown"),
                  uuids, label is not None, how, labels.get(SHARED_LABEL, "") == "true",
                  why=holding(inspect, lease_state), label=label, grants=given, inspected=True)


def label_holder(summary: Mapping[str, Any], cards: Sequence[Card]) -> Holder | None:
    """A pinned container that holds nothing now (stopped for good, or created and abandoned), from its list
    summary: its label says which cards it is for, so that `ls` can show it under them."""
    labels = summary.get("Labels") or {}
    if not labels.get(LABEL):
        return None
    uuids = _label_uuids(labels[LABEL], cards)
    return Holder(str(summary["Id"]), name_of(summary), str(summary.get("State") or "unknown"), uuids, True,
                  "gpupin", labels.get(SHARED_LABEL, "") == "true", why=None, label=uuids)


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

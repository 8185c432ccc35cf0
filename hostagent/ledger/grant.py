"""What each row of the ledger's table (gpupin.hostagent.ledger.forms) reads with: the host it reads for (its
cards, its runtimes, whether the daemon's paths are this machine's), the Grant it returns, and the few readers of
`docker inspect` data that several rows share."""

from __future__ import annotations

from gpupin.core.contract import ALL, nvd_keyword
from gpupin.core.errors import GpupinError
from gpupin.core.resolve import by_minor, resolve
from gpupin.hostagent.engine import cdi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card

# The capabilities moby's nvidia device driver answers to (daemon/nvidia_linux.go): a request with no driver
# goes to it when one of its capability sets is made only of these.
NVIDIA_CAPABILITIES = frozenset({"gpu", "nvidia", "compute", "compat32", "graphics", "utility", "video", "display"})


class Host:
    """What the readers need to know of this host: its cards (NVML), which runtimes are NVIDIA's, and whether the
    daemon is on this host (`local`: its device paths can be looked at here, through symlinks and device numbers)."""

    def __init__(
        self, cards: Sequence[Card], runtimes: Callable[[], Mapping[str, str]] | None = None, local: bool = False
    ) -> None:
        self.cards = cards
        self._runtimes = runtimes  # name -> path, from the daemon's /info, asked only when needed
        self._known: Mapping[str, str] | None = None
        self.local = local

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

    def by_minors(self, minors: Iterable[int] | None, what: str) -> tuple[list[str], list[str]]:
        """The cards of these minor numbers (None: every card) -> (UUIDs, unknown: `what:minor` for a minor no
        card of this host has)."""
        if minors is None:
            return self.every_card(), []
        uuids: list[str] = []
        unknown: list[str] = []
        for minor in dict.fromkeys(minors):
            try:
                uuids.append(by_minor(minor, self.cards).uuid)
            except GpupinError:
                unknown.append(f"{what} (minor {minor})")
        return uuids, unknown


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


def ids(specs: Iterable[str], host: Host) -> tuple[list[str], list[str]]:
    """Device ids as the toolkit reads them (UUID, index, MIG UUID, `i:j`, bus id, `all`, and nvidia.com/gpu CDI
    names, which its CDI modes read) -> (UUIDs, unknown). A CDI name of another kind names no card."""
    uuids: list[str] = []
    unknown: list[str] = []
    for raw in specs:
        spec = raw.strip()
        if not spec:
            continue
        if cdi.parse(spec) is not None:
            device = cdi.gpu_device(spec)
            if device is None:
                continue
            spec = cdi.as_spec(device)
        if nvd_keyword(spec) == ALL:
            uuids += host.every_card()
            continue
        try:
            uuids.append(resolve(spec, host.cards).uuid)
        except GpupinError:
            unknown.append(raw.strip())
    return uuids, unknown


def host_config(c: Mapping[str, Any]) -> Mapping[str, Any]:
    return c.get("HostConfig") or {}


def nvidia_requests(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out = []
    for req in host_config(c).get("DeviceRequests") or []:
        driver = req.get("Driver") or ""
        groups = req.get("Capabilities") or []
        if driver == "nvidia" or (not driver and any(set(g or ()) <= NVIDIA_CAPABILITIES for g in groups)):
            out.append(req)
    return out


def cdi_requests(c: Mapping[str, Any]) -> list[list[str]]:
    """The CDI names of each CDI device request (the CDI driver's requests: `docker run --device VENDOR/CLASS=
    NAME`), and those given as device paths (HostConfig.Devices), which an engine that takes them there injects
    too; one list per request."""
    hc = host_config(c)
    out = [
        [str(i) for i in req.get("DeviceIDs") or []]
        for req in hc.get("DeviceRequests") or []
        if req.get("Driver") == cdi.CDI
    ]
    paths = [str(d.get("PathOnHost") or "") for d in hc.get("Devices") or []]
    named = [p for p in paths if cdi.parse(p) is not None]
    return [*out, named] if named else out


def cdi_gpus(c: Mapping[str, Any]) -> list[list[str]]:
    """The nvidia.com/gpu device names of each CDI request (other kinds name no GPU)."""
    out = []
    for names in cdi_requests(c):
        devices = [d for d in (cdi.gpu_device(n) for n in names) if d is not None]
        if devices:
            out.append(devices)
    return out


def environment(c: Mapping[str, Any]) -> dict[str, str]:
    """The container's environment (the image's and its own), the last value of a name winning, as the toolkit
    reads the process environment."""
    out: dict[str, str] = {}
    for entry in (c.get("Config") or {}).get("Env") or []:
        key, eq, value = str(entry).partition("=")
        if eq:
            out[key] = value
    return out


def runtime(c: Mapping[str, Any]) -> str:
    return str(host_config(c).get("Runtime") or "")

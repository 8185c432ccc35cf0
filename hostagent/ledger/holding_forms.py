"""The one table of the ways a container can hold a card (FORMS), each row read from the container's `docker
inspect` data by a reader function, and what the rows read with (HostCards, the host they read for; CardGrant, what
a row returns). `hostagent run`'s conflict check, `hostagent ls` and compose all read holders through it; a new way
is one reader and one row. The rows by family: docs/design.md, "The ledger".
"""

from __future__ import annotations

from gpupin.core.contract import ALL, NONE, NVD_VAR, SWARM_PREFIX, VOID, nvd_keyword
from gpupin.core.errors import GpupinError
from gpupin.core.identity import is_uuid_like
from gpupin.core.resolve import by_minor, resolve
from gpupin.hostagent.engine import cdi, podman
from gpupin.hostagent.ledger import nodes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card


# The capabilities moby's nvidia device driver answers to (daemon/nvidia_linux.go): a request with no driver
# goes to it when one of its capability sets is made only of these.
NVIDIA_CAPABILITIES = frozenset({"gpu", "nvidia", "compute", "compat32", "graphics", "utility", "video", "display"})
# moby's NVIDIA device drivers: `nvidia` (what --gpus asks for), and since Engine 29 (moby#50228) the two it
# tries in turn, which a request may name itself (`--gpus driver=nvidia.cdi,...`): `nvidia.cdi` turns the
# request's ids into nvidia.com/gpu CDI names, `nvidia.runtime-hook` hands them to the hook. HostConfig keeps the
# request as it was sent either way: the ids (a count: 0..N-1, -1: all) are read the same.
NVIDIA_DRIVERS = ("nvidia", "nvidia.cdi", "nvidia.runtime-hook")


class HostCards:
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


class CardGrant:
    """Cards given to a container one way: the form (a FORMS row), how it was asked, and the UUIDs it names
    (card or MIG device UUIDs); `unknown` keeps ids this host's cards do not answer to. `named`: the cards were
    named one by one, not asked for as `all`, a count, or every node of a folder (what the authorization plugin
    calls a request that pins nothing)."""

    __slots__ = ("form", "how", "named", "unknown", "uuids")

    def __init__(
        self, form: str, how: str, uuids: Sequence[str], unknown: Sequence[str] = (), named: bool = True
    ) -> None:
        self.form = form
        self.how = how
        self.uuids = tuple(dict.fromkeys(uuids))
        self.unknown = tuple(unknown)
        self.named = named

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "how": self.how, "uuids": list(self.uuids), "unknown": list(self.unknown)}


def ids(specs: Iterable[str], host: HostCards) -> tuple[list[str], list[str], bool]:
    """Device ids as the toolkit reads them (UUID, index, MIG UUID, `i:j`, bus id, `all`, and nvidia.com/gpu CDI
    names, which its CDI modes read) -> (UUIDs, unknown, named: no id was `all`). A CDI name of another kind names
    no card."""
    uuids: list[str] = []
    unknown: list[str] = []
    named = True
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
            named = False
            continue
        try:
            uuids.append(resolve(spec, host.cards).uuid)
        except GpupinError:
            unknown.append(raw.strip())
    return uuids, unknown, named


def host_config(c: Mapping[str, Any]) -> Mapping[str, Any]:
    return c.get("HostConfig") or {}


def nvidia_requests(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out = []
    for req in host_config(c).get("DeviceRequests") or []:
        driver = req.get("Driver") or ""
        groups = req.get("Capabilities") or []
        if driver in NVIDIA_DRIVERS or (not driver and any(set(g or ()) <= NVIDIA_CAPABILITIES for g in groups)):
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


CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


def device_requests(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """`--gpus` / DeviceRequests for the nvidia drivers: ids (nvidia.com/gpu CDI names too, which `nvidia.cdi`
    passes on as they are), a count (the daemon hands out indices 0..N-1, daemon/nvidia_linux.go), or all (count
    -1). A request that names a driver of its own says so (`--gpus driver=nvidia.cdi,...`)."""
    grants = []
    for req in nvidia_requests(c):
        asked = [str(i) for i in req.get("DeviceIDs") or []]
        count = int(req.get("Count") or 0)
        if asked:
            uuids, unknown, named = ids(asked, host)
            how = "device=" + ",".join(asked)
        elif count < 0:
            uuids, unknown, how, named = host.every_card(), [], "all", False
        elif count > 0:
            uuids, unknown, _ = ids([str(i) for i in range(count)], host)
            how, named = str(count), False
        else:
            continue
        driver = str(req.get("Driver") or "")
        if driver not in ("", "nvidia"):  # the CLI's long form: --gpus driver=D,count=N|all,device=...
            how = f"driver={driver}," + (how if how.startswith("device=") else f"count={how}")
        grants.append(CardGrant("device-request", "--gpus " + how, uuids, unknown, named))
    return grants


def cdi_devices(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """CDI device requests of NVIDIA's kind (`docker run --device nvidia.com/gpu=...`, compose `driver: cdi`):
    each name as NVIDIA's spec names a card (index, UUID, MIG UUID, `i:j`, `gpuN`/`migI:J`, `all`), read as the
    identity core reads specs. Other kinds name no GPU."""
    grants = []
    for devices in cdi_gpus(c):
        uuids, unknown, named = ids([cdi.as_spec(d) for d in devices], host)
        grants.append(CardGrant("cdi", " ".join(f"--device {cdi.name(d)}" for d in devices), uuids, unknown, named))
    return grants


def oci_annotations(c: Mapping[str, Any]) -> dict[str, str]:
    """The container's OCI annotations (HostConfig.Annotations: `docker run --annotation`, Engine API 1.43)."""
    found = host_config(c).get("Annotations") or {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def cdi_annotations(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """`cdi.k8s.io/<key>=nvidia.com/gpu=NAME[,...]`: the CDI devices an annotation asks for, which the toolkit's
    runtime (in its CDI and auto modes) injects from the OCI spec; names of other kinds name no GPU."""
    grants = []
    for key, value in sorted(oci_annotations(c).items()):
        if not key.startswith(CDI_ANNOTATION_PREFIX):
            continue
        names = [n.strip() for n in value.split(",") if cdi.gpu_device(n.strip()) is not None]
        if names:
            uuids, unknown, named = ids(names, host)
            grants.append(CardGrant("cdi-annotation", f"--annotation {key}={value}", uuids, unknown, named))
    return grants


def runtime_env(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """The nvidia runtime reading NVIDIA_VISIBLE_DEVICES (the image's own value counts: CUDA images set `all`):
    ids, or nvidia.com/gpu CDI names (`nvidia.com/gpu=1`, which its CDI modes read). A device request's value comes
    last in the process environment and wins, and an nvidia.com/gpu CDI spec sets it to `void`, so then this form
    gives nothing."""
    name = runtime(c)
    if not host.is_nvidia_runtime(name) or nvidia_requests(c) or cdi_gpus(c):
        return []
    value = environment(c).get(NVD_VAR)
    if value is None or nvd_keyword(value) in ("", VOID, NONE):
        return []
    uuids, unknown, named = ids(value.split(","), host)
    return [CardGrant("nvidia-runtime", f"--runtime {name} {NVD_VAR}={value}", uuids, unknown, named)]


def swarm_resources(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """DOCKER_RESOURCE_<KIND>=<UUID>[,...] in any container, under any runtime, beside any device request: the
    toolkit reads the variable its swarm-resource setting names before NVIDIA_VISIBLE_DEVICES, whether Swarm or a
    user set it, and the ledger does not read the node's toolkit config (nor which runtime the node's default
    hooks), so every such variable counts. Only values that name cards do (UUIDs, or nvidia.com/gpu CDI names): a
    discrete resource (DOCKER_RESOURCE_SSD=1) is a count, no index."""
    grants = []
    for key, value in environment(c).items():
        if not key.startswith(SWARM_PREFIX):
            continue
        values = [v.strip() for v in value.split(",")]
        if values and all(is_uuid_like(v) or cdi.gpu_device(v) is not None for v in values):
            uuids, unknown, named = ids(values, host)
            grants.append(CardGrant("swarm-resource", f"{key}={value}", uuids, unknown, named))
    return grants


def _minors(path: str, host: HostCards, deep: bool) -> tuple[list[int] | None, bool]:
    """The card minors a host path reaches (None: every card) and whether it reaches any GPU node at all."""
    if host.local:
        try:
            found = nodes.local_nodes(path, deep)
        except nodes.TreeTooLarge:
            return None, True
        except OSError:  # a path this user may not read: judged by its name, as on another host
            found = None
        if found is not None:
            cards = [m for _, major, minor in found if (m := nodes.card_minor(major, minor)) is not None]
            return cards, bool(found)
    minors = nodes.named_minors(path)
    return minors, nodes.names_gpu_node(path) or bool(minors)


def device_files(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
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
        grants.append(CardGrant("device-file", f"--device {path}", uuids, unknown, minors is not None))
    return grants


def oci_devices(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """Podman: the card nodes of the OCI spec podman wrote (gpupin.hostagent.engine.podman.read_oci_spec), however
    they came (a CDI device, `--gpus` mapped onto CDI, `--device /dev/nvidiaN`): podman's inspect shows no CDI
    device."""
    found = c.get(podman.OCI_KEY) or []
    minors = [
        m
        for d in found
        if str(d.get("type") or "c") == "c" and isinstance(d.get("major"), int) and isinstance(d.get("minor"), int)
        for m in [nodes.card_minor(d["major"], d["minor"])]
        if m is not None
    ]
    if not minors:
        return []
    uuids, unknown = host.by_minors(sorted(set(minors)), "podman OCI device")
    return [CardGrant("oci-device", "a card node in podman's OCI spec", uuids, unknown)]


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


def device_cgroup(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """A device-cgroup rule granting major 195 (`--device-cgroup-rule 'c 195:* rwm'`) with `m`, in a container
    that keeps CAP_MKNOD: it can make /dev/nvidiaN itself and open it, mount or none."""
    if not _can_mknod(c):
        return []
    grants = []
    for rule in _rules(c):
        if rule.make and rule.open:
            uuids, unknown = host.by_minors(rule.minors, "195")
            how = f"--device-cgroup-rule '{rule.text}'"
            grants.append(CardGrant("device-cgroup", how, uuids, unknown, rule.minors is not None))
    return grants


def _binds(c: Mapping[str, Any]) -> Sequence[tuple[str, str]]:
    """(host path, container path) of each bind mount, as the daemon records them (Mounts: -v and --mount)."""
    return [
        (str(m.get("Source") or ""), str(m.get("Destination") or ""))
        for m in c.get("Mounts") or []
        if m.get("Type") == "bind"
    ]


def bind_mounts(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
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
                how = f"-v {source}:{target} --device-cgroup-rule '{rule.text}'"
                grants.append(CardGrant("bind-mount", how, uuids, unknown, allowed is not None))
    return grants


def privileged(c: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """`--privileged` with the NVIDIA driver put in by the toolkit (the nvidia runtime, a --gpus request, or an
    nvidia.com/gpu CDI device): a privileged container gets every /dev/nvidiaN of the host, so every card, whatever
    NVIDIA_VISIBLE_DEVICES or the request says."""
    if not host_config(c).get("Privileged"):
        return []
    name = runtime(c)
    if host.is_nvidia_runtime(name):
        return [CardGrant("privileged", f"--privileged --runtime {name}", host.every_card(), named=False)]
    if nvidia_requests(c):
        return [CardGrant("privileged", "--privileged --gpus", host.every_card(), named=False)]
    if cdi_gpus(c):
        return [CardGrant("privileged", f"--privileged --device {cdi.KIND}", host.every_card(), named=False)]
    return []


class HoldingForm:
    """One row of the table: a name, the way in a word (what `ls` says of a pinned holder), and how the cards
    given that way are read from `docker inspect` data."""

    __slots__ = ("name", "read", "way")

    def __init__(self, name: str, way: str, read: Callable[[Mapping[str, Any], HostCards], list[CardGrant]]) -> None:
        self.name = name
        self.way = way
        self.read = read


FORMS: tuple[HoldingForm, ...] = (
    HoldingForm("device-request", "--gpus", device_requests),
    HoldingForm("cdi", "CDI", cdi_devices),
    HoldingForm("cdi-annotation", "a CDI annotation", cdi_annotations),
    HoldingForm("nvidia-runtime", "--runtime nvidia", runtime_env),
    HoldingForm("swarm-resource", "DOCKER_RESOURCE_*", swarm_resources),
    HoldingForm("device-file", "device file", device_files),
    HoldingForm("bind-mount", "a bind mount of device files", bind_mounts),
    HoldingForm("device-cgroup", "--device-cgroup-rule", device_cgroup),
    HoldingForm("privileged", "--privileged", privileged),
    HoldingForm("oci-device", "podman (CDI or device node)", oci_devices),
)
WAY = {f.name: f.way for f in FORMS}


def grants(inspect: Mapping[str, Any], host: HostCards) -> list[CardGrant]:
    """Every way the engine gives this container cards, in FORMS order."""
    return [g for form in FORMS for g in form.read(inspect, host)]

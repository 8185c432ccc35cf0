"""What one compose service asks for (GpuRequest), and what every way of asking has in common (GpuRequestForm:
`read` a service into a request, `write` the pin's device entry where the form was). The readers several forms
share live here; one form each is in hostagent.compose.request_forms.
"""

from __future__ import annotations

from gpupin.core.contract import SHARED_LABEL
from gpupin.hostagent.compose import devicerequest
from gpupin.hostagent.compose.problems import ServiceError, quoted
from gpupin.hostagent.compose.service import device_list, label_entries
from gpupin.hostagent.engine import cdi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.hostagent.pin import Pin
    from gpupin.hostagent.yamlfile import YAMLMapping

KEY = "x-gpupin"
_KEY_LETTERS = "xgpupin"
LOOKALIKE_HINT = f"did you mean {KEY}? Compose ignores x- keys, so a misspelt one asks for nothing"
# Where compose-go says a deploy device request is, in its messages.
RESERVATIONS_AT = "services.{service}.deploy.resources.reservations.devices"
ALL = devicerequest.EVERY  # a count of every card: `count: all`, `-1`, a device entry with neither count nor ids
_SPEC_HINT = "give UUIDs (GPU-1c5e...), unique prefixes, NVML indices or bus ids (quoted: '3b:00.0')"


def lookalike(key: object) -> bool:
    """Whether a key looks like KEY without being it (x-gpu-pin, x-gpupins, x_gpupin, X-GPUPIN, gpupin): its
    letters and digits, case folded, at most one edit away from KEY's."""
    if not isinstance(key, str) or key == KEY or len(key) > 4 * len(KEY):
        return False
    word = "".join(c for c in key.lower() if c.isalnum())
    if abs(len(word) - len(_KEY_LETTERS)) > 1:
        return False
    if len(word) == len(_KEY_LETTERS):
        return sum(a != b for a, b in zip(word, _KEY_LETTERS)) <= 1
    short, long = sorted((word, _KEY_LETTERS), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


class GpuRequest:
    """What one service asks for: cards by spec (in local-rank order) or a count, and how it was written."""

    __slots__ = ("capabilities", "count", "device_index", "form", "service", "share", "specs", "verify")

    def __init__(
        self,
        service: str,
        form: GpuRequestForm,
        specs: Sequence[str] = (),
        count: int | None = None,
        share: bool = False,
        verify: str | None = None,
        device_index: int | None = None,
        capabilities: Sequence[str] = (),
    ) -> None:
        self.service = service
        self.form = form
        self.specs = list(specs)
        self.count = count  # None: the cards are named in specs; ALL: every card
        self.share = share
        self.verify = verify
        self.device_index = device_index  # deploy: which device entry is the GPU one
        # NVIDIA driver capabilities asked beside `gpu` (utility, ...): only the nvidia driver's request carries them
        self.capabilities = list(capabilities)

    def describe_count(self) -> str:
        return "every card" if self.count == ALL else f"count: {self.count}"

    def __repr__(self) -> str:
        what = f"count={self.count}" if self.count is not None else f"gpus={self.specs}"
        return f"GpuRequest({self.service}, {self.form.name}, {what}, share={self.share})"


class GpuRequestForm:
    """One way a compose service can ask for GPUs."""

    name = ""  # how messages name the form
    standard = True  # docker compose acts on it as written (not so x-gpupin, an extension key it ignores)
    fallback = False  # read only when no other form asks (the legacy runtime form yields to a device request)
    share_how = f"the label {SHARED_LABEL}=true"  # how a service in this form says it shares its cards
    spec_name = "device id"  # how a message names one of its specs
    env_var: str | None = None  # the variable the request is read from, if any
    # What the NVIDIA stack does with a spec that is not a full UUID, an index or `i:j` (a prefix, a short bus id).
    not_taken = "which the NVIDIA container runtime does not accept"
    # What compose before the version that reads the form does with it (None: every compose version reads it).
    older_compose: str | None = None

    def by_uuid(self, uuid: str) -> str:
        """How this form names a card by UUID, for a hint."""
        return f"device_ids: [{uuid}]"

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        raise NotImplementedError

    def write(self, svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
        """Put the pin's device request in place of what the form asked."""
        raise NotImplementedError

    def shared(self, svc: Mapping[str, Any], service: str) -> bool:
        """Standard forms say "shared" with the ledger's own label (gpupin.shared=true)."""
        return label_entries(svc, service).get(SHARED_LABEL, "").lower() == "true"


# --- what several forms read and write -------------------------------------------------------------------------


def spec_list(value: Any, service: str, key: str) -> list[str]:
    """A list of GPU specs (or one, or a comma-separated string of them), as text."""
    out: list[str] = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ServiceError(service, f"{key}: {quoted(item)} is not a GPU spec", _SPEC_HINT)
        out.extend(p.strip() for p in str(item).split(","))
    if not out:
        raise ServiceError(service, f"{key} is empty", "list one spec per card")
    if any(not s for s in out):
        raise ServiceError(service, f"{key} has an empty entry", "list one spec per card")
    return out


def count_of(value: Any, service: str, key: str, hint: str) -> int:
    """A number of cards (>= 1) written at `key`; a ServiceError with `hint` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServiceError(service, f"{key}: {quoted(value)} is not a number of cards >= 1", hint)
    return value


def _capabilities(entry: Mapping[str, Any]) -> list[str]:
    caps = entry.get("capabilities")
    return [str(c) for c in caps if c != "gpu"] if isinstance(caps, list) else []


def device_entry(
    form: GpuRequestForm, service: str, entry: Mapping[str, Any], share: bool, index: int | None = None
) -> GpuRequest:
    """One nvidia device request (a deploy device entry at `index`, or a `gpus:` entry), checked as compose-go
    checks it (hostagent.compose.devicerequest): ids or a count, not both; neither is every card, as `--gpus all`
    (the compose specification's default)."""
    at = f"services.{service}.gpus.0" if index is None else f"{RESERVATIONS_AT.format(service=service)}.{index}"
    count = devicerequest.schema(entry, service, at, needs_capabilities=index is not None)
    caps = _capabilities(entry)
    if count is None:
        return GpuRequest(
            service,
            form,
            spec_list(entry["device_ids"], service, "device_ids"),
            share=share,
            device_index=index,
            capabilities=caps,
        )
    return GpuRequest(service, form, count=count, share=share, device_index=index, capabilities=caps)


def _cdi_gpu_names(service: str, names: Sequence[str], where: str) -> list[str]:
    """The nvidia.com/gpu device names of a list of CDI names (each in NVIDIA's spec naming, as specs)."""
    devices = [cdi.gpu_device(n) for n in names]
    if any(d is None for d in devices):
        other = next(n for n, d in zip(names, devices) if d is None)
        raise ServiceError(
            service,
            f"{where} mixes {quoted(other)} with {cdi.KIND} devices",
            "give other CDI kinds a device request of their own; this one is the GPUs'",
        )
    return [cdi.as_spec(d) for d in devices if d is not None]


def cdi_request(
    form: GpuRequestForm, service: str, names: Sequence[str], where: str, share: bool, index: int | None = None
) -> GpuRequest:
    specs = _cdi_gpu_names(service, names, where)
    if "all" in specs:
        if len(specs) > 1:
            raise ServiceError(
                service,
                f"{where} names {cdi.name('all')} beside other cards",
                f"keep {cdi.name('all')} alone, or name the cards",
            )
        return GpuRequest(service, form, count=ALL, share=share, device_index=index)
    if not specs:
        raise ServiceError(service, f"{where} is empty", f"name the cards, e.g. {cdi.name('GPU-...')}")
    return GpuRequest(service, form, specs, share=share, device_index=index)


def write_device(svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
    """The pin's device entry in place of the request's own (deploy), else added (every other form)."""
    devices = device_list(svc, create=True)
    entry = pin.compose_device()
    if req.device_index is None:
        devices.append(entry)
        return
    old = devices[req.device_index]
    caps = old.get("capabilities")
    if isinstance(caps, list) and "gpu" in caps:
        entry["capabilities"] = caps  # keep e.g. [gpu, utility] as the user wrote it
    if old.get("options"):
        entry["options"] = old["options"]
    devices[req.device_index] = entry


def as_cdi_names(svc: YAMLMapping, pin: Pin) -> None:
    """The device entry write_device wrote, moved to CDI names in `devices:` (podman: its compose tools drop every
    device request, while `devices:` reaches podman's own create, which resolves CDI names; docs/podman.md)."""
    devices = device_list(svc)
    devices[:] = [d for d in devices if not (isinstance(d, dict) and d.get("device_ids") == pin.device_ids)]
    for path in (("deploy", "resources", "reservations", "devices"), ("deploy", "resources", "reservations")):
        *above, last = path  # the levels write_device created, dropped again where they are left empty
        node: Any = svc
        for level in above:
            node = node.get(level) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(last) in ([], {}):
            node.pop(last)
    for level in ("resources", "deploy"):
        parent = svc if level == "deploy" else svc.get("deploy")
        if isinstance(parent, dict) and parent.get(level) == {}:
            parent.pop(level)
    named = svc.get("devices")
    svc["devices"] = [*(named if isinstance(named, list) else []), *pin.device_ids]

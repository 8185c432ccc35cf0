"""`hostagent compose render|check`: compose services pinned to physical GPUs by UUID, and the files that are not.

A service asks for cards with the extension key `x-gpupin` (the compose spec lets `x-` keys be anywhere):

    x-gpupin:
      gpus: [GPU-95c6, 3]     # any `hostagent run --gpu` SPEC; list order = local-rank order (cuda:0 first)
      # or: count: 2          # N free cards, best first (most free memory, least load)
      share: true             # optional: may share its cards with other services or running pinned containers
      verify: cuda            # optional: GPUPIN_VERIFY for the entrypoint (nvml, cuda, torch)

or with the standard `deploy.resources.reservations.devices` (`device_ids` or `count`), which `render` pins by UUID
and `check` inspects. `render` resolves every request against this host's cards (NVML) and the ledger (running
containers, gpupin.hostagent.ledger) and writes a plain compose file: per service a device request by UUID, the
environment `NVIDIA_VISIBLE_DEVICES`, `GPUPIN_EXPECT` (UUID@BUSID in local-rank order) and the ledger labels.
`check` reads a compose file as it is and reports what would land a job on the wrong card or double-book one.

Exit codes (DESIGN.md): 64 a malformed file or a request that cannot mean one card (unknown, ambiguous, a card
given to two services, more cards than the host has, replicas > 1, hand-set pin variables); 75 a render that
cannot place a service only because running containers hold the cards it needs (they are named); 69 NVML
unusable. `check` exits 64 when it finds an error, else 0 (warnings alone do not fail it).

The pure core (parsing, placement, rendering, checking) takes `gpupin.entrypoint.nvml.Card` objects and the ledger's
holders, so it is tested without hardware or a daemon; the two `*_command` functions are the thin adapters.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import tempfile

from gpupin.entrypoint.errors import EX_TEMPFAIL, EX_USAGE, GpupinError, GpuSpecError, UsageError
from gpupin.entrypoint.expectation import EXPECT_VAR, parse_expect
from gpupin.entrypoint.identity import is_full_uuid, is_uuid_like, looks_like_bus_id, match_uuid
from gpupin.entrypoint.resolve import Target
from gpupin.hostagent import gpus
from gpupin.hostagent.ledger import LABEL, SHARED_LABEL, Holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card

KEY = "x-gpupin"
VERIFY_VAR = "GPUPIN_VERIFY"
NVD_VAR = "NVIDIA_VISIBLE_DEVICES"
OWNED_VARS = (EXPECT_VAR, NVD_VAR)
VERIFY_LEVELS = ("nvml", "cuda", "torch")
_X_KEYS = ("gpus", "count", "share", "verify")
_COMPOSE_PROJECT = "com.docker.compose.project"
_COMPOSE_SERVICE = "com.docker.compose.service"
_X_HINT = f"write `{KEY}: {{gpus: [UUID-or-SPEC, ...]}}` or `{KEY}: {{count: N}}`, optionally with share: true " \
          "and verify: nvml|cuda|torch"
_RENDER_HINT = f"ask for the cards with `{KEY}` (or deploy device_ids) and run `hostagent compose render`"

ERROR = "error"
WARNING = "warning"


# --- problems -------------------------------------------------------------------------------------------------

class ServiceError(GpupinError):
    """A problem with one service (or, with service None, with the file): 64 unless said otherwise."""

    def __init__(self, service: str | None, message: str, hint: str | None = None,
                 exit_code: int = EX_USAGE) -> None:
        super().__init__(message, hint)
        self.service = service
        self.exit_code = exit_code

    @classmethod
    def wrap(cls, service: str | None, err: GpupinError) -> ServiceError:
        return cls(service, err.message, err.hint, err.exit_code)

    def problem(self, severity: str = ERROR) -> Problem:
        return Problem(self.service, self.message, self.hint, severity)


class Problem:
    """One finding of `check`: the service it is about (None: the whole file), what is wrong, what to do."""

    __slots__ = ("hint", "problem", "service", "severity")

    def __init__(self, service: str | None, problem: str, hint: str | None = None, severity: str = ERROR) -> None:
        self.service = service
        self.problem = problem
        self.hint = hint
        self.severity = severity

    def line(self, file: str) -> str:
        where = f"{file}: service {self.service}: " if self.service is not None else f"{file}: "
        level = "warning: " if self.severity == WARNING else ""
        hint = f" HINT: {self.hint}" if self.hint else ""
        return f"{where}{level}{self.problem}.{hint}"

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "problem": self.problem, "hint": self.hint, "severity": self.severity}

    def __repr__(self) -> str:
        return f"Problem({self.line('-')})"


# --- loading --------------------------------------------------------------------------------------------------

def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise UsageError("PyYAML is not installed", "install the host side: pip install 'gpupin[host]'") from None
    return yaml


def _loader(yaml: Any) -> Any:
    """PyYAML's safe loader, but `86:00.0` and `1:30` stay text (YAML 1.1 reads them as base-60 numbers).

    Bus ids are exactly such text, and compose v2 (YAML 1.2) reads them as text too. The dumper quotes them on
    the way out, so docker-compose 1.x (YAML 1.1) reads the rendered file the same way.
    """

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    def keep_text(base: Any) -> Any:
        def construct(loader: Any, node: Any) -> Any:
            if ":" in str(node.value):
                return loader.construct_scalar(node)
            return base(loader, node)
        return construct

    Loader.add_constructor("tag:yaml.org,2002:int", keep_text(yaml.SafeLoader.construct_yaml_int))
    Loader.add_constructor("tag:yaml.org,2002:float", keep_text(yaml.SafeLoader.construct_yaml_float))
    return Loader


def parse_text(text: str, file: str = "<compose>") -> Any:
    """The YAML document, or ServiceError(None, ...) naming the file, line and column."""
    yaml = _yaml()
    try:
        return yaml.load(text, Loader=_loader(yaml))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ServiceError(None, f"{file} is not valid YAML: {what}{where}",
                           "fix the YAML (`docker-compose -f FILE config` shows what compose reads)") from None


def dump(doc: Any) -> str:
    yaml = _yaml()
    text: str = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)
    return text


def services(doc: Any) -> dict[str, Any]:
    """The `services` mapping of a compose document, or ServiceError(None, ...)."""
    if not isinstance(doc, dict):
        raise ServiceError(None, "the file is not a compose file (its top level is not a mapping)",
                           "a compose file is a mapping with a `services:` key")
    svcs = doc.get("services")
    if not isinstance(svcs, dict) or not svcs:
        raise ServiceError(None, "the file has no `services:` mapping", "a compose file lists its services there")
    return svcs


# --- one service's request ------------------------------------------------------------------------------------

class GpuRequest:
    """What one service asks for: cards by spec (in local-rank order) or a count, from `x-gpupin` or `deploy`."""

    __slots__ = ("count", "device_index", "service", "share", "source", "specs", "verify")

    def __init__(self, service: str, source: str, specs: Sequence[str] = (), count: int | None = None,
                 share: bool = False, verify: str | None = None, device_index: int | None = None) -> None:
        self.service = service
        self.source = source  # "x-gpupin", "deploy" or "runtime" (runtime: nvidia + NVIDIA_VISIBLE_DEVICES)
        self.specs = list(specs)
        self.count = count  # None: by specs; -1: every card ("all", or a device entry without count or ids)
        self.share = share
        self.verify = verify
        self.device_index = device_index  # which deploy device entry is the GPU one

    def __repr__(self) -> str:
        what = f"count={self.count}" if self.count is not None else f"gpus={self.specs}"
        return f"GpuRequest({self.service}, {self.source}, {what}, share={self.share})"


def _mapping(value: Any, service: str, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceError(service, f"`{where}` is not a mapping", "see the compose specification")
    return value


def _spec_text(value: Any, service: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ServiceError(service, f"{key}: {value!r} is not a GPU spec",
                           "give UUIDs (GPU-1c5e...), unique prefixes, NVML indices or bus ids; quote bus ids")
    return str(value).strip()


def _spec_list(value: Any, service: str, key: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        text = _spec_text(item, service, key)
        out.extend(p.strip() for p in text.split(","))
    if not out or any(not s for s in out):
        raise ServiceError(service, f"{key}: an empty GPU spec", "list one spec per card")
    return out


def env_entries(svc: Mapping[str, Any], service: str) -> dict[str, str | None]:
    """The service's `environment` (list or mapping form) as KEY -> value (None: passed from the shell)."""
    env = svc.get("environment")
    if env is None:
        return {}
    out: dict[str, str | None] = {}
    if isinstance(env, dict):
        for k, v in env.items():
            out[str(k)] = None if v is None else str(v)
        return out
    if isinstance(env, list):
        for item in env:
            if not isinstance(item, str):
                raise ServiceError(service, f"environment entry {item!r} is not KEY=VALUE",
                                   "write environment entries as KEY=VALUE strings, or as a mapping")
            key, eq, value = item.partition("=")
            out[key] = value if eq else None
        return out
    raise ServiceError(service, "`environment` is neither a list nor a mapping", "see the compose specification")


def label_entries(svc: Mapping[str, Any], service: str) -> dict[str, str]:
    labels = svc.get("labels")
    if labels is None:
        return {}
    if isinstance(labels, dict):
        return {str(k): "" if v is None else str(v) for k, v in labels.items()}
    if isinstance(labels, list):
        out: dict[str, str] = {}
        for item in labels:
            key, _, value = str(item).partition("=")
            out[key] = value
        return out
    raise ServiceError(service, "`labels` is neither a list nor a mapping", "see the compose specification")


def _devices(svc: Mapping[str, Any], service: str) -> list[Any]:
    deploy = _mapping(svc.get("deploy"), service, "deploy")
    resources = _mapping(deploy.get("resources"), service, "deploy.resources")
    reservations = _mapping(resources.get("reservations"), service, "deploy.resources.reservations")
    devices = reservations.get("devices")
    if devices is None:
        return []
    if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
        raise ServiceError(service, "`deploy.resources.reservations.devices` is not a list of mappings",
                           "each device request is a mapping: {driver: nvidia, device_ids: [...], "
                           "capabilities: [gpu]}")
    return devices


def _is_gpu_entry(entry: Mapping[str, Any]) -> bool:
    caps = entry.get("capabilities") or []
    flat = {str(c) for c in caps} if isinstance(caps, list) else set()
    return entry.get("driver") == "nvidia" or "gpu" in flat


def replicas(svc: Mapping[str, Any], service: str) -> int:
    """How many containers compose starts for the service: `deploy.replicas`, else `scale`, else 1."""
    deploy = _mapping(svc.get("deploy"), service, "deploy")
    for key, value in (("deploy.replicas", deploy.get("replicas")), ("scale", svc.get("scale"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ServiceError(service, f"`{key}` is not a number", "give a whole number of containers")
        return value
    return 1


def is_shared(svc: Mapping[str, Any], service: str) -> bool:
    x = svc.get(KEY)
    if isinstance(x, dict) and x.get("share") is True:
        return True
    return label_entries(svc, service).get(SHARED_LABEL, "").lower() == "true"


def _x_request(service: str, x: Any) -> GpuRequest:
    if not isinstance(x, dict):
        raise ServiceError(service, f"`{KEY}` is not a mapping", _X_HINT)
    unknown = [str(k) for k in x if k not in _X_KEYS]
    if unknown:
        raise ServiceError(service, f"`{KEY}` has unknown key(s) {', '.join(unknown)}", _X_HINT)
    has_gpus, has_count = x.get("gpus") is not None, x.get("count") is not None
    if has_gpus == has_count:
        raise ServiceError(service, f"`{KEY}` needs `gpus` or `count`, not both and not neither", _X_HINT)
    share = x.get("share", False)
    if not isinstance(share, bool):
        raise ServiceError(service, f"{KEY}.share: {share!r} is not true or false", _X_HINT)
    verify = x.get("verify")
    if verify is not None and verify not in VERIFY_LEVELS:
        raise ServiceError(service, f"{KEY}.verify: unknown level {verify!r}", "use nvml, cuda or torch")
    if has_count:
        count = x["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ServiceError(service, f"{KEY}.count: {count!r} is not a number of cards >= 1", _X_HINT)
        return GpuRequest(service, KEY, count=count, share=share, verify=verify)
    return GpuRequest(service, KEY, _spec_list(x["gpus"], service, f"{KEY}.gpus"), share=share, verify=verify)


def _deploy_request(service: str, index: int, entry: Mapping[str, Any], share: bool) -> GpuRequest:
    ids, count = entry.get("device_ids"), entry.get("count")
    if ids is not None and count is not None:
        raise ServiceError(service, "a GPU device request has both `count` and `device_ids`",
                           "Docker refuses that: keep device_ids (by UUID), or better, use x-gpupin and render")
    if ids is not None:
        return GpuRequest(service, "deploy", _spec_list(ids, service, "device_ids"), share=share,
                          device_index=index)
    if count is None or count == "all" or count == -1:
        # No count and no ids is every card, as `--gpus all` (the compose specification's default).
        return GpuRequest(service, "deploy", count=-1, share=share, device_index=index)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ServiceError(service, f"device request count: {count!r} is not a number of cards >= 1 or `all`",
                           "give a whole number")
    return GpuRequest(service, "deploy", count=count, share=share, device_index=index)


def gpu_request(service: str, svc: Any) -> GpuRequest | None:
    """The service's GPU request, None when it asks for none, or ServiceError when it is malformed."""
    if not isinstance(svc, dict):
        raise ServiceError(service, "the service is not a mapping", "a service is a mapping with `image:` etc.")
    share = is_shared(svc, service)
    entries = [(i, d) for i, d in enumerate(_devices(svc, service)) if _is_gpu_entry(d)]
    x = svc.get(KEY)
    if x is not None and entries:
        raise ServiceError(service, f"asks for GPUs twice: `{KEY}` and deploy.resources.reservations.devices",
                           f"keep one (`{KEY}`, which render turns into the device request)")
    if len(entries) > 1:
        raise ServiceError(service, f"has {len(entries)} GPU device requests",
                           "put every card in one request's device_ids, in local-rank order")
    if x is not None:
        return _x_request(service, x)
    if entries:
        index, entry = entries[0]
        return _deploy_request(service, index, entry, share)
    if svc.get("runtime") == "nvidia":
        nvd = env_entries(svc, service).get(NVD_VAR)
        if nvd and nvd.strip().lower() not in ("void", "none"):
            if nvd.strip().lower() == "all":
                return GpuRequest(service, "runtime", count=-1, share=share)
            return GpuRequest(service, "runtime", _spec_list(nvd, service, NVD_VAR), share=share)
    return None


def render_refusals(service: str, svc: Mapping[str, Any], req: GpuRequest) -> list[ServiceError]:
    """What render will not write over: replicas, hand-set pin variables and ledger labels."""
    out: list[ServiceError] = []
    n = replicas(svc, service)
    if n > 1:
        out.append(ServiceError(service, f"asks for {n} replicas of a pinned service: every replica would get "
                                "the same cards", "make one service per replica, each with its own cards"))
    env = env_entries(svc, service)
    # The legacy `runtime: nvidia` form names its cards in NVIDIA_VISIBLE_DEVICES: render replaces it.
    owned = (EXPECT_VAR,) if req.source == "runtime" else OWNED_VARS
    for var in owned:
        if var in env:
            out.append(ServiceError(service, f"environment sets {var} by hand: render writes it from the cards "
                                    "it pins", f"remove {var} from the service; {_RENDER_HINT}"))
    if req.verify is not None and env.get(VERIFY_VAR) not in (None, req.verify):
        out.append(ServiceError(service, f"environment sets {VERIFY_VAR}={env[VERIFY_VAR]} but {KEY}.verify is "
                                f"{req.verify}", "say it once"))
    if LABEL in label_entries(svc, service):
        out.append(ServiceError(service, f"sets the label {LABEL} by hand: it is the ledger, render writes it",
                                f"remove it; {_RENDER_HINT}"))
    return out


# --- placement ------------------------------------------------------------------------------------------------

def _keys(pick: Target) -> list[str]:
    """The UUIDs that collide with this pick: itself, its parent card (MIG) or its MIG devices (whole card)."""
    keys = [pick.uuid]
    if pick.mig is not None and pick.card.uuid:
        keys.append(pick.card.uuid)
    if pick.mig is None:
        keys.extend(m.uuid for m in pick.card.mig_devices)
    return keys


def _describe(pick: Target) -> str:
    return f"{pick.uuid} (index {pick.card.index}, {pick.bus_id}, {pick.name})"


def _holders_of(pick: Target, busy: Mapping[str, Sequence[Holder]]) -> list[Holder]:
    found = {h.id: h for k in _keys(pick) for h in busy.get(k, [])}
    return list(found.values())


def _every_card(cards: Sequence[Card]) -> list[str]:
    return [str(c.index) for c in cards if c.error is None and not c.mig_mode]


def place(requests: Sequence[GpuRequest], cards: Sequence[Card],
          busy: Mapping[str, Sequence[Holder]]) -> tuple[dict[str, list[Target]], list[ServiceError]]:
    """Assign cards to every request: named cards first (file order), then counts, best free card first.

    No card goes to two services unless every one of them is shared, nor to a card a running container holds
    unless the service is shared. Returns the plan and every problem found (each ServiceError carries 64 or 75).
    """
    plan: dict[str, list[Target]] = {}
    errors: list[ServiceError] = []
    taken: dict[str, list[GpuRequest]] = {}  # pick UUID -> the requests that got it
    for req in requests:
        if req.count is not None and req.count != -1:
            continue
        specs = _every_card(cards) if req.count == -1 else req.specs
        try:
            picks = gpus.resolve_specs(specs, cards)
        except GpupinError as err:
            errors.append(ServiceError.wrap(req.service, err))
            continue
        ok = True
        for p in picks:
            others = list({id(r): r for k in _keys(p) for r in taken.get(k, [])}.values())
            if others and not (req.share and all(r.share for r in others)):
                ok = False
                errors.append(ServiceError(
                    req.service, f"{_describe(p)} is also given to service {', '.join(r.service for r in others)}",
                    f"give each service its own card, or mark every service that shares it `{KEY}: {{share: "
                    "true}`"))
            holders = _holders_of(p, busy)
            if holders and not req.share:
                ok = False
                errors.append(ServiceError(
                    req.service, f"{_describe(p)} is held by running container "
                    f"{', '.join(h.describe() for h in holders)}",
                    "stop it, pick a free card (`hostagent ls`), ask for `count` instead, or share it on purpose "
                    f"with `{KEY}: {{share: true}}`", EX_TEMPFAIL))
        for p in picks:
            taken.setdefault(p.uuid, []).append(req)
        if ok:
            plan[req.service] = picks
    held = set(busy)
    for req in requests:
        if req.count is None or req.count == -1:
            continue
        in_file = set(taken)
        try:
            chosen = gpus.choose_free(req.count, cards, held | in_file)
        except GpuSpecError as err:
            errors.append(ServiceError(req.service, f"count: {req.count}: {err.message.split(': ', 1)[-1]}",
                                       err.hint))
            continue
        if chosen is None:
            free = gpus.free_cards(cards, held | in_file)
            if gpus.choose_free(req.count, cards, in_file) is None:
                errors.append(ServiceError(
                    req.service, f"count: {req.count}, but only {len(gpus.free_cards(cards, in_file))} card(s) are "
                    f"left after the other services' ({', '.join(sorted(in_file)) or 'none'})",
                    "this host has too few cards for the file: lower a count or drop a service"))
            else:
                who = "; ".join(f"{u} by {', '.join(h.describe() for h in busy[u])}" for u in sorted(busy))
                errors.append(ServiceError(
                    req.service, f"count: {req.count}, but only {len(free)} card(s) are left free by the other "
                    f"services and the running containers (held: {who})",
                    "wait for the holders to finish, or stop them (`hostagent ls` shows who holds what)",
                    EX_TEMPFAIL))
            continue
        for p in chosen:
            taken.setdefault(p.uuid, []).append(req)
        plan[req.service] = chosen
    return plan, errors


# --- rendering ------------------------------------------------------------------------------------------------

def _set_env(svc: dict[str, Any], values: Mapping[str, str]) -> None:
    env = svc.get("environment")
    if isinstance(env, list):
        env[:] = [x for x in env if str(x).partition("=")[0] not in values]
        env.extend(f"{k}={v}" for k, v in values.items())
    else:
        if env is None:
            env = svc["environment"] = {}
        env.update(values)


def _set_labels(svc: dict[str, Any], values: Mapping[str, str]) -> None:
    labels = svc.get("labels")
    if isinstance(labels, list):
        labels[:] = [x for x in labels if str(x).partition("=")[0] not in values]
        labels.extend(f"{k}={v}" for k, v in values.items())
    else:
        if labels is None:
            labels = svc["labels"] = {}
        labels.update(values)


def _child(parent: dict[str, Any], key: str) -> dict[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def _set_device_request(svc: dict[str, Any], req: GpuRequest, uuids: list[str]) -> None:
    reservations = _child(_child(_child(svc, "deploy"), "resources"), "reservations")
    devices = reservations.get("devices")
    if not isinstance(devices, list):
        devices = reservations["devices"] = []
    entry: dict[str, Any] = {"driver": "nvidia", "device_ids": uuids, "capabilities": ["gpu"]}
    if req.device_index is not None:
        old = devices[req.device_index]
        caps = old.get("capabilities")
        if isinstance(caps, list) and "gpu" in caps:
            entry["capabilities"] = caps  # keep e.g. [gpu, utility] as the user wrote it
        if old.get("options"):
            entry["options"] = old["options"]
        devices[req.device_index] = entry
    else:
        devices.append(entry)


def render_doc(doc: Mapping[str, Any], requests: Sequence[GpuRequest],
               plan: Mapping[str, Sequence[Target]]) -> dict[str, Any]:
    """A copy of the document with every planned service pinned by UUID and `x-gpupin` removed."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    svcs = out["services"]
    for req in requests:
        picks = list(plan[req.service])
        svc = svcs[req.service]
        svc.pop(KEY, None)
        if req.source == "runtime":
            svc.pop("runtime", None)  # the device request replaces `runtime: nvidia`
        uuids = [p.uuid for p in picks]
        _set_device_request(svc, req, uuids)
        env = {NVD_VAR: ",".join(uuids), EXPECT_VAR: ",".join(p.expect_entry() for p in picks)}
        if req.verify is not None:
            env[VERIFY_VAR] = req.verify
        _set_env(svc, env)
        labels = {LABEL: ",".join(uuids)}
        if req.share:
            labels[SHARED_LABEL] = "true"
        _set_labels(svc, labels)
    return out


def header(file: str, requests: Sequence[GpuRequest], plan: Mapping[str, Sequence[Target]]) -> str:
    lines = [f"# Rendered by `hostagent compose render {os.path.basename(file)}` for the GPUs of this host: every",
             "# card is pinned by UUID and proved inside the container (GPUPIN_EXPECT). Re-render; do not edit."]
    for req in requests:
        for k, p in enumerate(plan[req.service]):
            lines.append(f"#   {req.service}: cuda:{k} = {p.uuid} at {p.bus_id} ({p.name})")
    return "\n".join(lines) + "\n"


class RenderRefused(GpupinError):
    """Every reason a render was refused; the exit code is 64 when any is a usage error, else 75."""

    def __init__(self, errors: Sequence[ServiceError]) -> None:
        super().__init__("; ".join(e.message for e in errors))
        self.errors = list(errors)
        codes = {e.exit_code for e in errors}
        self.exit_code = EX_USAGE if EX_USAGE in codes or not codes else min(codes)


def render(doc: Any, cards: Sequence[Card], busy: Mapping[str, Sequence[Holder]]
           ) -> tuple[dict[str, Any], list[GpuRequest], dict[str, list[Target]]]:
    """The whole render, pure: the rendered document, the requests and their cards; or RenderRefused."""
    svcs = services(doc)
    errors: list[ServiceError] = []
    requests: list[GpuRequest] = []
    for name, svc in svcs.items():
        try:
            req = gpu_request(str(name), svc)
            if req is None:
                continue
            errors.extend(render_refusals(str(name), svc, req))
            requests.append(req)
        except ServiceError as err:
            errors.append(err)
    plan, placing = place(requests, cards, busy)  # placed even after a refusal, so that all are reported
    errors.extend(placing)
    if errors:
        order = {str(name): i for i, name in enumerate(svcs)}
        errors.sort(key=lambda e: order.get(e.service or "", -1))  # stable: each service's in the order found
        raise RenderRefused(errors)
    return render_doc(doc, requests, plan), requests, plan


# --- checking -------------------------------------------------------------------------------------------------

def _index_pick(text: str, cards: Sequence[Card]) -> Target | None:
    for c in cards:
        if str(c.index) == text and c.uuid:
            return Target(c)
    return None


def _check_device_ids(req: GpuRequest, cards: Sequence[Card]) -> tuple[list[Target], list[Problem], bool]:
    """Resolve device ids as the NVIDIA runtime reads them, flagging indices, prefixes and short bus ids.

    Returns the cards, the problems, and whether every id named a card."""
    picks: list[Target] = []
    problems: list[Problem] = []
    complete = True
    where = "NVIDIA_VISIBLE_DEVICES" if req.source == "runtime" else "device id"
    for spec in req.specs:
        try:
            pick = gpus.resolve_spec(spec, cards)
        except GpupinError as err:
            problems.append(Problem(req.service, f"{where} {spec}: {err.message}", err.hint))
            complete = False
            continue
        if spec.isdigit():
            problems.append(Problem(
                req.service, f"{where} {spec} is an NVML index: today it is {_describe(pick)}, but indices follow "
                "PCI bus order and name another card after a card is added, removed or lost",
                f"pin it by UUID: device_ids: [{pick.uuid}] (or `{KEY}: {{gpus: [{pick.uuid}]}}` and render)"))
        elif is_uuid_like(spec) and not is_full_uuid(spec):
            problems.append(Problem(
                req.service, f"{where} {spec} is a UUID prefix, which the NVIDIA container runtime does not "
                "accept", f"write the full UUID {pick.uuid}"))
        elif looks_like_bus_id(spec) and spec.count(":") < 2:
            problems.append(Problem(
                req.service, f"{where} {spec} is a bus id without its PCI domain, which the NVIDIA container "
                "runtime does not accept", f"write the card's UUID {pick.uuid} (or the bus id {pick.bus_id})"))
        if all(p.uuid != pick.uuid for p in picks):
            picks.append(pick)
    return picks, problems, complete


def _check_expectation(req: GpuRequest, env: Mapping[str, str | None], picks: Sequence[Target],
                       cards: Sequence[Card]) -> list[Problem]:
    value = env.get(EXPECT_VAR)
    if value is None:
        return []
    fix = f"let `hostagent compose render` write it, or list exactly the service's cards: {EXPECT_VAR}=" + \
          ",".join(p.expect_entry() for p in picks)
    try:
        expectation = parse_expect(value)
    except GpupinError as err:
        return [Problem(req.service, err.message, err.hint)]
    uuids = [c.uuid for c in cards if c.uuid] + [m.uuid for c in cards for m in c.mig_devices]
    named: list[str] = []
    problems: list[Problem] = []
    for e in expectation.cards:
        try:
            uuid = match_uuid(e.uuid, uuids)
        except GpupinError as err:
            problems.append(Problem(req.service, f"{EXPECT_VAR} names {e.uuid}: {err.message}", fix))
            continue
        named.append(uuid)
        pick = gpus.resolve_spec(uuid, cards)
        if e.bus_id is not None and e.bus_id != pick.bus_id:
            problems.append(Problem(req.service, f"{EXPECT_VAR} puts {uuid} at {e.bus_id}, but it is at "
                                    f"{pick.bus_id}: the entrypoint will refuse to start (78)", fix))
    want = {p.uuid for p in picks}
    if not problems and set(named) != want:
        problems.append(Problem(
            req.service, f"{EXPECT_VAR} names {', '.join(named)} but the service is given "
            f"{', '.join(p.uuid for p in picks) or 'no card'}: the entrypoint will refuse to start (78)", fix))
    return problems


def _check_service(name: str, svc: Any, cards: Sequence[Card]
                   ) -> tuple[GpuRequest | None, list[Target], list[Problem]]:
    """One service on its own: its request, the cards it gets, and what is wrong with it."""
    try:
        req = gpu_request(name, svc)
    except ServiceError as err:
        return None, [], [err.problem()]
    if req is None:
        return None, [], []
    problems: list[Problem] = []
    try:
        n = replicas(svc, name)
    except ServiceError as err:
        problems.append(err.problem())
        n = 1
    if n > 1:
        problems.append(Problem(name, f"has {n} replicas of a pinned service: every replica gets the same cards",
                                "make one service per replica, each with its own cards"))
    env = env_entries(svc, name)
    ledger_label = label_entries(svc, name).get(LABEL)
    picks: list[Target] = []
    if req.source == KEY:
        if ledger_label is not None:
            problems.append(Problem(name, f"sets the label {LABEL} by hand beside `{KEY}`",
                                    "remove it: render writes it (it is the ledger)"))
        for var in OWNED_VARS:
            if var in env:
                problems.append(Problem(name, f"environment sets {var} by hand beside `{KEY}`",
                                        f"remove {var}: render writes it"))
        if req.count is None:
            for spec in req.specs:
                try:
                    pick = gpus.resolve_specs([spec], cards)[0]
                except GpupinError as err:
                    problems.append(Problem(name, f"{KEY}.gpus {spec}: {err.message}", err.hint))
                    continue
                if any(p.uuid == pick.uuid for p in picks):
                    problems.append(Problem(name, f"{KEY}.gpus names {pick.uuid} twice", "ask for each card once"))
                    continue
                picks.append(pick)
        return req, picks, problems
    if req.count is not None:
        usable = [c for c in cards if c.error is None and c.uuid]
        n_cards = len(usable) if req.count == -1 else req.count
        what = "every card" if req.count == -1 else f"count: {req.count}"
        if n_cards > len(usable):
            problems.append(Problem(name, f"{what}, but this host has {len(usable)} card(s)",
                                    "ask for fewer, by UUID"))
        picks = [p for p in (_index_pick(str(i), cards) for i in range(n_cards)) if p is not None]
        complete = len(picks) == n_cards
        first = ", ".join(f"{p.card.index} = {p.uuid}" for p in picks)
        problems.append(Problem(
            name, f"{what} is not a pin: Docker gives the first {n_cards} card(s) by index ({first}), whoever "
            "holds them, and nothing checks it inside the container",
            f"name the cards: `{KEY}: {{gpus: [...]}}` or `{KEY}: {{count: {max(n_cards, 1)}}}`, then "
            "`hostagent compose render`", WARNING))
    else:
        picks, found, complete = _check_device_ids(req, cards)
        problems.extend(found)
    if complete:  # an expectation is compared only with cards that all exist
        problems.extend(_check_expectation(req, env, picks, cards))
    if complete and ledger_label is not None:
        labelled = {u.strip() for u in ledger_label.split(",") if u.strip()}
        if labelled != {p.uuid for p in picks}:
            problems.append(Problem(
                name, f"the label {LABEL}={ledger_label} is not the cards the service is given, so the ledger "
                "would be wrong about who holds which card",
                f"let `hostagent compose render` write it, or make it {','.join(p.uuid for p in picks)}"))
    nvd = env.get(NVD_VAR)
    if req.source == "deploy" and nvd is not None and picks:
        try:
            named = [gpus.resolve_spec(s.strip(), cards).uuid for s in nvd.split(",") if s.strip()]
        except GpupinError:
            named = []
        if set(named) != {p.uuid for p in picks}:
            problems.append(Problem(name, f"environment sets {NVD_VAR}={nvd}, which disagrees with the device "
                                    "request (the runtime follows the device request)",
                                    f"remove {NVD_VAR}, or make it {','.join(p.uuid for p in picks)}", WARNING))
    return req, picks, problems


class CheckResult:
    """What `check` found: problems, the services with GPUs, the cards they pin, and the counts left to render."""

    def __init__(self, problems: Sequence[Problem], gpu_services: int, cards: int, counted: int) -> None:
        self.problems = list(problems)
        self.gpu_services = gpu_services
        self.cards = cards
        self.counted = counted

    @property
    def ok(self) -> bool:
        return not any(p.severity == ERROR for p in self.problems)

    def summary(self) -> str:
        line = f"ok: {self.gpu_services} service(s) with GPUs, {self.cards} card(s) pinned"
        if self.counted:
            line += f", {self.counted} more to be placed by `hostagent compose render` (count)"
        warnings = sum(p.severity == WARNING for p in self.problems)
        return line + (f" ({warnings} warning(s))" if warnings else "")


def check(doc: Any, cards: Sequence[Card], busy: Mapping[str, Sequence[Holder]]) -> CheckResult:
    """Every problem with a compose file's GPUs on this host, pure over the cards and the ledger."""
    try:
        svcs = services(doc)
    except ServiceError as err:
        return CheckResult([err.problem()], 0, 0, 0)
    problems: list[Problem] = []
    given: dict[str, list[tuple[str, Target, bool]]] = {}  # UUID -> (service, pick, shared)
    n_services = 0
    counted = 0
    pinned: set[str] = set()
    reqs: list[tuple[GpuRequest, list[Target]]] = []
    for raw_name, svc in svcs.items():
        name = str(raw_name)
        try:
            req, picks, found = _check_service(name, svc, cards)
        except ServiceError as err:
            problems.append(err.problem())
            continue
        problems.extend(found)
        if req is None:
            continue
        n_services += 1
        reqs.append((req, picks))
        if req.source == KEY and req.count is not None:
            counted += req.count
        for p in picks:
            pinned.add(p.uuid)
            for k in _keys(p):
                prior = [(s, q, sh) for s, q, sh in given.get(k, []) if s != name]
                if prior and not (req.share and all(sh for _, _, sh in prior)):
                    others = ", ".join(dict.fromkeys(s for s, _, _ in prior))
                    problems.append(Problem(
                        name, f"{_describe(p)} is also given to service {others}: both would run on one card",
                        "give each service its own card by UUID (`hostagent compose render` places them), or mark "
                        f"every service that shares it `{KEY}: {{share: true}}` / label {SHARED_LABEL}=true"))
                    break
            given.setdefault(p.uuid, []).append((name, p, req.share))
        for p in picks:
            holders = _holders_of(p, busy)
            if holders and not req.share:
                problems.append(Problem(
                    name, f"{_describe(p)} is held by running container "
                    f"{', '.join(h.describe() for h in holders)}",
                    "stop it, pick a free card (`hostagent ls`), or share it on purpose "
                    f"(`{KEY}: {{share: true}}`)"))
    if counted:
        free = gpus.free_cards(cards, set(busy) | pinned)
        if counted > len(free):
            problems.append(Problem(None, f"the services ask for {counted} card(s) by count, but only {len(free)} "
                                    "card(s) are free after the named ones and the running containers'",
                                    "lower a count, or free cards (`hostagent ls`)"))
    return CheckResult(problems, n_services, len(pinned), counted)


# --- the ledger, minus this project's own containers ----------------------------------------------------------

def project_names(doc: Any, paths: Iterable[str], environ: Mapping[str, str]) -> set[str]:
    """The compose project names this file may run under (COMPOSE_PROJECT_NAME, `name:`, its directory)."""
    names: set[str] = set()
    if environ.get("COMPOSE_PROJECT_NAME"):
        names.add(environ["COMPOSE_PROJECT_NAME"])
    if isinstance(doc, dict) and isinstance(doc.get("name"), str):
        names.add(doc["name"])
    for path in paths:
        base = os.path.basename(os.path.dirname(os.path.abspath(path)))
        names.add(re.sub(r"[^-_a-z0-9]", "", base.lower()))
    return {n for n in names if n}


def own_container_ids(summaries: Iterable[Mapping[str, Any]], projects: set[str], names: set[str]) -> set[str]:
    """Containers of this very project and its services: re-rendering or checking a running project is not
    a conflict with itself."""
    out: set[str] = set()
    for s in summaries:
        labels = s.get("Labels") or {}
        if labels.get(_COMPOSE_PROJECT) in projects and labels.get(_COMPOSE_SERVICE) in names:
            out.add(str(s["Id"]))
    return out


def _say(msg: str) -> None:
    sys.stderr.write(f"hostagent: {msg}\n")


def read_busy(cards: Sequence[Card], projects: set[str], service_names: set[str]) -> dict[str, list[Holder]]:
    """The ledger (card UUID -> running holders), without this project's containers; when Docker cannot be
    reached, say so and count every card as free."""
    from gpupin.hostagent import engine, ledger

    try:
        api = engine.connect(timeout=10)
        holders = engine.read_holders(api, cards)
        own = own_container_ids(api.containers(all=True, filters={"label": _COMPOSE_PROJECT}), projects,
                                service_names)
    except Exception as err:
        _say(f"the ledger was not read (Docker at {engine.docker_host()}: {getattr(err, 'message', err)}): "
             "cards held by running containers are not taken into account")
        return {}
    return ledger.held(h for h in holders if h.id not in own)


# --- commands -------------------------------------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}", "give the path of a compose file") from None


def _cards() -> list[Card]:
    from gpupin.entrypoint import nvml

    return nvml.list_cards(detail=True, mig=True, tolerate_lost=True)


def _service_names(doc: Any) -> set[str]:
    svcs = doc.get("services") if isinstance(doc, dict) else None
    return {str(k) for k in svcs} if isinstance(svcs, dict) else set()


def _write(path: str, text: str) -> None:
    """All or nothing: a refused or interrupted render leaves no half-written file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpupin-render-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _error_line(file: str, err: ServiceError) -> str:
    """`ERROR: FILE: service NAME: what. HINT: what to do` (the file is named once)."""
    where = f"service {err.service}: " if err.service is not None else ""
    message = err.message if err.message.startswith(file) else f"{file}: {where}{err.message}"
    hint = f" HINT: {err.hint}" if err.hint else ""
    return f"ERROR: {message}.{hint}"


def render_command(file: str, output: str | None) -> int:
    """`hostagent compose render FILE [-o OUT]`: 0 and the pinned file; 64/75/69 with one line per problem."""
    text = _read(file)
    try:
        doc = parse_text(text, file)
        services(doc)
    except ServiceError as err:
        _say(_error_line(file, err))
        return err.exit_code
    cards = _cards()
    paths = [file] + ([output] if output else [])
    busy = read_busy(cards, project_names(doc, paths, os.environ), _service_names(doc))
    try:
        rendered, requests, plan = render(doc, cards, busy)
    except RenderRefused as refused:
        for e in refused.errors:
            _say(_error_line(file, e))
        return refused.exit_code
    if not requests:
        _say(f"{file}: no service asks for GPUs; the file is written unchanged")
    out = header(file, requests, plan) + dump(rendered)
    if output is None:
        sys.stdout.write(out)
        return 0
    _write(output, out)
    if os.path.dirname(os.path.abspath(output)) != os.path.dirname(os.path.abspath(file)):
        _say(f"note: compose resolves relative paths (build, volumes, env_file) against {output}'s directory; "
             "write it beside the source, or run compose with --project-directory")
    return 0


def check_command(file: str, as_json: bool) -> int:
    """`hostagent compose check FILE [--json]`: 0 when clean (warnings allowed), 64 with one line per problem."""
    text = _read(file)
    try:
        doc = parse_text(text, file)
    except ServiceError as err:
        doc = None
        result = CheckResult([err.problem()], 0, 0, 0)
    else:
        cards = _cards()
        busy = read_busy(cards, project_names(doc, [file], os.environ), _service_names(doc))
        result = check(doc, cards, busy)
    if as_json:
        sys.stdout.write(json.dumps([p.to_dict() for p in result.problems], indent=2) + "\n")
    else:
        for p in result.problems:
            sys.stdout.write(p.line(file) + "\n")
        if result.ok:
            sys.stdout.write(result.summary() + "\n")
    return 0 if result.ok else EX_USAGE

"""`render`: the rules, the placement, and the pin (hostagent.pin) written into each service that asks for GPUs:
the device request by UUID, through CDI or the nvidia driver as `hostagent run` pins, with the pin's variables
and labels in the spelling the user wrote; everything else is kept. On podman the pin is CDI names in
`devices:` (docs/podman.md). Pure over the document, the cards, the ledger and what the daemon serves.
"""

from __future__ import annotations

import copy
import os

from gpupin.core.contract import NVD_VAR
from gpupin.hostagent.compose import booking
from gpupin.hostagent.compose.gpurequest import as_cdi_names
from gpupin.hostagent.compose.problems import Problem, RenderRefused, printable
from gpupin.hostagent.compose.rules import Examination, examine
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger.booking import FOR_LABEL
from gpupin.hostagent.pin import Pin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.yamlfile import YAMLMapping


def set_entries(svc: YAMLMapping, key: str, values: Mapping[str, str]) -> None:
    """Set entries of `environment` or `labels`, in the spelling the service uses (KEY=VALUE list or mapping); an
    entry that is there is replaced where it is, so that a rendered file renders to itself."""
    entries = svc.get(key)
    if isinstance(entries, list):
        todo = dict(values)
        kept: list[Any] = []
        for x in entries:
            name = str(x).partition("=")[0]
            if name in values:
                if name in todo:
                    kept.append(f"{name}={todo.pop(name)}")
                continue
            kept.append(x)
        entries[:] = kept + [f"{k}={v}" for k, v in todo.items()]
    else:
        if entries is None:
            entries = svc[key] = {}
        entries.update(values)


def _unset(svc: YAMLMapping, key: str, names: set[str]) -> None:
    """Remove entries of `environment` or `labels` in either spelling."""
    entries = svc.get(key)
    if isinstance(entries, list):
        entries[:] = [x for x in entries if str(x).partition("=")[0] not in names]
    elif isinstance(entries, dict):
        for name in names:
            entries.pop(name, None)


NOT_ASKED = cdi.Detection(False, "the daemon was not asked")


def pinned(
    doc: Mapping[str, Any],
    exam: Examination,
    detection: cdi.Detection = NOT_ASKED,
    via: str | None = None,
    podman: str | None = None,
) -> YAMLMapping:
    """A copy of the document with every service that asks for GPUs pinned to the cards of the plan, through CDI
    or the nvidia driver (`via`, else as `detection` finds the daemon serves each service's cards); on `podman` (its
    version) as CDI names in `devices:`."""
    out: YAMLMapping = copy.deepcopy(dict(doc))
    for req in exam.requests:
        targets = exam.plan[req.service]
        way = detection.via([t.uuid for t in targets], via, req.capabilities)
        pin = Pin(targets, share=req.share, verify=req.verify, via=way)
        svc = out["services"][req.service]
        length = booking.asked(req.service, svc)  # before the form's key goes
        req.form.write(svc, req, pin)
        if podman:
            as_cdi_names(svc, pin)
        if way == cdi.CDI:  # the spec sets it (void); one the file kept from another way would only mislead
            _unset(svc, "environment", {NVD_VAR})
        set_entries(svc, "environment", pin.env())
        set_entries(svc, "labels", pin.labels() | ({} if length is None else {FOR_LABEL: length}))
    return out


def header(file: str, exam: Examination) -> str:
    lines = [
        f"# Rendered by `hostagent compose render {printable(os.path.basename(file))}` for the GPUs of this "
        "host: every",
        "# card is pinned by UUID and proved inside the container (GPUPIN_EXPECT). Re-render; do not edit.",
    ]
    for req in exam.requests:
        for k, t in enumerate(exam.plan[req.service]):
            lines.append(f"#   {req.service}: cuda:{k} = {t.uuid} at {t.bus_id} ({printable(t.name)})")
    return "\n".join(lines) + "\n"


def render(
    doc: Any,
    cards: Sequence[Card],
    busy: Mapping[str, Sequence[Holder]],
    detection: cdi.Detection = NOT_ASKED,
    via: str | None = None,
    unknown: str | None = None,
    file_env: Mapping[str, Mapping[str, str | None]] | None = None,
    podman: str | None = None,
) -> tuple[YAMLMapping, Examination]:
    """The pinned document and what `examine` found; RenderRefused with every refusal when there is one (`unknown`:
    why the ledger was not read, None when it was; `file_env`: hostagent.compose.rules.examine; `podman`: the
    version of the podman that serves, None for Docker)."""
    exam = examine(doc, cards, busy, unknown, file_env)
    refusals = exam.refusals
    if via == cdi.CDI:  # as `hostagent run --via cdi --gpu-capabilities`: a CDI request carries no capabilities
        refusals += [
            Problem(
                r.service,
                f"asks for the driver capabilities {', '.join(r.capabilities)}, which a CDI "
                "device request cannot carry (its spec decides them)",
                "render without --via cdi, or drop them from `capabilities:`",
            )
            for r in exam.requests
            if r.capabilities
        ]
    if podman:  # only a CDI name pins there; the nvidia driver's request would start the service with no card
        refusals += [
            Problem(
                r.service,
                f"would be pinned by the nvidia driver (`--via nvidia` or driver capabilities) on podman {podman}, "
                "whose compose tools drop that request: the service would start with no card pinned",
                "render without --via nvidia, and drop the capabilities: podman pins by CDI names in `devices:`",
            )
            for r in exam.requests
            if via == cdi.NVIDIA or (via is None and r.capabilities)
        ]
    if refusals:
        raise RenderRefused(refusals)
    return pinned(doc, exam, detection, via, podman), exam

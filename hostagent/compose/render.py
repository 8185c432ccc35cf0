"""`render`: the rules, the placement, and the pin (hostagent.pin) written into each service that asks for GPUs.

Per service: the device request by UUID where its form asked (hostagent.compose.request.Form.write), the pin's
environment (NVIDIA_VISIBLE_DEVICES, GPUPIN_EXPECT in local-rank order, GPUPIN_VERIFY when asked) and labels
(gpupin.devices, gpupin.shared), kept in the list or mapping spelling the user wrote. Everything else is kept;
`x-gpupin` is removed. Pure over the document, the cards and the ledger.
"""

from __future__ import annotations

import copy
import os

from gpupin.hostagent.compose.problems import RenderRefused, printable
from gpupin.hostagent.compose.rules import Examination, examine
from gpupin.hostagent.pin import Pin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card
    from gpupin.hostagent.ledger import Holder


def set_entries(svc: dict[str, Any], key: str, values: Mapping[str, str]) -> None:
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


def pinned(doc: Mapping[str, Any], exam: Examination) -> dict[str, Any]:
    """A copy of the document with every service that asks for GPUs pinned to the cards of the plan."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    for req in exam.requests:
        pin = Pin(exam.plan[req.service], share=req.share, verify=req.verify)
        svc = out["services"][req.service]
        req.form.write(svc, req, pin)
        set_entries(svc, "environment", pin.env())
        set_entries(svc, "labels", pin.labels())
    return out


def header(file: str, exam: Examination) -> str:
    lines = [f"# Rendered by `hostagent compose render {printable(os.path.basename(file))}` for the GPUs of this "
             "host: every",
             "# card is pinned by UUID and proved inside the container (GPUPIN_EXPECT). Re-render; do not edit."]
    for req in exam.requests:
        for k, t in enumerate(exam.plan[req.service]):
            lines.append(f"#   {req.service}: cuda:{k} = {t.uuid} at {t.bus_id} ({printable(t.name)})")
    return "\n".join(lines) + "\n"


def render(doc: Any, cards: Sequence[Card], busy: Mapping[str, Sequence[Holder]]
           ) -> tuple[dict[str, Any], Examination]:
    """The pinned document and what `examine` found; RenderRefused with every refusal when there is one."""
    exam = examine(doc, cards, busy)
    refusals = exam.refusals
    if refusals:
        raise RenderRefused(refusals)
    return pinned(doc, exam), exam

"""A compose or swarm service's booking, `x-gpupin: {for: DURATION}`, written as the container label
gpupin.booking.for: a rendered file cannot know when its containers start, so it carries the length and the
resident agent books each container from its own start. Judged by run's rule for everyone's table
(docs/policy.md, "Compose and Swarm").
"""

from __future__ import annotations

from gpupin.core.errors import UsageError
from gpupin.hostagent.compose.gpurequest import KEY
from gpupin.hostagent.compose.problems import Problem, ServiceError, quoted
from gpupin.hostagent.compose.service import label_entries
from gpupin.hostagent.ledger.booking import FOR_LABEL, LABEL, parse_duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpupin.hostagent.policy import Policy

HINT = f"write `{KEY}: {{for: 4h}}` (45s, 90m, 4h, 2d, 1w, 1h30m)"


def _seconds(service: str, where: str, value: Any) -> float:
    try:
        return parse_duration(value)
    except ValueError as err:
        raise ServiceError(service, f"{where}: {err}", HINT) from None


def asked(service: str, svc: Mapping[str, Any]) -> str | None:
    """The booking's length as written (checked to be a duration), from `x-gpupin.for` or the label it renders to
    (both: they must agree); None: the service books nothing of its own."""
    x = svc.get(KEY)
    mine = x.get("for") if isinstance(x, dict) else None
    labels = label_entries(svc, service)
    if LABEL in labels:
        raise ServiceError(
            service,
            f"sets the label {LABEL} by hand: hostagent writes it, with the uid the kernel names",
            f"ask for a length with `{KEY}: {{for: 4h}}`",
        )
    written = labels.get(FOR_LABEL)
    found = [
        (where, value, _seconds(service, where, value))
        for where, value in ((f"{KEY}.for", mine), (f"the label {FOR_LABEL}", written))
        if value is not None
    ]
    if len(found) == 2 and found[0][2] != found[1][2]:
        raise ServiceError(
            service,
            f"{KEY}.for is {quoted(mine)} but the label {FOR_LABEL} says {quoted(written)}",
            f"keep one: {KEY}.for (render writes the label from it)",
        )
    return None if not found else str(found[0][1]).strip()


def problems(doc: Any, policy: Policy) -> list[Problem]:
    """Each service's booking that no run could have: not a duration, or past the policy's maximum (for
    everyone: the agent cannot know who starts the file)."""
    from gpupin.hostagent.ledger.booking import NO_ONE, length

    out = []
    services = doc.get("services") if isinstance(doc, dict) else None
    for name, svc in (services or {}).items() if isinstance(services, dict) else ():
        if not isinstance(svc, dict):
            continue
        try:
            text = asked(str(name), svc)
            if text is not None:
                length(policy, NO_ONE, parse_duration(text), f"{KEY}.for")
        except ServiceError as err:
            out.append(err.problem())
        except UsageError as err:
            out.append(Problem(str(name), err.message, err.hint))
    return out

"""The cards a service holds through its `devices:` device files: `/dev/nvidiaN` is the card whose minor number is
N (gpupin.core.resolve.by_minor), and a folder above it (`/dev`, `/`) holds every card, since Docker adds every
device under a folder it is given. Both of compose's syntaxes: the short `SOURCE[:TARGET[:PERMISSIONS]]` and the
long `{source:, target:, permissions:}`.

Such a service holds its cards outside any pin: `check` and `render` count them (a card given to two services, a
count that must land elsewhere), and render leaves the entries as they are. /dev/nvidiactl, /dev/nvidia-uvm and
/dev/nvidia-caps name no card.
"""

from __future__ import annotations

import posixpath
import re

from gpupin.core.errors import GpupinError
from gpupin.core.resolve import Target, by_minor
from gpupin.hostagent.compose.gpurequest import GpuRequest, GpuRequestForm
from gpupin.hostagent.compose.place import Assignment
from gpupin.hostagent.compose.problems import ServiceError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card

_CARD_FILE = re.compile(r"/dev/nvidia([0-9]+)")
_ABOVE = ("/", "/dev")  # folders that hold /dev/nvidiaN


class DeviceFiles(GpuRequestForm):
    """Not a way to ask for a pin: what a service is given by device file, beside whatever it asks."""

    name = "device files in `devices:`"


DEVICE_FILES = DeviceFiles()


def _source(item: Any) -> str | None:
    """The host path of one `devices:` entry (None: a CDI name, or not a path)."""
    text = item.get("source") if isinstance(item, dict) else item
    if not isinstance(text, str) or not text.startswith("/"):
        return None
    return posixpath.normpath(text if isinstance(item, dict) else text.split(":", 1)[0])


def held(svc: Mapping[str, Any], service: str, cards: Sequence[Card]) -> list[Target]:
    """The cards the service's device files give it, in file order, each once; ServiceError for /dev/nvidiaN that
    no card has (compose fails to start the service: the file does not exist)."""
    devices = svc.get("devices")
    out: list[Target] = []
    for i, item in enumerate(devices if isinstance(devices, list) else []):
        if isinstance(item, dict) and "source" not in item:
            raise ServiceError(
                service,
                f"devices entry {i} has no `source`: compose refuses it (services.{service}."
                f"devices.{i} source is required)",
                "give the host's path: {source: /dev/..., target: ...}",
            )
        path = _source(item)
        if path is None:
            continue
        if path in _ABOVE:
            found = [Target(c) for c in cards if c.minor_number is not None and c.uuid]
        else:
            m = _CARD_FILE.fullmatch(path)
            if not m:
                continue
            try:
                found = [by_minor(int(m.group(1)), cards)]
            except GpupinError as err:
                raise ServiceError(service, f"devices: {path}: {err.message}", err.hint) from None
        out.extend(t for t in found if t not in out)
    return out


def assignment(svc: Mapping[str, Any], service: str, cards: Sequence[Card]) -> Assignment | None:
    """The service's device-file cards as the booking rule sees them (no pin), or None when it has none."""
    targets = held(svc, service, cards)
    if not targets:
        return None
    req = GpuRequest(service, DEVICE_FILES, [t.uuid for t in targets], share=DEVICE_FILES.shared(svc, service))
    return Assignment(req, targets, pinned=False)

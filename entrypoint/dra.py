"""Kubernetes DRA device metadata (KEP-5304) as an expectation: the GPUs of the claims this container uses.

Imported only when the metadata folder exists. What is read (files, format, attributes) and how a device names
a card: docs/kubernetes.md, "DRA: the claim is the expectation". Bad metadata is refused (64): a claim
allocated GPUs and its record cannot be read, so a silent unpinned start is no answer.
"""

from __future__ import annotations

import json
import os
import re

from gpupin.core.errors import ExpectationError, MisalignedError, UsageError, shorten, shown
from gpupin.core.expectation import Expectation, ExpectedCard
from gpupin.core.files import FileRefused, read_bounded
from gpupin.core.identity import BusId, is_full_uuid, normalize_uuid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Union

    from gpupin.core.nvml import Card

    Answer = Union[Expectation, str, None]

KINDS = ("resourceclaims", "resourceclaimtemplates")  # claims the Pod names; claims made from its templates
SUFFIX = "-metadata.json"
VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
NVIDIA = "gpu.nvidia.com"  # NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu)
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"  # the standard attribute (k8s.io/dynamic-resource-allocation)
FILE_LIMIT = 1 << 20  # a GPU's record is a few KiB; the claim is the kubelet's, the folder the image's too
MAX_FILES = 64
_MINOR = re.compile(r"gpu-([0-9]{1,4})")
_HINT = (
    "the DRA driver's device metadata is written by its kubelet plugin: check the claim (`kubectl describe "
    "resourceclaim`) and the driver's version; or set GPUPIN_EXPECT in the Pod spec, which wins"
)


def _refuse(where: str, why: str) -> ExpectationError:
    return ExpectationError(f"DRA device metadata {where}: {why}", _HINT)


def files(root: str) -> list[str]:
    """The metadata files under `root`, in path order: `<kind>/<claim>/<request>/<driver>-metadata.json`. Links
    are refused rather than followed (the kubelet bind-mounts files: a link was put there by someone else)."""
    found: list[str] = []
    for sub in KINDS:
        level = [os.path.join(root, sub)]
        for _depth in range(2):  # the claim's folders, then each request's
            below: list[str] = []
            for folder in level:
                try:
                    with os.scandir(folder) as it:
                        entries = sorted(it, key=lambda e: e.name)
                except FileNotFoundError:
                    continue
                except OSError as err:
                    raise _refuse(shown(folder), f"cannot read the folder ({err.strerror})") from None
                below.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
            level = below
        for folder in level:
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as err:
                raise _refuse(shown(folder), f"cannot read the folder ({err.strerror})") from None
            for e in entries:
                if not e.name.endswith(SUFFIX):
                    continue
                if e.is_symlink():
                    raise _refuse(shown(e.path), "it is a symbolic link, not the file the kubelet mounts")
                found.append(e.path)
                if len(found) > MAX_FILES:
                    raise _refuse(shown(root), f"more than {MAX_FILES} metadata files")
    return found


def _objects(path: str, text: str) -> list[Any]:
    """The JSON values of a stream (objects one after another, whitespace between), or refuse."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    i, end = 0, len(text)
    while True:
        while i < end and text[i] in " \t\r\n":
            i += 1
        if i == end:
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError as err:
            raise _refuse(shown(path), f"not a stream of JSON objects ({err})") from None
        except RecursionError:  # nested deeper than Python's stack: no record of a claim is
            raise _refuse(shown(path), "JSON nested too deeply") from None
        values.append(value)


def _string(attrs: dict[str, Any], key: str, where: str) -> str | None:
    """A string attribute (`{"string": "..."}`), None when absent; another shape is refused."""
    value = attrs.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("string"), str):
        raise _refuse(where, f"attribute {shorten(key)} is not a string value ({shorten(value)})")
    text: str = value["string"]
    return text


def _field(obj: dict[str, Any], key: str, typ: type, where: str, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return typ()
    if not isinstance(value, typ):
        raise _refuse(where, f"{key} is {shorten(value)}, not a {'list' if typ is list else typ.__name__}")
    return value


class Named:
    """A device of the metadata that names a GPU, by what it carries (a UUID, a bus id, a minor number)."""

    __slots__ = ("bus_id", "minor", "uuid", "where")

    def __init__(self, where: str, uuid: str | None, bus_id: BusId | None, minor: int | None) -> None:
        self.where = where
        self.uuid = uuid
        self.bus_id = bus_id
        self.minor = minor


def parse(path: str, data: bytes, label: str) -> tuple[list[Named], list[str]]:
    """The GPUs one file names, and the devices it names that are no GPU (`driver/pool/name`, for the report)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(shown(path), "not UTF-8 text") from None
    values = _objects(path, text)
    known = [
        v
        for v in values
        if isinstance(v, dict) and v.get("kind") == "DeviceMetadata" and v.get("apiVersion") in VERSIONS
    ]
    if not known:
        seen = sorted({shorten(v.get("apiVersion")) for v in values if isinstance(v, dict)})
        raise _refuse(
            shown(path),
            f"no DeviceMetadata object of a version gpupin reads ({', '.join(VERSIONS)}); found "
            f"{', '.join(seen) or 'none'}",
        )
    obj = known[0]
    named: list[Named] = []
    other: list[str] = []
    for r, request in enumerate(_field(obj, "requests", list, label, required=False)):
        where = f"{label} request {r}"
        if not isinstance(request, dict):
            raise _refuse(where, f"{shorten(request)} is not an object")
        for d, device in enumerate(_field(request, "devices", list, where, required=False)):
            at = f"{where} device {d}"
            if not isinstance(device, dict):
                raise _refuse(at, f"{shorten(device)} is not an object")
            driver = _field(device, "driver", str, at)
            name = _field(device, "name", str, at)
            attrs = _field(device, "attributes", dict, at, required=False)
            at = f"{label} device {shown(driver)}/{shown(name)}"
            uuid = _string(attrs, "uuid", at) or _string(attrs, f"{driver}/uuid", at)
            bus_text = _string(attrs, PCI_BUS_ID, at)
            if uuid is not None:
                if not is_full_uuid(uuid):
                    if driver == NVIDIA:
                        raise _refuse(at, f"uuid {shorten(uuid)} is not a GPU or MIG UUID")
                    other.append(f"{shown(driver)}/{shown(name)}")
                    continue
                uuid = normalize_uuid(uuid)
            elif driver != NVIDIA:
                other.append(f"{shown(driver)}/{shown(name)}")  # no GPU UUID: a NIC's pciBusID is no GPU's
                continue
            bus: BusId | None = None
            if bus_text is not None:
                try:
                    bus = BusId.parse(bus_text)
                except UsageError:
                    raise _refuse(at, f"{PCI_BUS_ID} {shorten(bus_text)} is not a PCI bus id") from None
            m = _MINOR.fullmatch(name) if driver == NVIDIA else None
            if uuid is None and bus is None and m is None:
                other.append(f"{shown(driver)}/{shown(name)}")
                continue
            named.append(Named(at, uuid, bus, int(m.group(1)) if m else None))
    return named, other


def read(root: str, read_cards: Callable[[], list[Card]]) -> Answer:
    """The expectation from every metadata file under `root`; a reason when they name no GPU; None without any."""
    paths = files(root)
    if not paths:
        return None
    named: list[Named] = []
    other: list[str] = []
    claims: list[str] = []
    for path in paths:
        rel = os.path.relpath(path, root)
        parts = rel.split(os.sep)
        label = "/".join(shown(p) for p in parts[1:3])  # claim/request, on one line whatever the folders' names
        try:
            data = read_bounded(path, FILE_LIMIT)
        except FileRefused as err:
            raise _refuse(shown(path), err.reason) from None
        found, rest = parse(path, data, label)
        named.extend(found)
        other.extend(rest)
        if found and label not in claims:
            claims.append(label)
    if not named:
        devices = sorted(set(other))
        more = f" and {len(devices) - 4} more" if len(devices) > 4 else ""
        return f"the DRA device metadata names no GPU ({', '.join(devices[:4]) or 'no device'}{more})"
    cards = read_cards()  # NVML, once: the caller keeps what it read
    expected: list[ExpectedCard] = []
    seen: set[str] = set()
    for n in named:
        uuid, bus = n.uuid, n.bus_id
        if uuid is None:  # a bus id or a minor number: the card NVML numbers so
            match = [c for c in cards if (c.bus_id == bus if bus is not None else c.minor_number == n.minor)]
            if not match or match[0].uuid is None:
                what = f"the GPU at {bus}" if bus is not None else f"the GPU of minor number {n.minor}"
                raise MisalignedError(
                    f"{n.where} names {what}, which is not among the {len(cards)} card(s) NVML sees here",
                    "the container did not get the card its claim allocated: check the DRA driver's CDI spec "
                    "and the container runtime's CDI support",
                )
            uuid, bus = match[0].uuid, bus if bus is not None else match[0].bus_id
        if uuid not in seen:  # a claim shared by two requests names its card twice
            seen.add(uuid)
            expected.append(ExpectedCard(uuid, bus))
    position = {u: i for i, c in enumerate(cards) for u in (c.uuid, *(m.uuid for m in c.mig_devices))}
    expected.sort(key=lambda e: (position.get(e.uuid, len(position)), e.uuid))
    source = f"the DRA claim {', '.join(claims)}"
    return Expectation(expected, source, f"DRA device metadata ({', '.join(claims)}; NVML's order)")

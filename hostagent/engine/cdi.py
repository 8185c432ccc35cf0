"""CDI, the Container Device Interface: the names NVIDIA's spec gives the cards (`nvidia.com/gpu=` index, UUID, MIG
device, `all`), and whether a daemon serves them, asked on every run from one `GET /info` (its discovered devices,
else the spec files of a daemon on this host, read with limits: anyone who can write a spec folder must not hang
`run`, `doctor` or the root agent). docs/cdi.md, "What is asked".
"""

from __future__ import annotations

import errno
import os
import re

from gpupin.core.identity import WHOLE, index_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

KIND = "nvidia.com/gpu"
CDI = "cdi"  # the Engine's device driver for CDI names, and the `via` that pins through it
NVIDIA = "nvidia"  # the Engine's nvidia device driver (`--gpus`): the `via` of every engine without CDI
VIAS = (CDI, NVIDIA)
MAX_BYTES = 1 << 20  # one spec file: NVIDIA's for 8 cards with every MIG device is tens of KiB
MAX_FILES = 64  # spec files read in one folder (a host has one or two)
MIN_API = "1.44"  # CDISpecDirs in /info (Engine 25): an older daemon has no CDI
# The CDI library's rules: vendor and class of letters, digits, '.', '-', '_'; names add ':'.
_QUALIFIED = r"([A-Za-z0-9][A-Za-z0-9._-]*)/([A-Za-z0-9][A-Za-z0-9._-]*)=([A-Za-z0-9_.:-]+)"


def name(device: str) -> str:
    """The fully qualified CDI name of an NVIDIA device (a UUID, an index, `i:j`, `all`)."""
    return f"{KIND}={device}"


def parse(text: str) -> tuple[str, str] | None:
    """(kind, device name) of a qualified CDI name, or None for text that is not one (a path, a bare id)."""
    m = re.fullmatch(_QUALIFIED, text.strip())
    return (f"{m.group(1)}/{m.group(2)}", m.group(3)) if m else None


def gpu_device(text: str) -> str | None:
    """The device name of an `nvidia.com/gpu=NAME` CDI name, None for any other text or kind (which names no GPU)."""
    parsed = parse(text)
    return parsed[1] if parsed is not None and parsed[0] == KIND else None


def as_spec(device: str) -> str:
    """A device name of NVIDIA's spec as a GPU spec gpupin.core.resolve reads: the `type-index` strategy's
    `gpu2` and `mig0:1` are the index `2` and the MIG pair `0:1`; every other name is one already."""
    for prefix, mig in (("gpu", False), ("mig", True)):
        key = index_key(device[len(prefix) :]) if device.startswith(prefix) else None
        if key is not None and (key[1] != WHOLE) == mig:
            return device[len(prefix) :]
    return device


class Detection:
    """Whether the daemon serves `nvidia.com/gpu` CDI devices, the device names it serves (None: not known, e.g.
    a remote daemon), and how that was found (for --dry-run and messages)."""

    __slots__ = ("names", "served", "why")

    def __init__(self, served: bool, why: str, names: Iterable[str] | None = None) -> None:
        self.served = served
        self.why = why
        self.names = frozenset(names) if names is not None else None

    def via(self, uuids: Sequence[str], asked: str | None = None, capabilities: Sequence[str] = ()) -> str:
        """The way to pin these cards: `asked` when given; else CDI where the daemon serves every one of them by
        UUID and no driver capability is asked; else the nvidia driver."""
        if asked is not None:
            return asked
        if not self.served or capabilities:
            return NVIDIA
        if self.names is not None and not all(u in self.names for u in uuids):
            return NVIDIA  # a spec without UUID names (the `index` strategy alone): an index is no pin
        return CDI

    def __repr__(self) -> str:
        return f"Detection(served={self.served}, {self.why})"


_TOP_KEY = r"([A-Za-z_][A-Za-z0-9_]*):(.*)"
_ITEM_NAME = r"(?:- +)?name: *(.*)"


def _scalar(text: str) -> str:
    """A plain, single- or double-quoted YAML scalar on one line (CDI names need no escapes), comment dropped."""
    t = text.strip()
    if t[:1] in ("'", '"'):
        end = t.find(t[0], 1)
        return t[1:end] if end > 0 else t[1:]
    return t.split(" #", 1)[0].strip()


def _block_names(text: str) -> tuple[str, list[str]] | None:
    """(kind, device names) of a spec written in block style, as `nvidia-ctk cdi generate` writes YAML (both the
    `devices:` list indented and not); None when the text is in any other shape, which PyYAML then reads. Reading
    the two keys by line spares the run path PyYAML's import (15 ms on a 2-core machine)."""
    kind = ""
    names: list[str] = []
    in_devices = False
    item_col = -1
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or line in ("---", "..."):
            continue
        if not line[0].isspace() and not line.startswith("-"):  # a top-level key
            m = re.fullmatch(_TOP_KEY, line)
            if m is None:
                return None
            in_devices = m.group(1) == "devices"
            if m.group(1) == "kind":
                kind = _scalar(m.group(2))
            elif in_devices and m.group(2).strip():
                return None  # `devices: [...]`: flow style
            continue
        if not in_devices:
            continue
        stripped = line.lstrip()
        col = len(line) - len(stripped)
        if stripped.startswith("- "):  # a list item: its first key's column; the first item's is every device's
            rest = stripped[2:].lstrip()
            if item_col < 0:
                item_col = len(line) - len(rest)
            if len(line) - len(rest) == item_col:
                stripped, col = rest, item_col
        if col == item_col:
            m = re.fullmatch(_ITEM_NAME, stripped)
            if m is not None:
                names.append(_scalar(m.group(1)))
    return (kind, names) if kind and names else None


def _spec_names(path: str, refused: list[tuple[str, str]] | None = None) -> tuple[str, list[str]] | None:
    """(kind, device names) of one spec file, None when it cannot be read as one (the daemon skips it too). The
    file is read as every file the project reads (gpupin.core.files.read_bounded): a FIFO, a device (a link to
    /dev/zero) or a file over MAX_BYTES is refused at once, never waited on, and said in `refused`."""
    from gpupin.core import files

    try:
        data = files.read_bounded(path, MAX_BYTES)
    except files.FileRefused as err:
        if refused is not None and err.errno != errno.ENOENT:  # a file gone since the listing is no news
            refused.append((path, err.reason))
        return None
    if KIND.encode() not in data:  # most spec folders hold NVIDIA's specs only; skip the others unparsed
        return None
    spec: Any
    try:
        if path.endswith(".json"):
            import json

            spec = json.loads(data)  # nesting past the recursion limit: RecursionError, caught below
        else:
            fast = _block_names(data.decode("utf-8"))
            if fast is not None:
                return fast
            from gpupin.hostagent import yamlfile

            spec = yamlfile.parse(data.decode("utf-8"))  # PyYAML with limits: depth, alias expansion
    except Exception:  # a broken spec: the daemon's CDI cache refuses it as well
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        return None
    names = [str(d["name"]) for d in spec["devices"] if isinstance(d, dict) and isinstance(d.get("name"), (str, int))]
    return str(spec.get("kind") or ""), names


def read_spec_dirs(dirs: Sequence[str], refused: list[tuple[str, str]] | None = None) -> dict[str, list[str]]:
    """The device names of `nvidia.com/gpu` in the spec files of these folders: file -> names (subfolders are
    skipped, as the CDI library skips them; past MAX_FILES spec files in a folder, the rest are not read). The
    files refused (not regular, too large, unreadable) are added to `refused` as (path, why)."""
    out: dict[str, list[str]] = {}
    for folder in dirs:
        try:
            entries = sorted(e for e in os.listdir(folder) if e.endswith((".json", ".yaml")))
        except OSError:
            continue
        for entry in entries[:MAX_FILES]:
            path = os.path.join(folder, entry)
            if os.path.isdir(path):
                continue
            found = _spec_names(path, refused)
            if found is not None and found[0] == KIND:
                out[path] = found[1]
    return out


def discovered(info: Mapping[str, Any]) -> list[str] | None:
    """The nvidia.com/gpu device names among the devices the daemon discovered (`DiscoveredDevices`, Engine API
    1.50+, Engine 28.2+: a list of DeviceInfo {"Source": "cdi", "ID": "nvidia.com/gpu=0"}); None when /info has no
    such list (an older daemon, or CDI off: the list is left out when empty). Other sources and kinds name no GPU."""
    found = info.get("DiscoveredDevices")
    if not isinstance(found, list):
        return None
    return [
        dev
        for d in found
        if isinstance(d, dict) and str(d.get("Source") or "") == CDI
        for dev in [gpu_device(str(d.get("ID") or ""))]
        if dev is not None
    ]


def detect(info: Mapping[str, Any], local: bool) -> Detection:
    """What a daemon's `GET /info` (and, for a daemon on this host, its spec folders) says of nvidia.com/gpu."""
    names = discovered(info)
    if names is not None:
        if names:
            return Detection(True, f"the daemon discovered {len(names)} {KIND} CDI device(s)", names)
        return Detection(False, f"the daemon discovered no {KIND} CDI device", ())
    dirs = [str(d) for d in info.get("CDISpecDirs") or []]
    if not dirs:
        return Detection(False, "the daemon has CDI off (Engine API < 1.44, or no CDISpecDirs)")
    if not local:
        return Detection(
            False,
            f"the daemon has CDI on ({', '.join(dirs)}), but it is not on this host and does "
            "not list its devices (Engine API < 1.50): its specs cannot be read from here",
        )
    specs = read_spec_dirs(dirs)
    if not specs:
        return Detection(False, f"no {KIND} CDI spec in {', '.join(dirs)} (`nvidia-ctk cdi generate` writes one)", ())
    names = [n for found in specs.values() for n in found]
    return Detection(True, f"{', '.join(specs)} names {len(names)} {KIND} device(s)", names)

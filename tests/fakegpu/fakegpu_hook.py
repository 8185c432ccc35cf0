#!/usr/bin/env python3
"""Fake nvidia-container-runtime-hook for the simulated GPU host.

Docker's daemon offers `--gpus` when a binary of this name is on its PATH. For such a container it
appends NVIDIA_VISIBLE_DEVICES to the container's environment and runs `<hook> prestart` with the
OCI state on stdin. Like the real hook plus nvidia-container-cli, this resolves the requested
devices against the host's topology (FAKEGPU_TOPOLOGY), then puts the fake driver libraries and a
topology of just those cards into the container's root file system (/etc/fakegpu/topology.json,
where the fake libraries look when FAKEGPU_TOPOLOGY is unset).

Swarm tasks carry no device request: the node's default runtime (nvidia-container-runtime, faked by
fakegpu_runtime.py) adds this hook, and the devices come from Swarm's DOCKER_RESOURCE_<KIND> only when
the toolkit's config.toml names that variable in `swarm-resource` (a comma-separated list). When none
of the named variables is in the container's environment, NVIDIA_VISIBLE_DEVICES decides, as in
nvidia-container-toolkit's getDevicesFromEnvvar (cmd/nvidia-container-runtime-hook/container_config.go):
a task whose kind the runtime does not read gets the image's default, `all` in CUDA images.
The config file is FAKEGPU_TOOLKIT_CONFIG (a fake-only override; the real hook reads
/etc/nvidia-container-runtime/config.toml); a missing file means the toolkit's defaults (no
swarm-resource), a malformed one fails the container as the real hook does.

The Kubernetes device plugin's volume-mounts strategy: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices and
/dev/null mounted at /var/run/nvidia-container-devices/<device id> for each device; the devices are those ids, as
the toolkit reads them (getDevicesFromMounts) with `accept-nvidia-visible-devices-as-volume-mounts = true`, the
setting the device plugin's documentation asks for.

A slow start (the real hook takes 2 to 25 s without persistence mode, longer on a loaded host): the hook sleeps
`faults.hook_delay_s` of the host's topology, or FAKEGPU_HOOK_DELAY_S of the container's own environment (seconds,
a fake-only knob that slows one container), before it does anything else.

Deliberate differences from the real tool chain:
- the volume-mounts list is read whatever the toolkit config says of accept-nvidia-visible-devices-as-volume-mounts;
- a lost card does not make container creation fail (nvidia-container-cli would refuse while
  enumerating); it is passed through, as if it fell off the bus after the container started;
- faults.nvml_init does not affect the hook itself; it is passed into the container.

The topology, device resolution, bundle and root file system code here serves the fake CDI tools too
(fakegpu_cdi.py: `nvidia-ctk cdi generate` and `nvidia-cdi-hook`).
"""

from __future__ import annotations

import copy
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Optional

DEFAULT_TOPOLOGY = "/etc/fakegpu/topology.json"
DEFAULT_TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"  # the device plugin's volume-mounts strategy
CONTAINER_TOPOLOGY = "etc/fakegpu/topology.json"
LIBRARIES = ("libnvidia-ml.so.1", "libcuda.so.1")
CLI = "nvidia-container-cli"

Topology = dict[str, Any]


class HookError(Exception):
    """A failure reported like nvidia-container-cli reports it: one stderr line, exit 1."""


class DeviceError(HookError):
    def __init__(self, device: str) -> None:
        super().__init__(f"{CLI}: device error: {device}: unknown device")
        self.device = device


@dataclass
class Selection:
    """What a device string selects, as libnvidia-container's select_devices builds it."""

    gpus: list[str] = field(default_factory=list)  # whole cards, by UUID, in selection order
    migs: list[str] = field(default_factory=list)  # MIG devices, by UUID

    def add_gpu(self, uuid: str) -> None:
        if uuid not in self.gpus:
            self.gpus.append(uuid)

    def add_mig(self, uuid: str) -> None:
        if uuid not in self.migs:
            self.migs.append(uuid)


# ------------------------------------------------------------------ topology ----

_HEX = r"\s*\+?(?:0[xX](?=[0-9a-fA-F]))?([0-9a-fA-F]+)"  # one field, as sscanf's %x reads it
_BUS_ID_FORMS = (
    (re.compile(f"{_HEX}:{_HEX}:{_HEX}\\.{_HEX}"), (0, 1, 2, 3)),
    (re.compile(f"{_HEX}:{_HEX}:{_HEX}"), (0, 1, 2, None)),
    (re.compile(f"{_HEX}:{_HEX}\\.{_HEX}"), (None, 0, 1, 2)),
)


def parse_bus_id(text: str) -> Optional[tuple[int, int, int, int]]:
    """(domain, bus, device, function) of a bus id in a form NVML accepts, as the fake NVML parses it."""
    for pattern, places in _BUS_ID_FORMS:
        m = pattern.fullmatch(text)
        if m:
            fields = [int(v, 16) for v in m.groups()]
            domain, bus, device, function = (0 if i is None else fields[i] for i in places)
            if max(domain, bus, device, function) > 0xFFFFFFFF:
                return None
            return domain, bus, device, function
    return None


def load_topology(path: str, prog: str = CLI) -> Topology:
    try:
        with open(path, encoding="utf-8") as f:
            data: Any = json.load(f)
    except FileNotFoundError:
        raise HookError(f"{prog}: initialization error: nvml error: driver not loaded") from None
    except (OSError, ValueError) as e:
        raise HookError(f"{prog}: initialization error: fakegpu: {path}: {e}") from None
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, list) or not all(
        isinstance(g, dict)
        and isinstance(g.get("uuid"), str)
        and isinstance(g.get("bus_id"), str)
        and parse_bus_id(g["bus_id"])
        for g in gpus
    ):
        raise HookError(f"{prog}: initialization error: fakegpu: {path}: gpus must list cards with uuid and bus_id")
    topology: Topology = data
    return topology


def nvml_order(topology: Topology) -> list[dict[str, Any]]:
    """The cards in NVML's order: by PCI bus id, as integers."""
    return sorted(topology["gpus"], key=lambda g: parse_bus_id(g["bus_id"]) or (0, 0, 0, 0))


def minor_numbers(topology: Topology) -> dict[str, int]:
    """Each card's minor number (its /dev/nvidiaN): `minor_number`, else its position in the file."""
    return {g["uuid"]: int(g.get("minor_number", index)) for index, g in enumerate(topology["gpus"])}


def mig_devices(gpu: Mapping[str, Any]) -> list[dict[str, Any]]:
    mig = gpu.get("mig")
    if not isinstance(mig, dict) or mig.get("mode") != 1:
        return []
    devices = mig.get("devices")
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


# ---------------------------------------------------------------- resolution ----

_CLI_PCI = re.compile(r"([0-9a-fA-F]+):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})")
_CLI_INDEX = re.compile(r"\s*[+-]?[0-9]+")
_CLI_MIG_INDEX = re.compile(r"([0-9]+):([0-9]+)")


def _select_gpu(dev: str, gpus: Sequence[Mapping[str, Any]]) -> Optional[str]:
    # A full GPU UUID, compared without regard to case.
    if dev[:4].upper() == "GPU-" and len(dev) > 4:
        for g in gpus:
            if g["uuid"].lower() == dev.lower():
                return str(g["uuid"])
    # A bus id, sscanf("%x:%02x:%02x.0") style: a domain is required, trailing text is
    # ignored, the function is taken as 0.
    m = _CLI_PCI.match(dev)
    if m:
        want = (int(m[1], 16), int(m[2], 16), int(m[3], 16), 0)
        for g in gpus:
            if parse_bus_id(g["bus_id"]) == want:
                return str(g["uuid"])
    # An NVML index, strtoumax style.
    if _CLI_INDEX.fullmatch(dev):
        n = int(dev)
        n = n + 2**64 if n < 0 else n
        if n < len(gpus):
            return str(gpus[n]["uuid"])
    return None


def _select_mig(dev: str, gpus: Sequence[Mapping[str, Any]]) -> Optional[str]:
    if dev[:4].upper() == "MIG-" and len(dev) > 4:
        for g in gpus:
            for d in mig_devices(g):
                if str(d.get("uuid", "")).lower() == dev.lower():
                    return str(d["uuid"])
    # "<GPU index>:<MIG index>", sscanf("%lu:%lu") style.
    m = _CLI_MIG_INDEX.match(dev)
    if m and int(m[1]) < len(gpus):
        migs = mig_devices(gpus[int(m[1])])
        if int(m[2]) < len(migs):
            return str(migs[int(m[2])]["uuid"])
    return None


def resolve_devices(topology: Topology, visible: str) -> Selection:
    """Resolves a device list as libnvidia-container's select_devices does.

    Entries are comma-separated and not trimmed; empty entries are skipped; "all" (any case)
    selects every card and MIG device and ends the list; each other entry is tried as a full GPU
    UUID, a bus id with a domain, an NVML index, a full MIG UUID, then "<gpu>:<mig>" indices.
    Duplicates are dropped. Anything else raises DeviceError. "none" and "void" are the caller's.
    """
    gpus = nvml_order(topology)
    sel = Selection()
    for dev in visible.split(","):
        if dev == "":
            continue
        if dev.lower() == "all":
            for g in gpus:
                sel.add_gpu(g["uuid"])
            for g in gpus:
                for d in mig_devices(g):
                    sel.add_mig(d["uuid"])
            break
        uuid = _select_gpu(dev, gpus)
        if uuid is not None:
            sel.add_gpu(uuid)
            continue
        uuid = _select_mig(dev, gpus)
        if uuid is not None:
            sel.add_mig(uuid)
            continue
        raise DeviceError(dev)
    return sel


def apply_faults(topology: Topology, sel: Selection) -> Selection:
    """faults.hook_expose_all exposes everything; faults.hook_expose swaps a resolved UUID for another."""
    faults = topology.get("faults") or {}
    if faults.get("hook_expose_all"):
        return resolve_devices(topology, "all")
    swap = faults.get("hook_expose") or {}
    if not swap:
        return sel
    known = {g["uuid"] for g in topology["gpus"]} | {d["uuid"] for g in topology["gpus"] for d in mig_devices(g)}
    out = Selection()
    for uuid in sel.gpus + sel.migs:
        target = str(swap.get(uuid, uuid))
        if target not in known:
            raise HookError(f"{CLI}: device error: {target}: unknown device (faults.hook_expose)")
        if target.startswith("MIG-"):
            out.add_mig(target)
        else:
            out.add_gpu(target)
    return out


def container_topology(topology: Topology, sel: Selection) -> Topology:
    """The topology a container sees: the host's top-level keys, the hook_* faults removed, and
    only the exposed cards. A card exposed through MIG UUIDs keeps only those MIG devices. Each
    card keeps its host minor number, as its /dev/nvidiaN node does."""
    out = {k: copy.deepcopy(v) for k, v in topology.items() if k != "gpus"}
    faults = {k: v for k, v in (out.get("faults") or {}).items() if not k.startswith("hook_")}
    if faults:
        out["faults"] = faults
    else:
        out.pop("faults", None)
    cards = []
    minors = minor_numbers(topology)
    for gpu in topology["gpus"]:
        migs = [d for d in mig_devices(gpu) if d["uuid"] in sel.migs]
        if gpu["uuid"] not in sel.gpus and not migs:
            continue
        card = copy.deepcopy(gpu)
        card["minor_number"] = minors[gpu["uuid"]]
        if gpu["uuid"] not in sel.gpus:
            card["mig"]["devices"] = copy.deepcopy(migs)
        cards.append(card)
    out["gpus"] = cards
    return out


# ------------------------------------------------------------------- rootfs ----


def resolve_in_root(root: Path, rel: str) -> Path:
    """Where `rel` lies inside `root`, following symlinks as the container would see them,
    so that an image's links can never send a write outside its root file system."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    current, hops = root, 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise HookError(f"{CLI}: mount error: too many symbolic links under {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = root
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        current = candidate
    return current


def _install(data: bytes, root: Path, rel: str, mode: int) -> Path:
    directory = resolve_in_root(root, os.path.dirname(rel))
    directory.mkdir(parents=True, exist_ok=True)
    dest = directory / os.path.basename(rel)
    tmp = directory / f".{dest.name}.fakegpu-tmp"
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)  # replaces a symlink at dest rather than writing through it
    return dest


def library_source(env: Mapping[str, str]) -> Path:
    """The built fake libraries: $FAKEGPU_LIB_DIR, else build/fakegpu/lib beside this program's folder."""
    return Path(env.get("FAKEGPU_LIB_DIR") or Path(__file__).resolve().parent.parent / "lib")


def library_dir() -> str:
    """Debian's multiarch directory, which ld.so searches even without an ld.so.cache entry."""
    arch = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(platform.machine())
    return f"usr/lib/{arch}" if arch else "usr/lib"


def populate_rootfs(rootfs: Path, topology: Topology, lib_src: Path) -> list[str]:
    """Copies the fake libraries and writes the container's topology; returns the paths written."""
    written = []
    for name in LIBRARIES:
        src = lib_src / name
        try:
            data = src.read_bytes()
        except OSError as e:
            raise HookError(f"{CLI}: mount error: {src}: {e.strerror}") from None
        written.append(str(_install(data, rootfs, f"{library_dir()}/{name}", 0o755)))
    written.append(write_container_topology(rootfs, topology))
    # nvidia-container-cli refreshes the image's ld.so.cache too; an image without one
    # (or without ldconfig on the host) still finds the libraries through ld.so's defaults.
    if (rootfs / "etc/ld.so.cache").exists():
        run_ldconfig(rootfs)
    return written


def write_container_topology(rootfs: Path, topology: Topology) -> str:
    """Where the fake libraries inside the container read their cards: /etc/fakegpu/topology.json."""
    text = json.dumps(topology, indent=2) + "\n"
    return str(_install(text.encode(), rootfs, CONTAINER_TOPOLOGY, 0o644))


def run_ldconfig(rootfs: Path, folders: Sequence[str] = ()) -> bool:
    """The host's ldconfig on the container's root (links by soname, ld.so.cache); False when it cannot run.
    A hook's environment may have no PATH (runc passes only the hook's own env), hence /sbin/ldconfig."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if not os.access(ldconfig, os.X_OK):
        return False
    r = subprocess.run([ldconfig, "-r", str(rootfs), *folders], check=False, capture_output=True, timeout=60)
    return r.returncode == 0


# ------------------------------------------------------------------ prestart ----


def _last_env(env_list: Sequence[str], name: str) -> Optional[str]:
    value = None
    for item in env_list:
        key, sep, val = item.partition("=")
        if sep and key == name:
            value = val
    return value


def log_call(env: Mapping[str, str], record: dict[str, Any]) -> None:
    path = env.get("FAKEGPU_HOOK_LOG")
    if not path:
        return
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write with O_APPEND: lines from concurrent hooks stay whole
    finally:
        os.close(fd)


@dataclass
class Bundle:
    """What a hook reads of its container: the OCI state (stdin), the bundle's config.json, the rootfs."""

    container_id: Optional[str]
    config: dict[str, Any]
    rootfs: Path


def load_bundle(state_text: str, prog: str) -> Bundle:
    try:
        state = json.loads(state_text)
        bundle = Path(state.get("bundle") or state.get("bundlePath") or os.getcwd())
        with open(bundle / "config.json", encoding="utf-8") as f:
            config = json.load(f)
        root = Path((config.get("root") or {}).get("path") or "rootfs")
        container_id = state.get("id")
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise HookError(f"{prog}: cannot read the OCI state or bundle: {e}") from None
    return Bundle(container_id, config, root if root.is_absolute() else bundle / root)


def swarm_resource_envvars(env: Mapping[str, str]) -> list[str]:
    """The variables the toolkit's `swarm-resource` names (comma-separated, blanks trimmed, empty dropped)."""
    path = env.get("FAKEGPU_TOOLKIT_CONFIG") or DEFAULT_TOOLKIT_CONFIG
    try:
        with open(path, "rb") as f:
            import tomllib  # Python 3.11+ (Debian 12's python3 runs the hook); needed only when there is a file

            data = tomllib.load(f)
    except FileNotFoundError:
        return []  # the toolkit's defaults: swarm-resource unset
    except (OSError, ValueError, ImportError) as e:  # tomllib.TOMLDecodeError is a ValueError
        raise HookError(
            f"nvidia-container-runtime-hook: failed to load config: couldn't open required "
            f"configuration file: {path}: {e}"
        ) from None
    value = data.get("swarm-resource", "")
    if not isinstance(value, str):
        raise HookError(
            f"nvidia-container-runtime-hook: failed to load config: {path}: swarm-resource "
            f"must be a string, not {type(value).__name__}"
        )
    return [v.strip() for v in value.split(",") if v.strip()]


def requested_devices(env_list: Sequence[str], swarm_vars: Sequence[str]) -> tuple[str, Optional[str]]:
    """(the variable(s) read, the device list): the named Swarm variables when the container has any of them
    (their entries trimmed and concatenated), else NVIDIA_VISIBLE_DEVICES as it stands."""
    present = [v for v in swarm_vars if _last_env(env_list, v) is not None]
    if not present:
        return VISIBLE, _last_env(env_list, VISIBLE)
    entries = [e.strip() for v in present for e in (_last_env(env_list, v) or "").split(",")]
    return ",".join(present), ",".join(e for e in entries if e)


def volume_mount_devices(config: Mapping[str, Any]) -> list[str]:
    """The device ids of the volume-mounts strategy: /dev/null mounted right under DEVICE_LIST_DIR (not in its
    subfolders, such as imex/)."""
    out = []
    for m in config.get("mounts") or []:
        dest = str(m.get("destination") or "").rstrip("/")
        folder, _, name = dest.rpartition("/")
        if folder == DEVICE_LIST_DIR and name and m.get("source") == "/dev/null":
            out.append(name)
    return out


def hook_delay(env_list: Sequence[str], env: Mapping[str, str]) -> None:
    """Sleep as a slow NVIDIA hook takes: the container's FAKEGPU_HOOK_DELAY_S, else the topology's
    faults.hook_delay_s (read only when set: a missing topology is the device lookup's error, not this one's)."""
    value = _last_env(env_list, "FAKEGPU_HOOK_DELAY_S")
    if value is None:
        try:
            faults = load_topology(env.get("FAKEGPU_TOPOLOGY") or DEFAULT_TOPOLOGY).get("faults") or {}
        except HookError:
            return
        value = faults.get("hook_delay_s")
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        raise HookError(f"nvidia-container-runtime-hook: FAKEGPU_HOOK_DELAY_S={value!r}: not a number") from None
    if seconds > 0:
        time.sleep(seconds)


def prestart(state_text: str, env: Mapping[str, str], stderr: IO[str]) -> int:
    """Runs the prestart hook; returns the exit status. `env` is the hook's own environment."""
    record: dict[str, Any] = {"time": time.time(), "command": "prestart"}
    try:
        bundle = load_bundle(state_text, "nvidia-container-runtime-hook")
        record["container_id"] = bundle.container_id
        env_list = (bundle.config.get("process") or {}).get("env") or []
        hook_delay(env_list, env)
        swarm_vars = swarm_resource_envvars(env)
        source, visible = requested_devices(env_list, swarm_vars)
        if visible == DEVICE_LIST_DIR:
            source, visible = DEVICE_LIST_DIR, ",".join(volume_mount_devices(bundle.config)) or "void"
        record["swarm_resource"], record["source"], record["asked"] = swarm_vars, source, visible
        if visible is None or visible in ("", "void"):
            record["status"] = "void"
            return 0
        path = env.get("FAKEGPU_TOPOLOGY") or DEFAULT_TOPOLOGY
        record["topology"] = path
        topology = load_topology(path)
        sel = Selection() if visible == "none" else resolve_devices(topology, visible)
        sel = apply_faults(topology, sel)
        record["exposed_gpus"], record["exposed_migs"] = sel.gpus, sel.migs
        record["exposed"] = [g["uuid"] for g in nvml_order(topology) if g["uuid"] in sel.gpus] + sel.migs
        record["rootfs"] = str(bundle.rootfs)
        record["written"] = populate_rootfs(bundle.rootfs, container_topology(topology, sel), library_source(env))
        record["status"] = "ok"
        return 0
    except (HookError, OSError) as e:
        message = str(e) if isinstance(e, HookError) else f"{CLI}: mount error: {e}"
        record["status"], record["error"] = "error", message
        print(message, file=stderr)
        return 1
    finally:
        log_call(env, record)


def main(argv: Sequence[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "prestart":
        return prestart(sys.stdin.read(), os.environ, sys.stderr)
    if command in ("poststart", "poststop"):
        return 0
    print(f"usage: {os.path.basename(argv[0])} prestart|poststart|poststop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

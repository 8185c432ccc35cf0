"""The values of docker run's options as `hostagent run` takes them: each conversion from the command line's text to
the Engine API's value (hostagent.run.options attaches each to its option, as docker/cli's opts.go does).

A conversion raises ValueError (or UsageError) on text docker run would refuse; the option's row turns that into
one line naming the option, before any I/O but the file system's. The ones that take a host path refuse one that
reaches an NVIDIA device node, normalised and, on a daemon of this host, through its symlinks and device numbers
(gpupin.hostagent.ledger.nodes): it would give the container GPUs outside its pin.
"""

from __future__ import annotations

import os
import re

from gpupin.core.errors import GpupinError, UsageError
from gpupin.core.shown import shown
from gpupin.hostagent.ledger import nodes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?[bkmgBKMG]?")


def entrypoint(value: str) -> list[str]:
    # docker run: --entrypoint names one executable (never split on spaces); an empty one resets the image's.
    return [value]


def size(value: str) -> str:
    if not _SIZE.fullmatch(value):
        raise ValueError("not a size (bytes, or a number with b, k, m or g)")
    return value


def memory_swap(value: str) -> str | int:
    return -1 if value == "-1" else size(value)


def cpus(value: str) -> int:
    cpus = float(value)
    if not 0 < cpus < 1e6 or cpus != cpus:
        raise ValueError("give a number of CPUs > 0, e.g. 1.5")
    return round(cpus * 1e9)  # the Engine's NanoCpus


def seconds(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise ValueError("give a whole number of seconds >= 0")
    return int(value)


def _local_daemon() -> bool:
    """Whether the daemon's host paths are this machine's (a unix socket): then they are resolved here."""
    from gpupin.hostagent.engine.address import endpoint

    try:
        return endpoint().unix_path is not None
    except GpupinError:
        return False  # an address that cannot be read: the run is refused for it later, by the connect


def _not_a_gpu_device(value: str, host_path: str, option: str, deep: bool) -> None:
    """Refuse a host path that reaches an NVIDIA device node (a `--device` folder is walked, as docker walks it)."""
    local = _local_daemon()
    if nodes.reaches(host_path, local=local, deep=deep):
        path = nodes.normalised(host_path)
        real = os.path.realpath(path) if local else path
        what = shown(path) if real == path else f"{shown(path)} (a link to {shown(real)})"
        raise UsageError(f"{option} {shown(value)}: the host path {what} reaches an NVIDIA device node, which "
                         "would give the container GPUs outside its pin",
                         "ask for the cards with --uuid/--gpu/--count; hostagent exposes exactly those")


def device(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("give HOST-PATH[:CONTAINER-PATH[:PERMISSIONS]], an absolute path")
    _not_a_gpu_device(value, value.split(":", 1)[0], "--device", deep=True)
    return value


def _port_range(text: str, what: str, lowest: int) -> None:
    lo, dash, hi = text.partition("-")
    if not all(p.isascii() and p.isdigit() for p in ((lo, hi) if dash else (lo,))):
        raise ValueError(f"invalid {what} {text!r}")
    first, last = int(lo), int(hi) if dash else int(lo)
    if not lowest <= first <= last <= 65535:
        raise ValueError(f"invalid {what} {text!r}: ports are {lowest} to 65535, a range low-high")


def _check_port(spec: str) -> None:
    """What the SDK's split_port lets through and docker run refuses (go-connections' ParsePortSpec): ports
    beyond 65535 and reversed ranges (the SDK then publishes nothing, silently). The shape, the protocol and
    ranges of different lengths the SDK checks itself."""
    rest = spec.partition("/")[0]
    if rest.startswith("["):  # [IPv6]:HOST:CONTAINER
        rest = rest.partition("]:")[2]
    parts = rest.split(":")
    _port_range(parts[-1], "container port", 1)
    if len(parts) >= 2 and parts[-2]:
        _port_range(parts[-2], "host port", 0)


def publish(values: Sequence[str]) -> dict[str, Any]:
    from docker.utils.ports import build_port_bindings, split_port

    for v in values:
        try:
            split_port(v)  # raises ValueError on bad text
            _check_port(v)
        except ValueError as err:  # named by the one value, not the option's whole list
            raise UsageError(f"--publish {v!r}: {err}", "see `hostagent run --help` (--publish)") from None
    return dict(build_port_bindings(list(values)))


def integer(low: int, high: int, what: str) -> Callable[[str], int]:
    def convert(value: str) -> int:
        digits = value[1:] if value[:1] == "-" else value
        if not digits.isascii() or not digits.isdigit() or not low <= int(value) <= high:
            raise ValueError(f"give {what}, a whole number from {low} to {high}")
        return int(value)
    return convert


def key_values(what: str) -> Callable[[Sequence[str]], dict[str, str]]:
    """KEY=VALUE options given again and again (--sysctl, --storage-opt, --log-opt) as the API's mapping."""
    def convert(values: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for v in values:
            key, eq, val = v.partition("=")
            if not key or not eq:
                raise ValueError(f"{v!r} is not {what}=VALUE")
            out[key] = val
        return out
    return convert


def ulimit(value: str) -> Any:
    from docker.types import Ulimit

    name, eq, limits = value.partition("=")
    soft, _, hard = limits.partition(":")
    if not name or not eq or not soft.lstrip("-").isdigit() or (hard and not hard.lstrip("-").isdigit()):
        raise ValueError("give NAME=SOFT[:HARD], e.g. nofile=1024:2048 or memlock=-1")
    return Ulimit(name=name, soft=int(soft), hard=int(hard or soft))


RESTART_POLICIES = ("no", "always", "unless-stopped", "on-failure")


def restart(value: str) -> dict[str, Any]:
    name, _, count = value.partition(":")
    if name not in RESTART_POLICIES or (count and (name != "on-failure" or not count.isdigit())):
        raise ValueError("give no, always, unless-stopped or on-failure[:MAX-RETRIES]")
    return {"Name": "" if name == "no" else name, "MaximumRetryCount": int(count or 0)}


def add_host(value: str) -> str:
    host, sep, ip = value.partition(":")
    if not host or not sep or not ip:
        raise ValueError("give HOST:IP")
    return value


_MOUNT_KEYS = {"type", "source", "src", "target", "destination", "dst", "readonly", "ro", "bind-propagation",
               "volume-nocopy", "tmpfs-size", "tmpfs-mode", "consistency"}


def mount(value: str) -> Any:
    from docker.types import Mount

    fields: dict[str, str] = {}
    for part in value.split(","):
        key, eq, val = part.partition("=")
        key = key.strip().lower()
        if key not in _MOUNT_KEYS:
            raise ValueError(f"unknown key {key!r} (hostagent takes {', '.join(sorted(_MOUNT_KEYS))})")
        fields[key] = val if eq else "true"
    kind = fields.get("type", "volume")
    target = fields.get("target") or fields.get("destination") or fields.get("dst")
    source = fields.get("source") or fields.get("src")
    if not target:
        raise ValueError("a mount needs target=PATH")
    if source and kind == "bind":
        _not_a_gpu_device(value, source, "--mount", deep=False)
    readonly = (fields.get("readonly") or fields.get("ro") or "false").lower() in ("true", "1")
    tmpfs_size = fields.get("tmpfs-size")
    return Mount(target, source, type=kind, read_only=readonly, propagation=fields.get("bind-propagation"),
                 no_copy=fields.get("volume-nocopy", "false").lower() in ("true", "1"),
                 tmpfs_size=size(tmpfs_size) if tmpfs_size else None,
                 tmpfs_mode=int(fields["tmpfs-mode"], 8) if "tmpfs-mode" in fields else None)


def tmpfs(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        path, _, opts = v.partition(":")
        if not path.startswith("/"):
            raise ValueError("give an absolute PATH[:OPTIONS]")
        out[path] = opts
    return out


def volume(value: str) -> str:
    source = value.split(":", 1)[0]
    if source.startswith("/"):  # else a named volume
        _not_a_gpu_device(value, source, "-v", deep=False)
    return value


GPU_CAPABILITIES = ("compute", "utility", "graphics", "video", "display", "compat32")


def gpu_capabilities(value: str | None) -> list[str]:
    """--gpu-capabilities as the list the device request carries (NVIDIA_DRIVER_CAPABILITIES in the container)."""
    if value is None:
        return []
    caps = [c.strip() for c in value.split(",") if c.strip()]
    if caps == ["all"]:
        return list(GPU_CAPABILITIES)
    bad = [c for c in caps if c not in GPU_CAPABILITIES]
    if bad or not caps:
        raise UsageError(f"--gpu-capabilities {value!r}: unknown capability {', '.join(bad) or '(none given)'}",
                         f"use all, or a comma list of {', '.join(GPU_CAPABILITIES)}")
    return list(dict.fromkeys(caps))

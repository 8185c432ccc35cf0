"""The values of docker run's options as `hostagent run` takes them: each conversion from the command line's text to
the Engine API's value (hostagent.run.options attaches each to its option, as docker/cli's opts.go does). A
conversion raises ValueError on text docker run would refuse, and a host path that reaches an NVIDIA device node
is refused: it would give the container GPUs outside its pin. Sizes read as go-units' RAMInBytes: docs/run.md,
"Parsed as docker parses them".
"""

from __future__ import annotations

import json
import os
import re

from gpupin.core.errors import GpupinError, UsageError, shown
from gpupin.hostagent.run.reads import CallersOwn, in_the_agent, read_file, workdir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from gpupin.core import JSONObject


_SIZE = re.compile(r"(\d+(?:\.\d+)*) ?([kmgtp])?i?b?", re.ASCII | re.IGNORECASE)
_BINARY = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_MAX = 2**63  # an int64: past it the CLI's conversion overflows; refused here


def ram_in_bytes(text: str) -> int:
    """The bytes of a size as `docker run --memory` reads it; ValueError on text the docker CLI refuses."""
    m = _SIZE.fullmatch(text)
    try:
        number = float(m.group(1)) if m else None  # "1.5.5" passes the pattern, not the float (as in Go)
    except ValueError:
        number = None
    if m is None or number is None:
        raise ValueError("not a size: give a number with an optional unit (b, k, m, g, t, p; 16g = 16GB = 16GiB)")
    unit = (m.group(2) or "").lower()
    size = int(number * _BINARY.get(unit, 1))
    if size >= _MAX:
        raise ValueError("more bytes than docker can take (an int64)")
    return size


def entrypoint(value: str) -> list[str]:
    # docker run: --entrypoint names one executable (never split on spaces); an empty one resets the image's.
    return [value]


def size(value: str) -> int:
    return ram_in_bytes(value)


def memory_swap(value: str) -> int:
    return -1 if value == "-1" else ram_in_bytes(value)


def cpus(value: str) -> int:
    """The Engine's NanoCpus, exactly as the docker CLI computes them (a rational, never a float: 0.1 CPU is 10^8);
    0 is no limit. What the daemon refuses (more CPUs than the host has, a negative count) it refuses."""
    try:
        if value != value.strip():
            raise ValueError(value)
        from fractions import Fraction  # with decimal, ~3 ms of every run's start-up otherwise

        nano = Fraction(value) * 10**9
    except (ValueError, ZeroDivisionError):
        raise ValueError("give a number of CPUs, e.g. 1.5") from None
    if nano.denominator != 1:
        raise ValueError("too precise: give CPUs to 9 decimal places at most")
    return int(nano)


def wait_seconds(text: str) -> float:
    """--wait's value: a number of seconds (300), or a duration as --for takes it (90s, 5m, 2h); empty, `inf` or
    `forever`: no end. ValueError otherwise: a negative or unreadable wait is refused, never taken as the image."""
    import math

    if text in ("", "inf", "forever"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        from gpupin.hostagent.ledger.booking import parse_duration  # only for a value that is not a number

        return parse_duration(text)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{text!r} is not a wait: give seconds (300) or a duration (90s, 5m, 2h), 0 or more")
    return value


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
    from gpupin.hostagent.ledger import nodes  # only for a bind or a device: a plain run's parse does without

    local = _local_daemon()
    if deep and local and in_the_agent() and os.path.isdir(host_path):
        # A folder's walk is the caller's own: with its rights, and on its own time (it may be /usr).
        raise CallersOwn(f"{option} {shown(value)}: a --device folder is walked with the caller's own rights")
    try:
        reached = nodes.reaches_gpu_node(host_path, local=local, deep=deep)
    except nodes.TreeTooLarge:
        raise UsageError(
            f"{option} {shown(value)}: the folder {shown(host_path)} holds more than {nodes.WALK_LIMIT} entries, too "
            "many to tell whether it reaches an NVIDIA device node",
            "give the device nodes the container needs one by one",
        ) from None
    except OSError as err:  # unreadable here, yet the daemon (root) would bind it: unknown is refused
        raise UsageError(
            f"{option} {shown(value)}: the host path {shown(err.filename or host_path)} cannot be read by this user "
            f"({err.strerror or err}), so whether it reaches an NVIDIA device node cannot be told",
            "bind a path this user may read, or run as a user who may read it",
        ) from None
    if reached:
        path = nodes.normalised(host_path)
        real = os.path.realpath(path) if local else path
        what = shown(path) if real == path else f"{shown(path)} (a link to {shown(real)})"
        raise UsageError(
            f"{option} {shown(value)}: the host path {what} reaches an NVIDIA device node, which "
            "would give the container GPUs outside its pin",
            "ask for the cards with --uuid/--gpu/--count; hostagent exposes exactly those",
        )


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


def publish(values: Sequence[str]) -> JSONObject:
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


def ulimits(values: Sequence[str]) -> list[Any]:
    """--ulimit as the docker CLI sends them: one per name (the last given), by name."""
    limits = {u["Name"]: u for u in map(ulimit, values)}
    return [limits[name] for name in sorted(limits)]


def ulimit(value: str) -> Any:
    from docker.types import Ulimit

    name, eq, limits = value.partition("=")
    soft, _, hard = limits.partition(":")
    if not name or not eq or not soft.lstrip("-").isdigit() or (hard and not hard.lstrip("-").isdigit()):
        raise ValueError("give NAME=SOFT[:HARD], e.g. nofile=1024:2048 or memlock=-1")
    return Ulimit(name=name, soft=int(soft), hard=int(hard or soft))


RESTART_POLICIES = ("no", "always", "unless-stopped", "on-failure")


def restart(value: str) -> JSONObject:
    name, _, count = value.partition(":")
    if name not in RESTART_POLICIES or (count and (name != "on-failure" or not count.isdigit())):
        raise ValueError("give no, always, unless-stopped or on-failure[:MAX-RETRIES]")
    return {"Name": name, "MaximumRetryCount": int(count or 0)}


def add_host(value: str) -> str:
    host, sep, ip = value.partition(":")
    if not host or not sep or not ip:
        raise ValueError("give HOST:IP")
    return value


_MOUNT_KEYS = {
    "type",
    "source",
    "src",
    "target",
    "destination",
    "dst",
    "readonly",
    "ro",
    "bind-propagation",
    "volume-nocopy",
    "tmpfs-size",
    "tmpfs-mode",
    "consistency",
}


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
    if (source or "").startswith("."):  # made absolute, as -v's (docker CLI 28; 23 to 27: `.` and `./` only)
        source = absolute(str(source))
    if not target:
        raise ValueError("a mount needs target=PATH")
    if source and kind == "bind":
        _not_a_gpu_device(value, source, "--mount", deep=False)
    readonly = (fields.get("readonly") or fields.get("ro") or "false").lower() in ("true", "1")
    tmpfs_size = fields.get("tmpfs-size")
    return Mount(
        target,
        source,
        type=kind,
        read_only=readonly,
        propagation=fields.get("bind-propagation"),
        no_copy=fields.get("volume-nocopy", "false").lower() in ("true", "1"),
        tmpfs_size=size(tmpfs_size) if tmpfs_size else None,
        tmpfs_mode=int(fields["tmpfs-mode"], 8) if "tmpfs-mode" in fields else None,
    )


def tmpfs(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        path, _, opts = v.partition(":")
        if not path.startswith("/"):
            raise ValueError("give an absolute PATH[:OPTIONS]")
        out[path] = opts
    return out


def absolute(path: str) -> str:
    """Go's filepath.Abs, which the docker CLI makes relative bind sources absolute with."""
    return os.path.normpath(os.path.join(workdir(), path))


def volume(value: str) -> str:
    # The current docker CLI (28, measured on 28.5): a source that begins with `.` (`.`, `./x`, `../x`, `.x`) is made
    # absolute; any other without a `/` is a volume name. CLI 23 to 27 made only `.` and `./x` absolute (a `../x` was
    # a volume name, which the daemon refuses): hostagent follows the current CLI.
    source, sep, rest = value.partition(":")
    if sep and source.startswith("."):
        source = absolute(source)
        value = f"{source}:{rest}"
    if source.startswith("/"):  # else a named volume
        _not_a_gpu_device(value, source, "-v", deep=False)
    return value


def anonymous(spec: str) -> bool:
    """Whether a -v spec names no source (`-v /scratch`): docker makes it an anonymous volume of the container
    (Config.Volumes), not a bind."""
    return ":" not in spec


SECCOMP_LIMIT = 1 << 20  # bytes: Docker's default profile is 20 KiB


def _compact_json(path: str) -> str:
    """A seccomp profile's text without the whitespace between tokens, as Go's json.Compact makes it (the docker CLI
    sends the profile itself, not its path)."""
    try:
        text = read_file(path, SECCOMP_LIMIT).decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or err
        raise ValueError(f"opening seccomp profile ({shown(path)}) failed: {why}") from None
    try:
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except ValueError:
        raise ValueError(f"the seccomp profile {shown(path)} is not JSON") from None
    out: list[str] = []
    in_string = escaped = False
    for c in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
        elif c in " \t\r\n":
            continue
        else:
            in_string = c == '"'
        out.append(c)
    return "".join(out)


SYSTEMPATHS_UNCONFINED = "systempaths=unconfined"  # the CLI's own: no masked or read-only /proc, /sys paths


def security_opts(values: Sequence[str]) -> list[str]:
    """--security-opt as the docker CLI sends them: KEY=VALUE (or KEY:VALUE), a seccomp profile's path replaced by
    the profile (seccomp=unconfined and =builtin are the daemon's). systempaths=unconfined stays here: the payload
    turns it into empty MaskedPaths and ReadonlyPaths."""
    out = []
    for opt in values:
        key, eq, value = opt.partition("=")
        if not eq and opt != "no-new-privileges":
            key, colon, value = opt.partition(":")
            if not colon:
                raise ValueError(f"{opt!r} is not KEY=VALUE (e.g. seccomp=unconfined, no-new-privileges)")
        if key == "seccomp" and value not in ("unconfined", "builtin"):
            opt = "seccomp=" + _compact_json(value)
        out.append(opt)
    return out


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
        raise UsageError(
            f"--gpu-capabilities {value!r}: unknown capability {', '.join(bad) or '(none given)'}",
            f"use all, or a comma list of {', '.join(GPU_CAPABILITIES)}",
        )
    return list(dict.fromkeys(caps))

"""The `docker run` options that `hostagent run` takes: one table, read by the parser, the argument splitter, the
create payload and the dry-run line alike, so that an option means the same thing everywhere.

Spellings and meanings are docker run's. Each row says where its value goes in the Engine API: a keyword of the
docker SDK's ContainerConfig or HostConfig (or of the create call itself), through a conversion where the CLI's text
is not the API's value. A conversion refuses bad text with one line naming the option, before any I/O. Options with
a meaning of their own in hostagent (`-e`, `--env-file`, `--label`, which meet the pin; `--name`, `--pull`, `-d`,
`-i`, `-t`, `--sig-proxy`) are rows too, with no payload keyword: the request reads them itself.

Options that would hand the container other GPUs than the pinned ones are refused by name: `--gpus` (the pin is
hostagent's), `--privileged` (every device), `--device-cgroup-rule`; so is a `--device`, `-v` or `--mount` whose
host path reaches an NVIDIA device node, normalised and, on a daemon of this host, through its symlinks and device
numbers (gpupin.hostagent.ledger.nodes). The rest of
docker run's options are refused by name too (NOT_TAKEN): a user learns that hostagent does not pass that docker
option, not that it looks like one of hostagent's own.
"""

from __future__ import annotations

import os
import re

from gpupin.core.errors import UsageError
from gpupin.core.shown import shown
from gpupin.hostagent.ledger import nodes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

FLAG = "flag"  # no value (store_true)
VALUE = "value"  # one value, the last one given wins
APPEND = "append"  # may be given again; values in order

CONTAINER = "container"  # docker.types.ContainerConfig keyword
HOST = "host"  # docker.types.HostConfig keyword
CREATE = "create"  # APIClient.create_container_from_config keyword (platform)

_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?[bkmgBKMG]?")


class Option:
    """One docker run option: its spellings, help, how many values, and where its value goes."""

    __slots__ = ("choices", "convert", "dest", "each", "flags", "help", "keyword", "kind", "metavar", "where")

    def __init__(self, flags: Sequence[str], help: str, kind: str = VALUE, metavar: str | None = None,
                 where: str | None = None, keyword: str | None = None, convert: Callable[[Any], Any] | None = None,
                 choices: Sequence[str] | None = None, dest: str | None = None,
                 each: Callable[[str], Any] | None = None) -> None:
        self.flags = tuple(flags)
        self.help = help
        self.kind = kind
        self.metavar = metavar
        self.where = where
        self.keyword = keyword
        self.convert = convert  # the whole value (a list for APPEND) -> the API's value
        self.each = each  # or: each value of an APPEND option -> one item of the API's list
        self.choices = tuple(choices) if choices else None
        self.dest = dest or self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def name(self) -> str:
        return self.flags[-1]

    def sdk_value(self, value: Any) -> Any:
        """The Engine API value of the option's value(s); UsageError naming the option on bad text."""
        if self.choices and value is not None and value not in self.choices:
            raise UsageError(f"{self.name} {value}: not one of {', '.join(self.choices)}",
                             f"use {self.name} {' or '.join(self.choices)}")
        if self.each is not None:
            return [self._converted(self.each, v) for v in value]
        return value if self.convert is None else self._converted(self.convert, value)

    def _converted(self, convert: Callable[[Any], Any], value: Any) -> Any:
        try:
            return convert(value)
        except UsageError:
            raise
        except (ValueError, TypeError, KeyError, IndexError) as err:
            shown = value if isinstance(value, str) else " ".join(map(str, value))
            raise UsageError(f"{self.name} {shown!r}: {err}", f"see `hostagent run --help` ({self.name})") from None

    def docker_args(self, value: Any) -> list[str]:
        """This option as `docker run` arguments (nothing when unset)."""
        if self.kind == FLAG:
            return [self.flags[0]] if value else []
        values = value if self.kind == APPEND else ([] if value is None else [value])
        return [a for v in values for a in (self.flags[0], str(v))]


def _entrypoint(value: str) -> list[str]:
    # docker run: --entrypoint names one executable (never split on spaces); an empty one resets the image's.
    return [value]


def _size(value: str) -> str:
    if not _SIZE.fullmatch(value):
        raise ValueError("not a size (bytes, or a number with b, k, m or g)")
    return value


def _memory_swap(value: str) -> str | int:
    return -1 if value == "-1" else _size(value)


def _cpus(value: str) -> int:
    cpus = float(value)
    if not 0 < cpus < 1e6 or cpus != cpus:
        raise ValueError("give a number of CPUs > 0, e.g. 1.5")
    return round(cpus * 1e9)  # the Engine's NanoCpus


def _seconds(value: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise ValueError("give a whole number of seconds >= 0")
    return int(value)


def _local_daemon() -> bool:
    """Whether the daemon's host paths are this machine's (a unix socket): then they are resolved here."""
    from gpupin.core.errors import GpupinError
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


def _device(value: str) -> str:
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


def _publish(values: Sequence[str]) -> dict[str, Any]:
    from docker.utils.ports import build_port_bindings, split_port

    for v in values:
        try:
            split_port(v)  # raises ValueError on bad text
            _check_port(v)
        except ValueError as err:  # named by the one value, not the option's whole list
            raise UsageError(f"--publish {v!r}: {err}", "see `hostagent run --help` (--publish)") from None
    return dict(build_port_bindings(list(values)))


def _integer(low: int, high: int, what: str) -> Callable[[str], int]:
    def convert(value: str) -> int:
        digits = value[1:] if value[:1] == "-" else value
        if not digits.isascii() or not digits.isdigit() or not low <= int(value) <= high:
            raise ValueError(f"give {what}, a whole number from {low} to {high}")
        return int(value)
    return convert


def _key_values(what: str) -> Callable[[Sequence[str]], dict[str, str]]:
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


def _exposed(bindings: dict[str, Any]) -> list[Any]:
    """ContainerConfig's `ports` (ExposedPorts) for the published ports, as docker run sets them."""
    out: list[Any] = []
    for key in bindings:
        port, _, proto = key.partition("/")
        out.append((int(port), proto) if proto else int(port))
    return out


def _ulimit(value: str) -> Any:
    from docker.types import Ulimit

    name, eq, limits = value.partition("=")
    soft, _, hard = limits.partition(":")
    if not name or not eq or not soft.lstrip("-").isdigit() or (hard and not hard.lstrip("-").isdigit()):
        raise ValueError("give NAME=SOFT[:HARD], e.g. nofile=1024:2048 or memlock=-1")
    return Ulimit(name=name, soft=int(soft), hard=int(hard or soft))


_RESTART = ("no", "always", "unless-stopped", "on-failure")


def _restart(value: str) -> dict[str, Any]:
    name, _, count = value.partition(":")
    if name not in _RESTART or (count and (name != "on-failure" or not count.isdigit())):
        raise ValueError("give no, always, unless-stopped or on-failure[:MAX-RETRIES]")
    return {"Name": "" if name == "no" else name, "MaximumRetryCount": int(count or 0)}


def _add_host(value: str) -> str:
    host, sep, ip = value.partition(":")
    if not host or not sep or not ip:
        raise ValueError("give HOST:IP")
    return value


_MOUNT_KEYS = {"type", "source", "src", "target", "destination", "dst", "readonly", "ro", "bind-propagation",
               "volume-nocopy", "tmpfs-size", "tmpfs-mode", "consistency"}


def _mount(value: str) -> Any:
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
    size = fields.get("tmpfs-size")
    return Mount(target, source, type=kind, read_only=readonly, propagation=fields.get("bind-propagation"),
                 no_copy=fields.get("volume-nocopy", "false").lower() in ("true", "1"),
                 tmpfs_size=_size(size) if size else None,
                 tmpfs_mode=int(fields["tmpfs-mode"], 8) if "tmpfs-mode" in fields else None)


def _tmpfs(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        path, _, opts = v.partition(":")
        if not path.startswith("/"):
            raise ValueError("give an absolute PATH[:OPTIONS]")
        out[path] = opts
    return out


def _volume(value: str) -> str:
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


OPTIONS: Sequence[Option] = (
    Option(("--name",), "assign a name to the container"),
    Option(("-d", "--detach"), "run in the background and print the container ID", FLAG),
    Option(("-i", "--interactive"), "keep STDIN open and forward this terminal's (or pipe's) input", FLAG,
           where=CONTAINER, keyword="stdin_open"),
    Option(("-t", "--tty"), "allocate a pseudo-TTY (with -i: an interactive shell)", FLAG, where=CONTAINER,
           keyword="tty"),
    Option(("--sig-proxy",), "forward SIGINT/SIGTERM to the container's process (default true; false: stop it)",
           choices=("true", "false"), metavar="BOOL"),
    Option(("--rm",), "remove the container when it exits", FLAG, where=HOST, keyword="auto_remove"),
    Option(("-e", "--env"), "set an environment variable (KEY=VALUE, or KEY to pass this shell's value)", APPEND,
           "KEY[=VALUE]"),
    Option(("--env-file",), "read environment variables from a file (KEY=VALUE lines)", APPEND, "FILE",
           dest="env_files"),
    Option(("-l", "--label"), "set a label on the container", APPEND, "KEY=VALUE", dest="labels"),
    Option(("-v", "--volume"), "bind mount a volume", APPEND, "SRC:DST[:OPTS]", where=HOST, keyword="binds",
           each=_volume, dest="volumes"),
    Option(("--mount",), "attach a mount (type=bind|volume|tmpfs,source=...,target=...[,readonly])", APPEND,
           "SPEC", where=HOST, keyword="mounts", each=_mount, dest="mounts"),
    Option(("--tmpfs",), "mount a tmpfs (PATH[:OPTIONS])", APPEND, "PATH", where=HOST, keyword="tmpfs",
           convert=_tmpfs),
    Option(("--read-only",), "mount the container's root file system read-only", FLAG, where=HOST,
           keyword="read_only"),
    Option(("-w", "--workdir"), "working directory inside the container", where=CONTAINER, keyword="working_dir",
           metavar="DIR"),
    Option(("-u", "--user"), "username or UID (format: <name|uid>[:<group|gid>])", where=CONTAINER,
           keyword="user"),
    Option(("--group-add",), "add an additional group to join", APPEND, "GROUP", where=HOST, keyword="group_add"),
    Option(("--hostname",), "the container's host name", where=CONTAINER, keyword="hostname"),
    Option(("--add-host",), "add a line to /etc/hosts (HOST:IP)", APPEND, "HOST:IP", where=HOST,
           keyword="extra_hosts", each=_add_host, dest="add_hosts"),
    Option(("--entrypoint",), "override the image's ENTRYPOINT (the pin is proven only by gpupin-entrypoint)",
           where=CONTAINER, keyword="entrypoint", convert=_entrypoint, metavar="CMD"),
    Option(("--init",), "run an init inside the container that forwards signals and reaps processes", FLAG,
           where=HOST, keyword="init"),
    Option(("-p", "--publish"), "publish a container's port to the host ([IP:][HOST-PORT:]PORT[/PROTO])", APPEND,
           "PORT", where=HOST, keyword="port_bindings", convert=_publish, dest="publish"),
    Option(("-P", "--publish-all"), "publish every port the image exposes, each to a random host port", FLAG,
           where=HOST, keyword="publish_all_ports"),
    Option(("--network",), "connect the container to a network", where=HOST, keyword="network_mode",
           metavar="NETWORK"),
    Option(("--ipc",), "IPC mode to use (e.g. host)", where=HOST, keyword="ipc_mode", metavar="MODE"),
    Option(("--pid",), "PID namespace to use (e.g. host)", where=HOST, keyword="pid_mode", metavar="MODE"),
    Option(("--uts",), "UTS namespace to use: host", where=HOST, keyword="uts_mode", choices=("host",),
           metavar="MODE"),
    Option(("--userns",), "user namespace to use: host (when the daemon remaps users)", where=HOST,
           keyword="userns_mode", choices=("host",), metavar="MODE"),
    Option(("--cgroupns",), "cgroup namespace to use: host or private", where=HOST, keyword="cgroupns",
           choices=("host", "private"), metavar="MODE"),
    Option(("--cgroup-parent",), "the cgroup the container's cgroup is made under", where=HOST,
           keyword="cgroup_parent", metavar="CGROUP"),
    Option(("--dns",), "a DNS server", APPEND, "IP", where=HOST, keyword="dns"),
    Option(("--dns-search",), "a DNS search domain", APPEND, "DOMAIN", where=HOST, keyword="dns_search"),
    Option(("--dns-option",), "a DNS option", APPEND, "OPT", where=HOST, keyword="dns_opt", dest="dns_options"),
    Option(("--domainname",), "the container's NIS domain name", where=CONTAINER, keyword="domainname",
           metavar="NAME"),
    Option(("--sysctl",), "a namespaced kernel parameter (KEY=VALUE, e.g. net.core.somaxconn=1024)", APPEND,
           "KEY=VALUE", where=HOST, keyword="sysctls", convert=_key_values("KEY"), dest="sysctls"),
    Option(("--storage-opt",), "a storage driver option for the container (e.g. size=120G)", APPEND, "OPT",
           where=HOST, keyword="storage_opt", convert=_key_values("OPTION"), dest="storage_opts"),
    Option(("--log-driver",), "the logging driver for the container (e.g. json-file, local, none)",
           metavar="DRIVER"),
    Option(("--log-opt",), "a logging driver option (e.g. max-size=100m)", APPEND, "KEY=VALUE",
           convert=_key_values("KEY"), dest="log_opts"),
    Option(("--shm-size",), "size of /dev/shm (e.g. 8g)", where=HOST, keyword="shm_size", convert=_size,
           metavar="SIZE"),
    Option(("--cpus",), "number of CPUs (e.g. 1.5)", where=HOST, keyword="nano_cpus", convert=_cpus,
           metavar="N"),
    Option(("-m", "--memory"), "memory limit (e.g. 64g)", where=HOST, keyword="mem_limit", convert=_size,
           metavar="SIZE"),
    Option(("--memory-swap",), "memory plus swap limit (-1: unlimited swap)", where=HOST,
           keyword="memswap_limit", convert=_memory_swap, metavar="SIZE"),
    Option(("--memory-reservation",), "memory soft limit (e.g. 32g)", where=HOST, keyword="mem_reservation",
           convert=_size, metavar="SIZE"),
    Option(("--memory-swappiness",), "how readily the container's memory is swapped (0 to 100)", where=HOST,
           keyword="mem_swappiness", convert=_integer(0, 100, "a swappiness"), metavar="N"),
    Option(("--oom-kill-disable",), "do not OOM-kill the container's processes (with --memory only)", FLAG,
           where=HOST, keyword="oom_kill_disable"),
    Option(("--oom-score-adj",), "the OOM killer's preference for the container (-1000 to 1000)", where=HOST,
           keyword="oom_score_adj", convert=_integer(-1000, 1000, "an OOM score adjustment"), metavar="N"),
    Option(("--pids-limit",), "the most processes the container may have (-1: unlimited)", where=HOST,
           keyword="pids_limit", convert=_integer(-1, 2 ** 63 - 1, "a process count"), metavar="N"),
    Option(("--cpuset-cpus",), "the CPUs the container may use (e.g. 0-3,8)", where=HOST, keyword="cpuset_cpus",
           metavar="CPUS"),
    Option(("--cpuset-mems",), "the NUMA memory nodes it may use (e.g. 0,1)", where=HOST, keyword="cpuset_mems",
           metavar="MEMS"),
    Option(("-c", "--cpu-shares"), "CPU shares (relative weight)", where=HOST, keyword="cpu_shares",
           convert=_integer(0, 2 ** 63 - 1, "a weight"), metavar="N"),
    Option(("--cpu-period",), "the CPU CFS period in microseconds", where=HOST, keyword="cpu_period",
           convert=_integer(0, 1_000_000, "a period"), metavar="US"),
    Option(("--cpu-quota",), "the CPU CFS quota in microseconds per period (-1: none)", where=HOST,
           keyword="cpu_quota", convert=_integer(-1, 2 ** 63 - 1, "a quota"), metavar="US"),
    Option(("--ulimit",), "a ulimit (NAME=SOFT[:HARD], e.g. memlock=-1)", APPEND, "ULIMIT", where=HOST,
           keyword="ulimits", each=_ulimit, dest="ulimits"),
    Option(("--device",), "add a host device (none that reaches an NVIDIA node: the pin gives the GPUs)", APPEND,
           "DEVICE", where=HOST, keyword="devices", each=_device, dest="devices"),
    Option(("--cap-add",), "add a Linux capability", APPEND, "CAP", where=HOST, keyword="cap_add"),
    Option(("--cap-drop",), "drop a Linux capability", APPEND, "CAP", where=HOST, keyword="cap_drop"),
    Option(("--security-opt",), "a security option (e.g. seccomp=unconfined)", APPEND, "OPT", where=HOST,
           keyword="security_opt"),
    Option(("--runtime",), "the OCI runtime (e.g. nvidia; the pin's NVIDIA_VISIBLE_DEVICES still rules)",
           where=HOST, keyword="runtime"),
    Option(("--restart",), "restart policy: no, always, unless-stopped, on-failure[:N] (a container the daemon "
           "will restart keeps its cards in the ledger while stopped)", where=HOST, keyword="restart_policy",
           convert=_restart, metavar="POLICY"),
    Option(("--platform",), "platform of the image (e.g. linux/amd64)", where=CREATE, keyword="platform"),
    Option(("--pull",), "pull the image: missing (default), never or always", choices=("missing", "never",
                                                                                        "always"),
           metavar="POLICY"),
    Option(("--stop-signal",), "the signal that stops the container (e.g. SIGINT; default the image's, else "
           "SIGTERM)", where=CONTAINER, keyword="stop_signal", metavar="SIGNAL"),
    Option(("--stop-timeout",), "seconds to wait for the container to stop (after Ctrl-C or SIGTERM too) before "
           "killing it (default 10)", where=CONTAINER, keyword="stop_timeout", convert=_seconds,
           metavar="SECONDS"),
    Option(("--gpu-capabilities",), "NVIDIA driver capabilities the cards come with: all, or a comma list of "
           "compute, utility, graphics, video, display, compat32 (default: the image's NVIDIA_DRIVER_CAPABILITIES; "
           "the nvidia driver's request carries them, so they pin through it, never CDI)", metavar="LIST"),
)

BY_FLAG = {flag: opt for opt in OPTIONS for flag in opt.flags}
BY_DEST = {opt.dest: opt for opt in OPTIONS}

# docker run options hostagent refuses by name, with what to do instead.
REFUSED = {
    "--gpus": "hostagent pins the GPUs itself: use --uuid/--gpu/--count",
    "--privileged": "a privileged container sees every GPU; give it --cap-add or --device for what it needs",
    "--device-cgroup-rule": "it could open other GPUs' device files; ask for the cards with --uuid/--gpu",
    "--volumes-from": "not supported by hostagent run; use -v or --mount",
    "--link": "legacy links are not supported; use --network",
    "--label-file": "labels meet the pin (gpupin.devices is the ledger): give each with --label",
}

# The rest of docker run's options (Docker 28's `docker run --help`), which hostagent does not pass: refused by
# name, not as a typo of one of its own.
NOT_TAKEN = frozenset({
    "-a", "--attach", "--annotation", "--blkio-weight", "--blkio-weight-device", "--cidfile", "--cpu-count",
    "--cpu-percent", "--cpu-rt-period", "--cpu-rt-runtime", "--detach-keys", "--device-read-bps",
    "--device-read-iops", "--device-write-bps", "--device-write-iops", "--disable-content-trust", "--expose",
    "--health-cmd", "--health-interval", "--health-retries", "--health-start-interval", "--health-start-period",
    "--health-timeout", "--io-maxbandwidth", "--io-maxiops", "--ip", "--ip6", "--isolation", "--kernel-memory",
    "--link-local-ip", "--mac-address", "--network-alias", "--no-healthcheck", "-q", "--quiet", "--use-api-socket",
    "--volume-driver",
})
NOT_TAKEN_HINT = ("`hostagent run --help` lists the docker run options it passes; for another, add it to the "
                  "docker run line that `hostagent run --dry-run` prints (a start the ledger's lock does not "
                  "guard against a concurrent one)")


def payload(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The SDK keywords of every option that is set: {"container": {...}, "host": {...}, "create": {...}}."""
    out: dict[str, dict[str, Any]] = {CONTAINER: {}, HOST: {}, CREATE: {}}
    for opt in OPTIONS:
        value = values.get(opt.dest)
        if value in (None, False, []):
            continue
        converted = opt.sdk_value(value)  # checks the options hostagent reads itself (--pull) too
        if opt.where is not None and opt.keyword is not None:
            out[opt.where][opt.keyword] = converted
        if opt.dest == "publish":  # docker run exposes what it publishes
            out[CONTAINER]["ports"] = _exposed(out[HOST]["port_bindings"])
    driver, log_opts = values.get("log_driver"), values.get("log_opts")
    if driver or log_opts:  # one LogConfig from both; no driver: the daemon's default one, with these options
        out[HOST]["log_config"] = {"type": driver or "",
                                   "config": BY_DEST["log_opts"].sdk_value(log_opts) if log_opts else {}}
    return out

"""The `docker run` options that `hostagent run` takes: one table, read by the parser, the argument splitter, the
create payload and the dry-run line alike, so that an option means the same thing everywhere. Each row says where
its value goes in the Engine API (through hostagent.run.values where the text is not the value); options that
would reach other GPUs, and those hostagent does not pass (NOT_TAKEN), are refused by name (docs/run.md, "The
docker run options").
"""

from __future__ import annotations

from gpupin.core.errors import UsageError
from gpupin.hostagent.completion import FILES
from gpupin.hostagent.run import values

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
RAW_HOST = "raw host"  # HostConfig fields set as the API names them, where the SDK has no keyword


class Option:
    """One docker run option: its spellings, help, how many values, and where its value goes."""

    __slots__ = (
        "choices",
        "complete",
        "convert",
        "dest",
        "each",
        "flags",
        "help",
        "keyword",
        "kind",
        "metavar",
        "where",
    )

    def __init__(
        self,
        flags: Sequence[str],
        help: str,
        kind: str = VALUE,
        metavar: str | None = None,
        where: str | None = None,
        keyword: str | None = None,
        convert: Callable[[Any], Any] | None = None,
        choices: Sequence[str] | None = None,
        dest: str | None = None,
        each: Callable[[str], Any] | None = None,
        complete: str | Sequence[str] | None = None,
    ) -> None:
        self.flags = tuple(flags)
        self.help = help
        self.kind = kind
        self.metavar = metavar
        self.where = where
        self.keyword = keyword
        self.convert = convert  # the whole value (a list for APPEND) -> the API's value
        self.each = each  # or: each value of an APPEND option -> one item of the API's list
        self.choices = tuple(choices) if choices else None
        self.dest = dest or self.name.lstrip("-").replace("-", "_")
        # what shell completion offers for the value (hostagent.completion.offer): the choices, else this
        self.complete = self.choices or complete

    @property
    def name(self) -> str:
        """The long spelling (the first, where docker keeps an old one too: --network, not --net)."""
        return next(f for f in self.flags if f.startswith("--"))

    def sdk_value(self, value: Any) -> Any:
        """The Engine API value of the option's value(s); UsageError naming the option on bad text."""
        if self.choices and value is not None and value not in self.choices:
            raise UsageError(
                f"{self.name} {value}: not one of {', '.join(self.choices)}",
                f"use {self.name} {' or '.join(self.choices)}",
            )
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
        if self.kind == FLAG:  # None: not given; False: given =false (--init=false means something)
            return [] if value is None else [self.flags[0]] if value else [f"{self.name}=false"]
        values = value if self.kind == APPEND else ([] if value is None else [value])
        return [a for v in values for a in (self.flags[0], str(v))]


OPTIONS: Sequence[Option] = (
    Option(("--name",), "assign a name to the container"),
    Option(("-d", "--detach"), "run in the background and print the container ID", FLAG),
    Option(
        ("-i", "--interactive"),
        "keep STDIN open and forward this terminal's (or pipe's) input",
        FLAG,
        where=CONTAINER,
        keyword="stdin_open",
    ),
    Option(
        ("-t", "--tty"), "allocate a pseudo-TTY (with -i: an interactive shell)", FLAG, where=CONTAINER, keyword="tty"
    ),
    Option(
        ("--sig-proxy",),
        "forward SIGINT/SIGTERM to the container's process (on by default; --sig-proxy=false: the first stops it)",
        FLAG,
    ),
    Option(("--rm",), "remove the container when it exits", FLAG, where=HOST, keyword="auto_remove"),
    Option(
        ("-e", "--env"),
        "set an environment variable (KEY=VALUE, or KEY to pass this shell's value)",
        APPEND,
        "KEY[=VALUE]",
    ),
    Option(
        ("--env-file",),
        "read environment variables from a file (KEY=VALUE lines)",
        APPEND,
        "FILE",
        dest="env_files",
        complete=FILES,
    ),
    Option(("-l", "--label"), "set a label on the container", APPEND, "KEY=VALUE", dest="labels"),
    Option(
        ("-v", "--volume"),
        "bind mount a volume",
        APPEND,
        "SRC:DST[:OPTS]",
        where=HOST,
        keyword="binds",
        each=values.volume,
        dest="volumes",
        complete=FILES,
    ),
    Option(
        ("--mount",),
        "attach a mount (type=bind|volume|tmpfs,source=...,target=...[,readonly])",
        APPEND,
        "SPEC",
        where=HOST,
        keyword="mounts",
        each=values.mount,
        dest="mounts",
    ),
    Option(
        ("--tmpfs",),
        "mount a tmpfs (PATH[:OPTIONS])",
        APPEND,
        "PATH",
        where=HOST,
        keyword="tmpfs",
        convert=values.tmpfs,
    ),
    Option(("--read-only",), "mount the container's root file system read-only", FLAG, where=HOST, keyword="read_only"),
    Option(
        ("-w", "--workdir"),
        "working directory inside the container",
        where=CONTAINER,
        keyword="working_dir",
        metavar="DIR",
    ),
    Option(("-u", "--user"), "username or UID (format: <name|uid>[:<group|gid>])", where=CONTAINER, keyword="user"),
    Option(("--group-add",), "add an additional group to join", APPEND, "GROUP", where=HOST, keyword="group_add"),
    Option(("--hostname", "-h"), "the container's host name", where=CONTAINER, keyword="hostname"),
    Option(
        ("--add-host",),
        "add a line to /etc/hosts (HOST:IP)",
        APPEND,
        "HOST:IP",
        where=HOST,
        keyword="extra_hosts",
        each=values.add_host,
        dest="add_hosts",
    ),
    Option(
        ("--entrypoint",),
        "override the image's ENTRYPOINT (the pin is proven only by gpupin-entrypoint)",
        where=CONTAINER,
        keyword="entrypoint",
        convert=values.entrypoint,
        metavar="CMD",
    ),
    Option(
        ("--init",),
        "run an init inside the container that forwards signals and reaps processes",
        FLAG,
        where=HOST,
        keyword="init",
    ),
    Option(
        ("-p", "--publish"),
        "publish a container's port to the host ([IP:][HOST-PORT:]PORT[/PROTO])",
        APPEND,
        "PORT",
        where=HOST,
        keyword="port_bindings",
        convert=values.publish,
        dest="publish",
    ),
    Option(
        ("-P", "--publish-all"),
        "publish every port the image exposes, each to a random host port",
        FLAG,
        where=HOST,
        keyword="publish_all_ports",
    ),
    Option(
        ("--network", "--net"),
        "connect the container to a network",
        where=HOST,
        keyword="network_mode",
        metavar="NETWORK",
    ),
    Option(("--ipc",), "IPC mode to use (e.g. host)", where=HOST, keyword="ipc_mode", metavar="MODE"),
    Option(("--pid",), "PID namespace to use (e.g. host)", where=HOST, keyword="pid_mode", metavar="MODE"),
    Option(("--uts",), "UTS namespace to use: host", where=HOST, keyword="uts_mode", choices=("host",), metavar="MODE"),
    Option(
        ("--userns",),
        "user namespace to use: host (when the daemon remaps users)",
        where=HOST,
        keyword="userns_mode",
        choices=("host",),
        metavar="MODE",
    ),
    Option(
        ("--cgroupns",),
        "cgroup namespace to use: host or private",
        where=HOST,
        keyword="cgroupns",
        choices=("host", "private"),
        metavar="MODE",
    ),
    Option(
        ("--cgroup-parent",),
        "the cgroup the container's cgroup is made under",
        where=HOST,
        keyword="cgroup_parent",
        metavar="CGROUP",
    ),
    Option(("--dns",), "a DNS server", APPEND, "IP", where=HOST, keyword="dns"),
    Option(("--dns-search",), "a DNS search domain", APPEND, "DOMAIN", where=HOST, keyword="dns_search"),
    Option(
        ("--dns-option", "--dns-opt"), "a DNS option", APPEND, "OPT", where=HOST, keyword="dns_opt", dest="dns_options"
    ),
    Option(("--domainname",), "the container's NIS domain name", where=CONTAINER, keyword="domainname", metavar="NAME"),
    Option(
        ("--sysctl",),
        "a namespaced kernel parameter (KEY=VALUE, e.g. net.core.somaxconn=1024)",
        APPEND,
        "KEY=VALUE",
        where=HOST,
        keyword="sysctls",
        convert=values.key_values("KEY"),
        dest="sysctls",
    ),
    Option(
        ("--storage-opt",),
        "a storage driver option for the container (e.g. size=120G)",
        APPEND,
        "OPT",
        where=HOST,
        keyword="storage_opt",
        convert=values.key_values("OPTION"),
        dest="storage_opts",
    ),
    Option(("--log-driver",), "the logging driver for the container (e.g. json-file, local, none)", metavar="DRIVER"),
    Option(
        ("--log-opt",),
        "a logging driver option (e.g. max-size=100m)",
        APPEND,
        "KEY=VALUE",
        convert=values.key_values("KEY"),
        dest="log_opts",
    ),
    Option(
        ("--shm-size",),
        "size of /dev/shm (e.g. 8g)",
        where=HOST,
        keyword="shm_size",
        convert=values.size,
        metavar="SIZE",
    ),
    Option(
        ("--cpus",),
        "number of CPUs (e.g. 1.5; 0: no limit)",
        where=HOST,
        keyword="nano_cpus",
        convert=values.cpus,
        metavar="N",
    ),
    Option(
        ("-m", "--memory"),
        "memory limit (e.g. 64g)",
        where=HOST,
        keyword="mem_limit",
        convert=values.size,
        metavar="SIZE",
    ),
    Option(
        ("--memory-swap",),
        "memory plus swap limit (-1: unlimited swap)",
        where=HOST,
        keyword="memswap_limit",
        convert=values.memory_swap,
        metavar="SIZE",
    ),
    Option(
        ("--memory-reservation",),
        "memory soft limit (e.g. 32g)",
        where=HOST,
        keyword="mem_reservation",
        convert=values.size,
        metavar="SIZE",
    ),
    Option(
        ("--memory-swappiness",),
        "how readily the container's memory is swapped (0 to 100)",
        where=HOST,
        keyword="mem_swappiness",
        convert=values.integer(0, 100, "a swappiness"),
        metavar="N",
    ),
    Option(
        ("--oom-kill-disable",),
        "do not OOM-kill the container's processes (with --memory only)",
        FLAG,
        where=HOST,
        keyword="oom_kill_disable",
    ),
    Option(
        ("--oom-score-adj",),
        "the OOM killer's preference for the container (-1000 to 1000)",
        where=HOST,
        keyword="oom_score_adj",
        convert=values.integer(-1000, 1000, "an OOM score adjustment"),
        metavar="N",
    ),
    Option(
        ("--pids-limit",),
        "the most processes the container may have (-1: unlimited)",
        where=HOST,
        keyword="pids_limit",
        convert=values.integer(-1, 2**63 - 1, "a process count"),
        metavar="N",
    ),
    Option(
        ("--cpuset-cpus",),
        "the CPUs the container may use (e.g. 0-3,8)",
        where=HOST,
        keyword="cpuset_cpus",
        metavar="CPUS",
    ),
    Option(
        ("--cpuset-mems",),
        "the NUMA memory nodes it may use (e.g. 0,1)",
        where=HOST,
        keyword="cpuset_mems",
        metavar="MEMS",
    ),
    Option(
        ("-c", "--cpu-shares"),
        "CPU shares (relative weight)",
        where=HOST,
        keyword="cpu_shares",
        convert=values.integer(0, 2**63 - 1, "a weight"),
        metavar="N",
    ),
    Option(
        ("--cpu-period",),
        "the CPU CFS period in microseconds",
        where=HOST,
        keyword="cpu_period",
        convert=values.integer(0, 1_000_000, "a period"),
        metavar="US",
    ),
    Option(
        ("--cpu-quota",),
        "the CPU CFS quota in microseconds per period (-1: none)",
        where=HOST,
        keyword="cpu_quota",
        convert=values.integer(-1, 2**63 - 1, "a quota"),
        metavar="US",
    ),
    Option(
        ("--ulimit",),
        "a ulimit (NAME=SOFT[:HARD], e.g. memlock=-1)",
        APPEND,
        "ULIMIT",
        where=HOST,
        keyword="ulimits",
        convert=values.ulimits,
        dest="ulimits",
    ),
    Option(
        ("--device",),
        "add a host device (none that reaches an NVIDIA node: the pin gives the GPUs)",
        APPEND,
        "DEVICE",
        where=HOST,
        keyword="devices",
        each=values.device,
        dest="devices",
        complete=FILES,
    ),
    Option(("--cap-add",), "add a Linux capability", APPEND, "CAP", where=HOST, keyword="cap_add"),
    Option(("--cap-drop",), "drop a Linux capability", APPEND, "CAP", where=HOST, keyword="cap_drop"),
    Option(
        ("--security-opt",),
        "a security option (e.g. seccomp=unconfined, seccomp=PROFILE.json, no-new-privileges, systempaths=unconfined)",
        APPEND,
        "OPT",
        where=HOST,
        keyword="security_opt",
        convert=values.security_opts,
    ),
    Option(
        ("--runtime",),
        "the OCI runtime (e.g. nvidia; the pin's NVIDIA_VISIBLE_DEVICES still rules)",
        where=HOST,
        keyword="runtime",
    ),
    Option(
        ("--restart",),
        "restart policy: no, always, unless-stopped, on-failure[:N] (a container the daemon "
        "will restart keeps its cards in the ledger while stopped)",
        where=HOST,
        keyword="restart_policy",
        convert=values.restart,
        metavar="POLICY",
        complete=values.RESTART_POLICIES,
    ),
    Option(("--platform",), "platform of the image (e.g. linux/amd64)", where=CREATE, keyword="platform"),
    Option(
        ("--pull",),
        "pull the image: missing (default), never or always",
        choices=("missing", "never", "always"),
        metavar="POLICY",
    ),
    Option(
        ("--stop-signal",),
        "the signal that stops the container (e.g. SIGINT; default the image's, else SIGTERM)",
        where=CONTAINER,
        keyword="stop_signal",
        metavar="SIGNAL",
    ),
    Option(
        ("--stop-timeout",),
        "seconds to wait for the container to stop (after Ctrl-C or SIGTERM too) before killing it (default 10)",
        where=CONTAINER,
        keyword="stop_timeout",
        convert=values.seconds,
        metavar="SECONDS",
    ),
    Option(
        ("--gpu-capabilities",),
        "NVIDIA driver capabilities the cards come with: all, or a comma list of "
        "compute, utility, graphics, video, display, compat32 (default: the image's NVIDIA_DRIVER_CAPABILITIES; "
        "the nvidia driver's request carries them, so they pin through it, never CDI)",
        metavar="LIST",
        complete=("all", *values.GPU_CAPABILITIES),
    ),
)

# What the docker CLI sends for the options not given (its flags' defaults), where the SDK sends nothing: the same
# HostConfig whichever of the two created the container.
CLI_HOST_DEFAULTS: dict[str, Any] = {
    "Dns": [],
    "DnsOptions": [],
    "DnsSearch": [],
    "Devices": [],
    "BlkioWeightDevice": [],
    "PortBindings": {},
    "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
}

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
NOT_TAKEN = frozenset(
    {
        "-a",
        "--attach",
        "--annotation",
        "--blkio-weight",
        "--blkio-weight-device",
        "--cidfile",
        "--cpu-count",
        "--cpu-percent",
        "--cpu-rt-period",
        "--cpu-rt-runtime",
        "--detach-keys",
        "--device-read-bps",
        "--device-read-iops",
        "--device-write-bps",
        "--device-write-iops",
        "--disable-content-trust",
        "--expose",
        "--health-cmd",
        "--health-interval",
        "--health-retries",
        "--health-start-interval",
        "--health-start-period",
        "--health-timeout",
        "--io-maxbandwidth",
        "--io-maxiops",
        "--ip",
        "--ip6",
        "--isolation",
        "--kernel-memory",
        "--link-local-ip",
        "--mac-address",
        "--network-alias",
        "--no-healthcheck",
        "-q",
        "--quiet",
        "--use-api-socket",
        "--volume-driver",
    }
)
NOT_TAKEN_HINT = (
    "`hostagent run --help` lists the docker run options it passes; for another, add it to the "
    "docker run line that `hostagent run --dry-run` prints (a start the ledger's lock does not "
    "guard against a concurrent one)"
)


def _exposed(bindings: dict[str, Any]) -> list[Any]:
    """ContainerConfig's `ports` (ExposedPorts) for the published ports, as docker run sets them."""
    out: list[Any] = []
    for key in bindings:
        port, _, proto = key.partition("/")
        out.append((int(port), proto) if proto else int(port))
    return out


def payload(given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The SDK keywords of every option that is set: {"container": {...}, "host": {...}, "create": {...}}, and the
    HostConfig fields the SDK has no keyword for ("raw host")."""
    out: dict[str, dict[str, Any]] = {CONTAINER: {}, HOST: {}, CREATE: {}, RAW_HOST: {}}
    for opt in OPTIONS:
        value = given.get(opt.dest)
        if value is None or value == []:  # not given (a bool flag given =false is False: sent, as docker does)
            continue
        converted = opt.sdk_value(value)  # checks the options hostagent reads itself (--pull) too
        if opt.where is not None and opt.keyword is not None:
            out[opt.where][opt.keyword] = converted
        if opt.dest == "publish":  # docker run exposes what it publishes
            out[CONTAINER]["ports"] = _exposed(out[HOST]["port_bindings"])
    host = out[HOST]
    if "binds" in host:  # `-v /path` is an anonymous volume (Config.Volumes), as docker run makes it
        anonymous = [b for b in host["binds"] if values.anonymous(b)]
        host["binds"] = [b for b in host["binds"] if not values.anonymous(b)]
        if anonymous:
            out[CONTAINER]["volumes"] = anonymous
    if values.SYSTEMPATHS_UNCONFINED in host.get("security_opt", ()):  # the CLI's own option, not the daemon's
        host["security_opt"] = [o for o in host["security_opt"] if o != values.SYSTEMPATHS_UNCONFINED]
        out[RAW_HOST].update(MaskedPaths=[], ReadonlyPaths=[])
    driver, log_opts = given.get("log_driver"), given.get("log_opts")
    if driver or log_opts:  # one LogConfig from both; no driver: the daemon's default one, with these options
        out[HOST]["log_config"] = {
            "type": driver or "",
            "config": BY_DEST["log_opts"].sdk_value(log_opts) if log_opts else {},
        }
    return out

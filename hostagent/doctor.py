"""`hostagent doctor`: check a GPU host for the traps that break pins, one line per finding with a HINT.

Each trap is silent until a workload lands on the wrong card or loses it mid-run (docs/design.md, "The host's
traps"). `--root DIR` reads /dev, /sys and /etc under DIR (tests plant a host there); NVML and the daemon are
asked as they are.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys

from gpupin.core import nvml, readings
from gpupin.core.errors import GpupinError, UsageError, quoted, shown
from gpupin.hostagent.completion import DIRS, offer
from gpupin.hostagent.findings import ERROR, WARNING, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.core.nvml import Card
    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.yamlfile import YAMLMapping

EX_FINDINGS = 1  # the host has at least one trap (as `brew doctor`); 0: clean
CREATE_DEV_CHAR = "nvidia-ctk system create-dev-char-symlinks --create-all"
HOOK = "nvidia-container-runtime-hook"
# The device nodes the NVIDIA driver creates: the cards, the control node, UVM, modeset and the MIG capabilities.
_NODE_PREFIXES = ("nvidia",)
_CAPS = "nvidia-caps"


class HostFiles:
    """Where doctor reads the host's files: `root` + /dev, /sys, /etc (the real host when root is "/")."""

    def __init__(self, root: str = "/") -> None:
        self.root = root

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *[p.lstrip("/") for p in parts])


# --- the traps ------------------------------------------------------------------------------------------------


def nvidia_nodes(host: HostFiles) -> list[tuple[str, int, int]]:
    """The NVIDIA character device nodes under /dev (and /dev/nvidia-caps): (path, major, minor)."""
    found: list[tuple[str, int, int]] = []
    dev = host.path("/dev")
    for folder in (dev, os.path.join(dev, _CAPS)):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if folder == dev and not name.startswith(_NODE_PREFIXES):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                found.append((path, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def check_dev_char(host: HostFiles, cgroup_driver: str | None) -> list[Finding]:
    """The daemon-reload trap: under the systemd cgroup driver every NVIDIA node needs its /dev/char/MAJ:MIN link."""
    if cgroup_driver != "systemd":
        return []
    missing: list[str] = []
    for path, major, minor in nvidia_nodes(host):
        try:  # the link must lead to a node of the same numbers (a dangling or stale link is as bad as none)
            linked = os.stat(host.path("/dev/char", f"{major}:{minor}")).st_rdev == os.makedev(major, minor)
        except OSError:
            linked = False
        if not linked:
            missing.append(f"{major}:{minor} ({os.path.relpath(path, host.path('/dev'))})")
    if not missing:
        return []
    return [
        Finding(
            "/dev/char",
            f"no link for {len(missing)} NVIDIA device node(s) ({', '.join(missing[:6])}"
            f"{', ...' if len(missing) > 6 else ''}) while Docker uses the systemd cgroup driver: a "
            "`systemctl daemon-reload` takes the GPUs from running containers (NVML: Unknown Error)",
            f"run `{CREATE_DEV_CHAR}` (and add it to a udev rule or boot unit so that it survives reboots)",
        )
    ]


def check_persistence(cards: Sequence[Card], modes: Mapping[int, bool | None]) -> list[Finding]:
    off = [c for c in cards if modes.get(c.index) is False]
    if not off:
        return []
    names = ", ".join(f"{c.index} ({c.uuid})" for c in off)
    return [
        Finding(
            "persistence mode",
            f"off on card(s) {names}: each container start pays the card's init "
            "again (seconds under the NVIDIA hook), and a slow start holds the card's lock longer",
            "start nvidia-persistenced (or `nvidia-smi -pm 1` as root)",
            WARNING,
        )
    ]


def _spec_dirs(host: HostFiles, info: Mapping[str, Any] | None) -> list[str]:
    dirs = [str(d) for d in (info or {}).get("CDISpecDirs") or []] or ["/etc/cdi", "/var/run/cdi"]
    return [host.path(d) for d in dirs]


def check_cdi(host: HostFiles, info: Mapping[str, Any] | None, cards: Sequence[Card]) -> list[Finding]:
    """Every nvidia.com/gpu device a CDI spec names must be a card NVML has, and every card must be named."""
    from gpupin.core.identity import is_uuid_like
    from gpupin.hostagent.engine import cdi

    findings: list[Finding] = []
    uuids = {c.uuid for c in cards if c.uuid}
    migs = {m.uuid for c in cards for m in c.mig_devices if m.uuid}
    refused: list[tuple[str, str]] = []
    specs = cdi.read_spec_dirs(_spec_dirs(host, info), refused)
    findings += [
        Finding(
            path,
            f"the CDI spec is not read: {why}",
            "remove it, or regenerate it with `nvidia-ctk cdi generate`",
            WARNING,
        )
        for path, why in refused
    ]
    for path, names in specs.items():
        named = [n for n in names if is_uuid_like(n)]
        unknown = [n for n in named if n not in uuids and n not in migs]
        indices = [n for n in names if n.isascii() and n.isdigit() and int(n) >= len(cards)]
        absent = sorted(uuids - set(named))
        problems = []
        if unknown or indices:
            problems.append(f"names {', '.join(map(shown, unknown + indices))}, which NVML does not have")
        if absent:
            problems.append(f"does not name {', '.join(absent)}, which NVML has")
        if problems:
            findings.append(
                Finding(
                    path,
                    f"the {cdi.KIND} spec {' and '.join(problems)}: a CDI name then gives "
                    "another card than it says, or none",
                    "regenerate it: `nvidia-ctk cdi generate --output=" + path + "`",
                )
            )
    return findings


def check_discovered(info: Mapping[str, Any], cards: Sequence[Card]) -> list[Finding]:
    """The nvidia.com/gpu devices the daemon discovered (Engine 28.2+'s DiscoveredDevices: what a CDI name
    resolves against) against NVML's cards, one line per card: one NVML has that the daemon does not discover, one
    the daemon discovers that NVML does not have. Cards are matched by UUID where the daemon names any by UUID,
    else by index (the `index` name strategy alone)."""
    from gpupin.core.identity import is_uuid_like
    from gpupin.hostagent.engine import cdi

    names = cdi.discovered(info)
    if not names:
        return []  # no list (older daemon, CDI off) or no NVIDIA device: check_runtime and check_cdi say so
    by_uuid = any(is_uuid_like(n) for n in names)
    known = {c.uuid for c in cards if c.uuid} | {m.uuid for c in cards for m in c.mig_devices if m.uuid}
    hint = "regenerate the CDI spec (`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`, or nvidia-cdi-refresh)"
    specs = {cdi.as_spec(n) for n in names}  # `gpu2` (the type-index strategy) is index 2
    findings = []
    for c in cards:
        if (c.uuid if by_uuid else str(c.index)) not in specs:
            findings.append(
                Finding(
                    "docker",
                    f"the daemon discovers no {cdi.KIND} device for card {c.index} ({c.uuid}), which NVML has: "
                    "a CDI name cannot give it",
                    hint,
                )
            )
    for n in names:
        spec = cdi.as_spec(n)
        stale = n not in known if is_uuid_like(n) else spec.isascii() and spec.isdigit() and int(spec) >= len(cards)
        if stale:
            findings.append(
                Finding(
                    "docker",
                    f"the daemon discovers {cdi.name(n)}, which NVML does not have: that CDI name gives another "
                    "card than it says, or none",
                    hint,
                )
            )
    return findings


# The toolkit locates the driver's libraries by the driver's version and mounts each by its versioned name
# (libcuda.so.580.95.05): the spec's driver is in those names.
_LIB_VERSION = re.compile(r"lib(cuda|nvidia-ml)\.so\.([0-9]+(?:\.[0-9]+)+)")
CDI_07_ENGINE = (26, 1)  # moby#47706 (CDI library 0.7.1, spec 0.7.0) shipped in Engine 26.1
SPEC_LIMIT = 8 << 20


def _version(text: str) -> tuple[int, ...]:
    """`26.0.2` -> (26, 0, 2); the leading numbers only (`28.5.2+dfsg1` -> (28, 5, 2)); () when none."""
    m = re.match(r"[0-9]+(?:\.[0-9]+)*", text.strip().lstrip("v"))
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def _spec_document(path: str) -> YAMLMapping | None:
    """A whole CDI spec (JSON or YAML), or None when it cannot be read as one (the daemon skips it too)."""
    from gpupin.core.files import read_bounded

    try:
        data = read_bounded(path, SPEC_LIMIT)
        if path.endswith(".json"):
            doc = json.loads(data)
        else:
            import yaml

            doc = yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except Exception:  # a broken spec: check_cdi's reader skips it, and so does the daemon's
        return None
    return doc if isinstance(doc, dict) else None


def spec_driver_version(spec: Mapping[str, Any]) -> str | None:
    """The driver a spec was generated for: the version in the name of its libcuda.so.X mount (else
    libnvidia-ml.so.X), in its common edits or any device's; None when it mounts neither."""
    edits = [spec.get("containerEdits")] + [
        d.get("containerEdits") for d in spec.get("devices") or [] if isinstance(d, dict)
    ]
    found: dict[str, str] = {}
    for e in edits:
        for mount in (e or {}).get("mounts") or [] if isinstance(e, dict) else []:
            if not isinstance(mount, dict):
                continue
            for key in ("containerPath", "hostPath"):
                m = _LIB_VERSION.fullmatch(os.path.basename(str(mount.get(key) or "")))
                if m:
                    found.setdefault(m.group(1), m.group(2))
    return found.get("cuda") or found.get("nvidia-ml")


def check_cdi_versions(host: HostFiles, info: Mapping[str, Any] | None, driver: str | None) -> list[Finding]:
    """Each nvidia.com/gpu spec against the loaded driver (NVML's version) and the Engine that reads it."""
    from gpupin.hostagent.engine import cdi

    findings: list[Finding] = []
    server = str((info or {}).get("ServerVersion") or "")
    engine = _version(server)
    cdi_on = bool((info or {}).get("CDISpecDirs"))
    for path in cdi.read_spec_dirs(_spec_dirs(host, info)):
        spec = _spec_document(path)
        if spec is None:
            continue
        written = spec_driver_version(spec)
        if driver and written and written != driver:
            older = "older than" if _version(written) < _version(driver) else "other than"
            findings.append(
                Finding(
                    path,
                    f"the {cdi.KIND} spec was generated for driver {written}, {older} the loaded driver {driver}: "
                    f"its mounts name that driver's libraries (.so.{written}), so a container given a card "
                    "through it fails to start or gets the old libraries",
                    "regenerate it, as nvidia-cdi-refresh does on each driver install (toolkit 1.18+): `systemctl "
                    f"restart nvidia-cdi-refresh.service`, or `nvidia-ctk cdi generate --output={path}`",
                    ERROR,
                )
            )
        version = str(spec.get("cdiVersion") or "")
        if cdi_on and (25,) <= engine < CDI_07_ENGINE and _version(version) >= (0, 7):
            findings.append(
                Finding(
                    path,
                    f"the {cdi.KIND} spec is CDI {version} (toolkit 1.19.1 writes 0.7.0 by default), which Engine "
                    f"{server} cannot read (CDI 0.7 came with Engine 26.1): every CDI name of it is an unresolvable "
                    "device there",
                    "upgrade Docker Engine to 26.1 or later; or keep a toolkit whose specs are older (1.19.0 and "
                    "before) and regenerate the spec",
                    ERROR,
                )
            )
    return findings


def check_runtime(info: Mapping[str, Any], host: HostFiles, cdi_served: bool) -> list[Finding]:
    findings: list[Finding] = []
    runtimes = info.get("Runtimes") or {}
    path = [*os.environ.get("PATH", "").split(os.pathsep), "/usr/bin", "/usr/local/bin"]
    hook = any(os.path.exists(host.path(d, HOOK)) for d in path if d)
    if not hook and "nvidia" not in runtimes and not cdi_served:
        findings.append(
            Finding(
                "docker",
                "neither the NVIDIA hook nor the nvidia runtime nor a CDI spec is here: "
                '`--gpus` fails with "could not select device driver"',
                "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure "
                "--runtime=docker`, or `nvidia-ctk cdi generate` on Engine 25+",
            )
        )
    swarm = str(((info.get("Swarm") or {}).get("LocalNodeState")) or "")
    if swarm == "active":
        default = str(info.get("DefaultRuntime") or "")
        if "nvidia" not in runtimes:
            findings.append(
                Finding(
                    "docker",
                    "this Swarm node has no nvidia runtime: its tasks get no GPU",
                    "install the NVIDIA Container Toolkit; `hostagent swarm node-config` prints the settings",
                )
            )
        elif default != "nvidia":
            findings.append(
                Finding(
                    "docker",
                    f"this Swarm node's default runtime is {default or 'runc'}, not "
                    "nvidia: a service cannot ask for --gpus, so its tasks get no GPU",
                    'set "default-runtime": "nvidia" in daemon.json and restart dockerd',
                )
            )
    return findings


def check_swarm_resource(info: Mapping[str, Any], host: HostFiles, cards: Sequence[Card]) -> list[Finding]:
    """On a Swarm node: node-config --check's findings (generic resources, runtime, the toolkit's swarm-resource)."""
    if str(((info.get("Swarm") or {}).get("LocalNodeState")) or "") != "active":
        return []
    from gpupin.hostagent.swarm import nodecheck
    from gpupin.hostagent.swarm.resources import DAEMON_JSON, TOOLKIT_CONFIG

    result = nodecheck.check(
        nodecheck.read_daemon_json(host.path(DAEMON_JSON)),
        nodecheck.read_toolkit_config(host.path(TOOLKIT_CONFIG)),
        cards,
    )
    return [f for f in result.findings if "default runtime" not in f.problem]  # said once, by check_runtime


def check_policy(host: HostFiles) -> list[Finding]:
    """The host's policy file, when there is one (docs/policy.md): each mistake, which the agent would not take."""
    from gpupin.hostagent.policy import DEFAULT_PATH, check_policy, policy_path

    path = policy_path() if host.root == "/" else host.path(DEFAULT_PATH)
    if not os.path.lexists(path):
        return []
    mistakes = check_policy(path)
    if not mistakes:  # a good policy may still name someone the host no longer has: said, as the agent says it
        from gpupin.hostagent.policy import load_policy

        return [
            Finding(path, f"the policy names no one here: {w}", "remove the rule, or give the name again", WARNING)
            for w in load_policy(path).warnings
        ]
    return [
        Finding(
            path,
            f"the policy has a mistake: {m}",
            "fix it (`hostagent policy check`), then `systemctl reload gpupin-hostagent`: meanwhile the agent keeps "
            "the last good policy it read (a restart, the last one it saved; with none saved it does not start)",
        )
        for m in mistakes
    ]


# Engine releases whose daemon can forward a request to its authorization plugins without the request's body, so
# that a plugin reading the body (gpupin's reads a create's devices) may allow what it would deny. Written once, from
# the advisories themselves: github.com/moby/moby/security/advisories/GHSA-v23v-6jw2-98fq (CVE-2024-41110: the
# 2018 bypass fixed in 18.09.1, lost in 19.03; "If you don't use AuthZ plugins, you are not affected") and
# GHSA-x744-4wpc-v9h2 (CVE-2026-34040, its incomplete fix). Each: (CVE, what, affected [first, fixed) ranges).
AUTHZ_ADVISORIES: tuple[tuple[str, str, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]], ...] = (
    # Before 18.09.1 the same hole had no CVE: its release notes' "Fix authz plugin for 0-length content and path
    # validation" (docs.docker.com/engine/release-notes/18.09, 18.09.1 security fixes).
    (
        "the 2018 bypass (no CVE)",
        "a request with Content-Length 0 reaches the plugin without its body",
        (((0,), (18, 9, 1)),),
    ),
    (
        "CVE-2024-41110",
        "a request with Content-Length 0 reaches the plugin without its body",
        (((19, 3), (23, 0, 15)), ((24,), (25, 0, 6)), ((26,), (26, 1, 5)), ((27,), (27, 1, 1))),
    ),
    ("CVE-2026-34040", "a request with an oversized body reaches the plugin without it", (((0,), (29, 3, 1)),)),
)
# Debian patches its docker.io without changing the version the daemon reports (20.10.24+dfsg1-1+deb12u1 fixed
# CVE-2024-41110; trixie's 26.1.5+dfsg1-9+deb13u1 and sid's 28.5.2+dfsg4-5 CVE-2026-34040): the package's
# changelog says which fixes a build has.
DEBIAN_CHANGELOG = "/usr/share/doc/docker.io/changelog.Debian.gz"
AUTHZ_PLUGIN = "gpupin"


def debian_fixes(host: HostFiles, server_version: str) -> str:
    """The local docker.io package's changelog, when it is the running daemon's own build ("" otherwise)."""
    import gzip

    try:
        with gzip.open(host.path(DEBIAN_CHANGELOG), "rt", errors="replace") as f:
            text = f.read(4 << 20)
    except (OSError, EOFError):
        return ""
    first = text.split("\n", 1)[0]  # docker.io (20.10.24+dfsg1-1+deb12u1) bookworm; urgency=high
    m = re.match(r"docker\.io \((?:\d+:)?([^)\s]+)-[^-)\s]+\)", first)
    return text if m and m.group(1) == server_version else ""


def authz_advisories(server_version: str, host: HostFiles) -> list[tuple[str, str]]:
    """(CVE, what) of each bypass advisory this engine version is in, less those its Debian build fixed."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", server_version)
    if not m:
        return []
    version = tuple(int(x) for x in m.groups())
    changelog: str | None = None
    found: list[tuple[str, str]] = []
    for cve, what, ranges in AUTHZ_ADVISORIES:
        if not any(first <= version < fixed for first, fixed in ranges):
            continue
        if "+dfsg" in server_version:
            if changelog is None:
                changelog = debian_fixes(host, server_version)
            if cve in changelog:
                continue
        found.append((cve, what))
    return found


def authz_state(info: Mapping[str, Any], podman: bool) -> tuple[str, list[str]]:
    """Whether the daemon asks gpupin ("on", "off", "down", "podman", "unknown") and the other authorization plugins
    it lists (docker info: the list it started with; gpupin's own state from the probe, which a reload changes)."""
    if podman:
        return "podman", []
    listed = [str(p) for p in ((info.get("Plugins") or {}).get("Authorization") or [])]
    from gpupin.hostagent import setup

    try:
        state = setup.probe()
    except GpupinError:
        state = "unknown"
    return state, [p for p in listed if p != AUTHZ_PLUGIN]


def check_authz(info: Mapping[str, Any], state: str, others: Sequence[str], host: HostFiles) -> list[Finding]:
    """The plugin down (the daemon refuses every request), and an engine with a bypass while a plugin is on."""
    findings: list[Finding] = []
    if state == "down":
        findings.append(
            Finding(
                "docker",
                f"the daemon asks the authorization plugin {AUTHZ_PLUGIN}, which does not answer: the daemon refuses "
                "every request until it does",
                "start it (`systemctl start gpupin-authz`, or `hostagent authz`); docs/authz.md, When the plugin is "
                "down",
            )
        )
    if state in ("on", "down") or others:
        version = str(info.get("ServerVersion") or "")
        for cve, what in authz_advisories(version, host):
            findings.append(
                Finding(
                    "docker",
                    f"Engine {shown(version)} has the AuthZ bypass {cve}: {what}",
                    "update the engine (docs/authz.md lists the fixed releases); gpupin's plugin refuses a create "
                    "it gets without its body, other plugins may not",
                )
            )
    return findings


def locked_out(host: HostFiles, err: GpupinError) -> str | None:
    """The hint for a daemon that does not answer: when its daemon.json lists gpupin and the plugin is silent, that is
    why (the daemon refuses every request, after 30-45 s of retries each, while its plugin is away)."""
    from gpupin.hostagent import setup

    try:
        listed = AUTHZ_PLUGIN in (setup.read_config(host.path(setup.DAEMON_JSON)).get(setup.KEY) or [])
    except GpupinError:
        listed = False
    if listed and setup.plugin_answers(host.path(setup.SOCKET)) is not None:
        return (
            f"daemon.json lists the authorization plugin {AUTHZ_PLUGIN} and it does not answer at {setup.SOCKET}: "
            "the daemon refuses every request until it does; start it (`systemctl start gpupin-authz`)"
        )
    return err.hint


def authz_line(state: str, others: Sequence[str]) -> str:
    words = {
        "on": f"authz: {AUTHZ_PLUGIN} on",
        "off": f"authz: {AUTHZ_PLUGIN} off",
        "down": f"authz: {AUTHZ_PLUGIN} on but not answering",
        "podman": "authz: none (podman has no authorization plugins)",
        "unknown": f"authz: {AUTHZ_PLUGIN} unknown",
    }
    line = words[state]
    if others:
        line += f", other plugins {', '.join(shown(p) for p in others)}"
    return line


def cgroup_line(info: Mapping[str, Any] | None, host: HostFiles) -> str:
    if info is not None and info.get("CgroupDriver"):
        return f"cgroup v{shown(info.get('CgroupVersion') or '?')} with the {shown(info['CgroupDriver'])} driver"
    v2 = os.path.exists(host.path("/sys/fs/cgroup/cgroup.controllers"))
    return f"cgroup v{2 if v2 else 1} (the Docker daemon's driver unknown)"


# --- the command ----------------------------------------------------------------------------------------------

DESCRIPTION = (
    "Check this GPU host for the traps that break pins: /dev/char links missing under the systemd cgroup "
    "driver, persistence mode off, a CDI spec (or the daemon's discovered CDI devices) whose cards differ from "
    "NVML's, or that was generated for another driver, a CDI 0.7 spec on an Engine before 26.1, the NVIDIA hook "
    "or runtime "
    "missing, a Swarm node's default runtime and the toolkit's swarm-resource, an authorization plugin that does "
    "not answer and an engine with an AuthZ bypass advisory while one is on (docs/authz.md). One line per finding, "
    "each "
    "with a HINT. Exit 0 when the host is clean, 1 when it has a trap, 64 bad usage."
)


def add(sub: Any) -> None:
    """`hostagent doctor`'s parser, under the top parser's subcommands."""
    doc = sub.add_parser("doctor", help="check this GPU host for the traps that break pins", description=DESCRIPTION)
    doc.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    offer(
        doc.add_argument(
            "--root",
            default="/",
            metavar="DIR",
            help="read /dev, /sys and /etc under DIR (a planted host, for tests); default /",
        ),
        DIRS,
    )


class Report:
    def __init__(self, findings: list[Finding], summary: str) -> None:
        self.findings = findings
        self.summary = summary

    def to_dict(self) -> JSONObject:
        return {"ok": not self.findings, "summary": self.summary, "findings": [f.to_dict() for f in self.findings]}


def examine(host: HostFiles) -> Report:
    """Every check that can run: NVML and the daemon each missing is a finding, not the end of the check."""
    findings: list[Finding] = []
    cards: list[Card] = []
    try:
        cards = nvml.list_cards(mig=True, tolerate_lost=True)
        findings += check_persistence(cards, readings.persistence_modes(cards))
    except GpupinError as err:
        findings.append(Finding("NVML", err.message, err.hint or "check `nvidia-smi`"))
    from gpupin.hostagent import engine
    from gpupin.hostagent.engine import podman

    info: DaemonAnswer | None = None
    authz = ""
    try:
        reader = engine.reader(timeout=10)
        info = engine.info(reader)
    except GpupinError as err:
        findings.append(
            Finding("docker", f"{err.message}: the daemon's checks were skipped", locked_out(host, err), ERROR)
        )
    if info is not None:
        findings += check_dev_char(host, str(info.get("CgroupDriver") or ""))
        cdi_served = engine.cdi_detection(info).served
        if podman.version(reader):  # its /info lists no CDI folder: podman 4 and 5 read /etc/cdi and /var/run/cdi
            from gpupin.hostagent.engine import cdi

            cdi_served = bool(cdi.read_spec_dirs(_spec_dirs(host, info)))
        findings += check_runtime(info, host, cdi_served)
        findings += check_swarm_resource(info, host, cards)
        if cards and engine.endpoint().unix_path is not None:  # a remote daemon's devices are another host's
            findings += check_discovered(info, cards)
        state, others = authz_state(info, bool(podman.version(reader)))
        findings += check_authz(info, state, others, host)
        authz = authz_line(state, others)
    if cards:
        findings += check_cdi(host, info, cards)
    findings += check_cdi_versions(host, info, nvml.driver_version() if cards else None)
    findings += check_policy(host)
    summary = f"{len(cards)} card(s), {cgroup_line(info, host)}" + (f", {authz}" if authz else "")
    return Report(findings, summary)


def command(root: str, as_json: bool) -> int:
    """`hostagent doctor`: 0 when the host is clean, 1 when it has a trap (each one line with a HINT)."""
    if not os.path.isdir(root):
        raise UsageError(
            f"--root {quoted(root)}: not a folder",
            "give the folder that holds the host's /dev, /sys and /etc (default /)",
        )
    report = examine(HostFiles(root))
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        for f in report.findings:
            sys.stdout.write(f.line() + "\n")
        sys.stdout.write(
            ("OK: " if not report.findings else f"{len(report.findings)} finding(s): ") + report.summary + "\n"
        )
    return 0 if not report.findings else EX_FINDINGS

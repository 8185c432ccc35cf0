"""`hostagent swarm node-config --check`: what is wrong with a GPU node's Swarm settings, one finding per problem.
It compares the node's daemon.json and the toolkit's config.toml with the cards NVML sees and with one another
(hostagent.swarm.nodeconfig says why the three settings must agree; the findings: docs/swarm.md, "Node setup").
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys

from gpupin.core.contract import SWARM_PREFIX
from gpupin.core.identity import is_full_uuid
from gpupin.hostagent.findings import WARNING, Finding
from gpupin.hostagent.swarm.resources import (
    DAEMON_JSON,
    DEFAULT_KIND,
    RUNTIME_NAME,
    RUNTIME_PATH,
    SWARM_RESOURCE,
    TOOLKIT_CONFIG,
    GenericResource,
    GenericResourceError,
    advertisable,
    card_json,
    env_var,
    gpu_kinds,
    lookup,
    names_a_gpu,
    parse_terms,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpupin.core import JSONObject
    from gpupin.core.nvml import Card
    from gpupin.core.resolve import Target

ACCEPT_ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
_PLAIN_RUNTIMES = ("runc", "io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "crun")
_REGENERATE = "regenerate the list with `hostagent swarm node-config` on this node"


class NodeFile:
    """A configuration file as read: its content (None when absent or unreadable), why it could not be read and
    what to do about it."""

    __slots__ = ("data", "error", "exists", "hint", "path")

    def __init__(
        self,
        path: str,
        data: JSONObject | None = None,
        exists: bool = True,
        error: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = path
        self.data = data
        self.exists = exists
        self.error = error
        self.hint = hint


MAX_BYTES = 1 << 20  # a daemon.json or config.toml is a few hundred bytes


def _read(path: str) -> tuple[bytes | None, NodeFile | None]:
    """The file's bytes, bounded (gpupin.core.files: a FIFO, /dev/zero or a huge file is refused at once)."""
    from gpupin.core import files

    try:
        return files.read_bounded(path, MAX_BYTES), None
    except files.FileRefused as err:
        if err.errno == errno.ENOENT:
            return None, NodeFile(path, exists=False)
        hint = (
            "run the check as root, or point it at a readable copy"
            if err.errno in (errno.EACCES, errno.EPERM)
            else "point it at the file itself"
        )
        return None, NodeFile(path, error=err.reason, hint=hint)


def read_daemon_json(path: str = DAEMON_JSON) -> NodeFile:
    raw, failed = _read(path)
    if failed is not None:
        return failed
    assert raw is not None
    try:
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except RecursionError:
        return NodeFile(path, error="nests too deeply to be read", hint="fix the file, then restart dockerd")
    except (UnicodeDecodeError, ValueError) as err:
        return NodeFile(
            path,
            error=f"is not valid JSON ({err}), so dockerd refuses to start",
            hint="fix the file, then restart dockerd",
        )
    if not isinstance(data, dict):
        return NodeFile(
            path, error="is not a JSON object, so dockerd refuses to start", hint="fix the file, then restart dockerd"
        )
    return NodeFile(path, data)


def read_toolkit_config(path: str = TOOLKIT_CONFIG) -> NodeFile:
    raw, failed = _read(path)
    if failed is not None:
        return failed
    assert raw is not None
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the host extra installs tomli there
        import tomli as tomllib
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except RecursionError:
        return NodeFile(
            path, error="nests too deeply to be read", hint="fix the file (`nvidia-ctk config` rewrites it)"
        )
    except (UnicodeDecodeError, ValueError) as err:
        return NodeFile(
            path,
            error=f"is not valid TOML ({err}), so the NVIDIA hook fails every GPU container",
            hint="fix the file (`nvidia-ctk config` rewrites it)",
        )
    return NodeFile(path, data)


def _check_resources(
    dj: NodeFile, resources: Sequence[GenericResource], cards: Sequence[Card], kind: str
) -> list[Finding]:
    out: list[Finding] = []
    kinds = gpu_kinds(resources)
    given: dict[str, Target] = {}  # NVML's UUID of each card or MIG device advertised
    for r in resources:
        gpuish = r.kind in kinds or r.kind == kind or "GPU" in r.kind.upper()
        if r.discrete:
            if gpuish:
                out.append(
                    Finding(
                        dj.path,
                        f"{r.term} is a count, not a card: each task then gets "
                        f"{env_var(r.kind)}=<its count>, which the runtime reads as a card index, so "
                        "tasks share cards",
                        f"advertise one {r.kind}=<UUID> per card; {_REGENERATE}",
                    )
                )
            continue
        if not names_a_gpu(r.value):
            if gpuish:
                out.append(
                    Finding(
                        dj.path,
                        f"{r.term} names no card by UUID: the runtime would read "
                        f"{r.value!r} as an index or a bus id, which can mean another card after a "
                        f"reboot",
                        _REGENERATE,
                    )
                )
            continue
        if not is_full_uuid(r.value):
            out.append(
                Finding(
                    dj.path,
                    f"{r.term} is a UUID prefix: the runtime takes only full UUIDs, so a task given it fails to start",
                    _REGENERATE,
                )
            )
            continue
        a = lookup(r.value, cards)
        if a is None:
            known = ", ".join(c.uuid for c in cards if c.uuid) or "none"
            unread = [f"index {c.index} ({c.error})" for c in cards if c.uuid is None]
            hint = (
                f"NVML cannot read {', '.join(unread)}: it may be that card; see `nvidia-smi`"
                if unread
                else f"was this list copied from another node? {_REGENERATE}"
            )
            out.append(Finding(dj.path, f"{r.term}: no such card or MIG device on this host (cards: {known})", hint))
            continue
        if a.uuid in given:
            out.append(
                Finding(
                    dj.path,
                    f"{a.uuid} is advertised twice: Swarm can give it to two tasks at once",
                    "list each card once",
                )
            )
            continue
        given[a.uuid] = a
        if a.mig is None and a.card.mig_mode:
            migs = ", ".join(m.uuid for m in a.card.mig_devices) or "none configured"
            out.append(
                Finding(
                    dj.path,
                    f"{r.term} is a card in MIG mode, which is no CUDA device: a task given "
                    f"it sees none of its MIG devices ({migs})",
                    f"advertise its MIG devices instead; {_REGENERATE}",
                )
            )
    for a in given.values():
        if a.mig is not None and a.card.uuid in given:
            out.append(
                Finding(
                    dj.path,
                    f"both {a.card.uuid} and its MIG device {a.mig.uuid} are advertised: two "
                    "tasks would share the card",
                    f"advertise the MIG devices only; {_REGENERATE}",
                )
            )
    adverts, skipped = advertisable(cards)
    for a in adverts:
        if a.uuid not in given:
            out.append(
                Finding(
                    dj.path,
                    f"{a.describe()} is not advertised: Swarm never gives it to a task",
                    f'add "{kinds[0] if kinds else kind}={a.uuid}" unless it is kept out on purpose',
                    WARNING,
                )
            )
    for card, why in skipped:
        if card.error is not None:
            out.append(
                Finding(
                    dj.path,
                    f"the card at index {card.index} is not usable: {why}",
                    "see `nvidia-smi`; a lost card needs a reset or a reboot",
                    WARNING,
                )
            )
    if not kinds:
        out.append(
            Finding(
                dj.path,
                "advertises no GPU to Swarm (no node-generic-resources naming a card)",
                "merge the daemon.json part of `hostagent swarm node-config` and restart dockerd",
            )
        )
    elif kind not in kinds:
        out.append(
            Finding(
                dj.path,
                f"advertises its cards as {', '.join(kinds)}, not {kind}: services asking "
                f"--generic-resource {kind}=1 get no task here",
                f"advertise {kind}=<UUID>, or ask services for {kinds[0]}=1",
            )
        )
    return out


def _check_runtime(dj: NodeFile, data: JSONObject) -> list[Finding]:
    default = data.get("default-runtime")
    runtimes = data.get("runtimes") if isinstance(data.get("runtimes"), dict) else {}
    assert isinstance(runtimes, dict)
    if default is not None and not isinstance(default, str):
        return [
            Finding(
                dj.path,
                f"default-runtime is {type(default).__name__ if not isinstance(default, list) else 'a list'}, "
                "not a runtime's name, so dockerd refuses to start",
                f'write it as "default-runtime": "{RUNTIME_NAME}"',
            )
        ]
    setting = (
        f'set "default-runtime": "{RUNTIME_NAME}" and "runtimes": {{"{RUNTIME_NAME}": {{"path": '
        f'"{RUNTIME_PATH}"}}}} (`nvidia-ctk runtime configure --runtime=docker --set-as-default`)'
    )
    if not default or default in _PLAIN_RUNTIMES:
        return [
            Finding(
                dj.path,
                f"default-runtime is {default or 'unset (runc)'}: a Swarm task cannot ask for "
                "--gpus, so no task gets a card unless the default runtime adds the NVIDIA hook",
                setting,
            )
        ]
    if default not in runtimes:
        return [
            Finding(dj.path, f"default-runtime {default!r} is not in runtimes, so dockerd refuses to start", setting)
        ]
    entry = runtimes[default]
    path = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(path, str) or not path:
        return [Finding(dj.path, f"runtimes.{default} has no path", setting)]
    if os.path.isabs(path):
        if not os.access(path, os.X_OK):
            return [
                Finding(
                    dj.path,
                    f"runtimes.{default}.path {path} is not an executable on this host: every task fails to start",
                    "install the NVIDIA Container Toolkit or fix the path",
                )
            ]
    elif shutil.which(path) is None:
        return [
            Finding(
                dj.path,
                f"runtimes.{default}.path {path} is not on this PATH",
                "check that dockerd's PATH finds it (the NVIDIA Container Toolkit installs it in /usr/bin)",
                WARNING,
            )
        ]
    return []


def _swarm_vars(value: str) -> list[str]:
    """The toolkit's reading of swarm-resource: comma-separated, blanks trimmed, empty entries dropped."""
    return [v.strip() for v in value.split(",") if v.strip()]


def _check_toolkit(tk: NodeFile, kinds: Sequence[str]) -> list[Finding]:
    if tk.error is not None:
        return [Finding(tk.path, tk.error, tk.hint)]
    data = tk.data or {}
    out: list[Finding] = []
    if data.get(ACCEPT_ENVVAR) is False:
        out.append(
            Finding(
                tk.path,
                f"{ACCEPT_ENVVAR} = false: the hook ignores device variables in unprivileged "
                "containers, so no Swarm task gets a card",
                "remove the line (its default is true)",
            )
        )
    raw = data.get(SWARM_RESOURCE, "")
    if not isinstance(raw, str):
        return [
            *out,
            Finding(
                tk.path,
                f"{SWARM_RESOURCE} is not a string, so the hook fails every GPU container",
                f'write it as {SWARM_RESOURCE} = "{env_var(kinds[0] if kinds else DEFAULT_KIND)}"',
            ),
        ]
    read = _swarm_vars(raw)
    for k in kinds:
        var = env_var(k)
        if var in read:
            continue
        fallback = (
            f"the runtime ignores {var} and falls back to NVIDIA_VISIBLE_DEVICES, `all` in CUDA images: "
            "every task sees every card"
        )
        if not read:
            state = "unset" + ("" if tk.exists else " (no such file: the toolkit's defaults)")
            out.append(
                Finding(
                    tk.path,
                    f"{SWARM_RESOURCE} is {state}: {fallback}",
                    f'set {SWARM_RESOURCE} = "{var}" at the top of the file',
                )
            )
        else:
            named = [r[len(SWARM_PREFIX) :] for r in read if r.startswith(SWARM_PREFIX)]
            alt = f'advertise the kind it reads ("{named[0]}=<UUID>") or ' if named else ""
            out.append(
                Finding(
                    tk.path,
                    f'{SWARM_RESOURCE} = "{raw}", but this node advertises its cards as {k} '
                    f"(tasks get {var}): {fallback}",
                    f'{alt}set {SWARM_RESOURCE} = "{var}"',
                )
            )
    return out


class CheckResult:
    __slots__ = ("cards", "daemon_json", "findings", "kind", "resources", "toolkit_config")

    def __init__(
        self,
        findings: list[Finding],
        resources: list[GenericResource],
        cards: Sequence[Card],
        kind: str,
        daemon_json: NodeFile,
        toolkit_config: NodeFile,
    ) -> None:
        self.findings = findings
        self.resources = resources
        self.cards = cards
        self.kind = kind
        self.daemon_json = daemon_json
        self.toolkit_config = toolkit_config

    @property
    def ok(self) -> bool:
        return not any(f.is_error for f in self.findings)

    def summary(self) -> str:
        kinds = gpu_kinds(self.resources)
        n = sum(1 for r in self.resources if not r.discrete and r.kind in kinds)
        runtime = (self.daemon_json.data or {}).get("default-runtime")
        warned = sum(1 for f in self.findings if f.severity == WARNING)
        return (
            f"{self.daemon_json.path}, {self.toolkit_config.path}: OK: {n} {'/'.join(kinds)} resource(s); "
            f"tasks get them as {', '.join(env_var(k) for k in kinds)}, which the {runtime} runtime reads"
            + (f" ({warned} warning(s))" if warned else "")
        )

    def to_dict(self) -> JSONObject:
        def card(r: GenericResource) -> JSONObject | None:
            a = None if r.discrete else lookup(r.value, self.cards)
            return card_json(a) if a is not None else None

        return {
            "ok": self.ok,
            "kind": self.kind,
            "paths": {"daemon_json": self.daemon_json.path, "toolkit_config": self.toolkit_config.path},
            "resources": [
                {"kind": r.kind, "value": r.value, "discrete": r.discrete, "card": card(r)} for r in self.resources
            ],
            "findings": [f.to_dict() for f in self.findings],
        }


def advertised_kind(resources: Sequence[GenericResource]) -> str:
    """The kind a node advertises its cards as (the first, when several), or GPU when none."""
    return (gpu_kinds(resources) or [DEFAULT_KIND])[0]


def check(dj: NodeFile, tk: NodeFile, cards: Sequence[Card], kind: str | None = None) -> CheckResult:
    """Every problem of a node's configuration, given the two files as read and the cards NVML sees. `kind` is
    the kind services will ask for; None: whatever kind the node advertises its cards as (GPU when none)."""
    findings: list[Finding] = []
    resources: list[GenericResource] = []
    data = dj.data or {}
    if dj.error is not None:
        findings.append(Finding(dj.path, dj.error, dj.hint))
    elif not dj.exists:
        findings.append(
            Finding(
                dj.path,
                "no such file: this node advertises no GPU to Swarm",
                "write the daemon.json part of `hostagent swarm node-config` there and restart dockerd",
            )
        )
    else:
        terms = data.get("node-generic-resources", [])
        if not isinstance(terms, list):
            findings.append(
                Finding(
                    dj.path,
                    "node-generic-resources is not a list, so dockerd refuses to start",
                    'write it as ["GPU=GPU-<uuid>", ...]',
                )
            )
        else:
            try:
                resources = parse_terms(terms)
            except GenericResourceError as err:
                findings.append(Finding(dj.path, f"{err.message}, so dockerd refuses to start", err.hint))
        if not any(f.is_error for f in findings):
            findings += _check_resources(dj, resources, cards, kind or advertised_kind(resources))
        findings += _check_runtime(dj, data)
    # With nothing advertised yet, the toolkit is checked against the kind the node should advertise.
    findings += _check_toolkit(tk, gpu_kinds(resources) or [kind or DEFAULT_KIND])
    return CheckResult(findings, resources, cards, kind or advertised_kind(resources), dj, tk)

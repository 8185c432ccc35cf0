#!/usr/bin/env python3
"""Fake NVIDIA CDI tools for the simulated GPU host: `nvidia-ctk cdi generate` and `nvidia-cdi-hook`.

`nvidia-ctk cdi generate` writes, from the topology ($FAKEGPU_TOPOLOGY), the CDI spec that the real
tool writes on a host with those cards (checked against NVIDIA/nvidia-container-toolkit's
cmd/nvidia-ctk/cdi/generate and pkg/nvcdi): kind nvidia.com/gpu; one device per card and per MIG
device under each naming strategy (index "0", MIG "0:1"; uuid "GPU-...", "MIG-..."; both by
default), plus "all"; per-device edits with the card's device nodes; common edits with
NVIDIA_VISIBLE_DEVICES=void, the control device nodes, the driver libraries as read-only bind mounts
and createContainer hooks that run `nvidia-cdi-hook` (create-symlinks, update-ldcache).

What the real spec does through the driver, the fake does through a hook: each device's edits also
carry `nvidia-cdi-hook fakegpu-expose --device UUID`, which writes the topology of exactly the
requested cards into the container (/etc/fakegpu/topology.json, where the fake libraries read it).
A container that asks for several devices gets one such hook per device; each run reads them all
from the bundle's config.json, so every run writes the same union, whatever their number or order.

Deliberate differences from the real tools: device nodes carry type, major and minor (the simulated
host has no /dev/nvidia*; 195 is nvidia's major, the dynamic nvidia-uvm and nvidia-caps majors
become 120 and 121, numbers reserved for local use that no kernel driver takes); the fault knobs
hook_expose / hook_expose_all are written into the spec (a stale spec that exposes another card);
faults.nvml_init does not stop generation, it is passed into the container.

Installed by `make fakegpu` as build/fakegpu/bin/nvidia-ctk and build/fakegpu/bin/nvidia-cdi-hook
(links to one copy in build/fakegpu/python/, beside the fakegpu_hook module it shares code with).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Optional

if TYPE_CHECKING:
    from tests.fakegpu import fakegpu_hook as fg
else:  # installed beside it in build/fakegpu/python/ (sys.path[0] is this file's folder)
    import fakegpu_hook as fg

CDI_VERSION = "0.5.0"  # what nvidia-ctk writes for these edits (the version the spec's features need)
NVIDIA_MAJOR = 195
UVM_MAJOR = 120  # a real host's nvidia-uvm major is dynamic
CAPS_MAJOR = 121  # likewise nvidia-caps (MIG access)
STRATEGIES = ("index", "uuid", "type-index")
HOOK_NAME = "nvidia-cdi-hook"
# A CDI vendor is a domain name, a class a plain name (container-device-interface's parser rules).
_VENDOR = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?")

Edits = dict[str, Any]


class UsageError(Exception):
    """Bad arguments or input: one line on stderr, exit 1 (as the real CLIs exit)."""


# ----------------------------------------------------------------- generate ----


def node(path: str, major: int, minor: int) -> dict[str, Any]:
    return {"path": path, "type": "c", "major": major, "minor": minor}


def mig_cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """The nvidia-cap minors of a GPU instance's and a compute instance's access files, laid out as the
    driver's /proc/driver/nvidia-caps/mig-minors table lists them (config 1, monitor 2, then per card
    minor 15 GPU instances of one GI line and 8 CI lines each); the fake's model, not measured."""
    gi_access = 3 + (gpu_minor * 15 + gi) * 9
    return gi_access, gi_access + 1 + ci


class Generator:
    """One topology as `nvidia-ctk cdi generate` sees it through NVML."""

    def __init__(
        self, topology: fg.Topology, topology_path: str, hook_path: str, lib_src: Path, hook_env: Sequence[str]
    ) -> None:
        self.topology = topology
        self.topology_path = topology_path
        self.hook_path = hook_path
        self.lib_src = lib_src
        self.hook_env = list(hook_env)
        self.gpus = fg.nvml_order(topology)
        self.minors = fg.minor_numbers(topology)

    def hook(self, *args: str, env: Sequence[str] = ()) -> dict[str, Any]:
        entry: dict[str, Any] = {"hookName": "createContainer", "path": self.hook_path, "args": [HOOK_NAME, *args]}
        if env:
            entry["env"] = list(env)
        return entry

    def device_edits(self, sel: fg.Selection) -> Edits:
        """The edits of a device that exposes `sel` (after the topology's hook_* faults)."""
        sel = fg.apply_faults(self.topology, sel)
        nodes: list[dict[str, Any]] = []
        for gpu in self.gpus:
            minor = self.minors[gpu["uuid"]]
            migs = [(j, d) for j, d in enumerate(fg.mig_devices(gpu)) if d["uuid"] in sel.migs]
            if gpu["uuid"] in sel.gpus or migs:
                nodes.append(node(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor))
            for j, d in migs:
                gi = int(d.get("gpu_instance_id", j + 1))
                for cap in mig_cap_minors(minor, gi, int(d.get("compute_instance_id", 0))):
                    nodes.append(node(f"/dev/nvidia-caps/nvidia-cap{cap}", CAPS_MAJOR, cap))
        devices = [arg for uuid in sel.gpus + sel.migs for arg in ("--device", uuid)]
        env = [f"FAKEGPU_TOPOLOGY={self.topology_path}", *self.hook_env]
        return {"deviceNodes": nodes, "hooks": [self.hook("fakegpu-expose", *devices, env=env)]}

    def devices(self, strategies: Sequence[str]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def add(names: Mapping[str, str], sel: fg.Selection) -> None:
            edits = self.device_edits(sel)
            for strategy in strategies:
                out.append({"name": names[strategy], "containerEdits": edits})

        for i, gpu in enumerate(self.gpus):
            add({"index": str(i), "uuid": gpu["uuid"], "type-index": f"gpu{i}"}, fg.Selection(gpus=[gpu["uuid"]]))
        for i, gpu in enumerate(self.gpus):
            for j, d in enumerate(fg.mig_devices(gpu)):
                add(
                    {"index": f"{i}:{j}", "uuid": d["uuid"], "type-index": f"mig{i}:{j}"},
                    fg.Selection(migs=[d["uuid"]]),
                )
        out.append({"name": "all", "containerEdits": self.device_edits(fg.resolve_devices(self.topology, "all"))})
        return out

    def common_edits(self) -> Edits:
        version = str(self.topology.get("driver_version", "580.159.04"))
        libdir = "/" + fg.library_dir()
        mounts = [
            {
                "hostPath": str(self.lib_src / name),
                "containerPath": f"{libdir}/{name.rsplit('.so.', 1)[0]}.so.{version}",
                "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
            }
            for name in fg.LIBRARIES
        ]
        return {
            "env": [f"NVIDIA_CTK_LIBCUDA_DIR={libdir}", "NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                node("/dev/nvidia-modeset", NVIDIA_MAJOR, 254),
                node("/dev/nvidia-uvm", UVM_MAJOR, 0),
                node("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
                node("/dev/nvidiactl", NVIDIA_MAJOR, 255),
            ],
            "hooks": [
                self.hook("create-symlinks", "--link", f"libcuda.so.1::{libdir}/libcuda.so", env=self.hook_env),
                self.hook("update-ldcache", "--folder", libdir, env=self.hook_env),
            ],
            "mounts": mounts,
        }

    def spec(self, vendor: str, cls: str, strategies: Sequence[str]) -> dict[str, Any]:
        return {
            "cdiVersion": CDI_VERSION,
            "kind": f"{vendor}/{cls}",
            "devices": self.devices(strategies),
            "containerEdits": self.common_edits(),
        }


def to_yaml(value: Any, indent: int = 0) -> list[str]:
    """Block-style YAML for dicts, lists, strings (double-quoted: JSON's escapes are YAML's) and ints."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = to_yaml(item, indent + 2)
                lines.append(f"{pad}- {inner[0].lstrip()}")
                lines.extend(inner[1:])
            else:
                lines.append(f"{pad}- {scalar(item)}")
    else:
        lines.append(pad + scalar(value))
    return lines


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(str(value))


def write_atomically(path: Path, text: str) -> None:
    """A CDI-enabled daemon watches the spec folder: it must never read a half-written spec."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}. HINT: {self.prog} --help")


def ctk_main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    parser = Parser(prog="nvidia-ctk", description="Fake NVIDIA Container Toolkit CLI (the simulated GPU host).")
    commands = parser.add_subparsers(dest="command", metavar="cdi", required=True)
    cdi = commands.add_parser("cdi", help="CDI specifications")
    cdi_commands = cdi.add_subparsers(dest="cdi_command", metavar="generate", required=True)
    gen = cdi_commands.add_parser(
        "generate",
        help="write the CDI spec for the cards of $FAKEGPU_TOPOLOGY",
        description="Write the CDI spec that `nvidia-ctk cdi generate` writes on a host with the cards of "
        "$FAKEGPU_TOPOLOGY (default /etc/fakegpu/topology.json).",
    )
    gen.add_argument("--output", default="", help="the spec file (default: stdout); .json or .yaml sets the format")
    gen.add_argument("--format", choices=("yaml", "json"), help="the output format (default: yaml)")
    gen.add_argument(
        "--device-name-strategy",
        action="append",
        choices=STRATEGIES,
        dest="strategies",
        help="how devices are named; repeat for several (default: index and uuid)",
    )
    gen.add_argument("--vendor", "--cdi-vendor", default="nvidia.com", help="the spec's vendor (nvidia.com)")
    gen.add_argument("--class", "--cdi-class", default="gpu", dest="cls", help="the spec's class (gpu)")
    gen.add_argument(
        "--nvidia-cdi-hook-path",
        default="",
        help="the hook the spec runs (default: the nvidia-cdi-hook beside this program)",
    )
    try:
        args = parser.parse_args(argv[1:])
        if not _VENDOR.fullmatch(args.vendor) or not _CLASS.fullmatch(args.cls):
            raise UsageError(
                f"invalid CDI kind {args.vendor}/{args.cls}. HINT: a vendor like nvidia.com, a class like gpu"
            )
        output = Path(args.output) if args.output else None
        fmt = args.format or ("json" if output and output.suffix.lower() == ".json" else "yaml")
        path = env.get("FAKEGPU_TOPOLOGY") or fg.DEFAULT_TOPOLOGY
        if not os.path.isfile(path):
            raise UsageError(
                f"failed to generate CDI spec: no topology at {path}. "
                "HINT: set FAKEGPU_TOPOLOGY to a file of tests/fakegpu/scenarios"
            )
        try:
            topology = fg.load_topology(path, prog="failed to generate CDI spec")
        except fg.HookError as e:
            raise UsageError(str(e)) from None
        hook_path = args.nvidia_cdi_hook_path or str(Path(argv[0]).absolute().parent / HOOK_NAME)
        hook_env = [f"FAKEGPU_HOOK_LOG={env['FAKEGPU_HOOK_LOG']}"] if env.get("FAKEGPU_HOOK_LOG") else []
        generator = Generator(topology, str(Path(path).resolve()), hook_path, fg.library_source(env), hook_env)
        try:
            spec = generator.spec(args.vendor, args.cls, args.strategies or ["index", "uuid"])
        except fg.HookError as e:  # a hook_expose fault that names no card
            raise UsageError(f"failed to generate CDI spec: {e}") from None
        text = json.dumps(spec, indent=2) + "\n" if fmt == "json" else "\n".join(["---", *to_yaml(spec)]) + "\n"
        if output is None:
            sys.stdout.write(text)
        else:
            try:
                write_atomically(output, text)
            except OSError as e:
                raise UsageError(
                    f"failed to save CDI spec to {output}: {e.strerror}. "
                    "HINT: --output names a file in a folder that exists"
                ) from None
        return 0
    except UsageError as e:
        print(f"nvidia-ctk: ERROR: {e}", file=sys.stderr)
        return 1


# --------------------------------------------------------------------- hook ----


def fakegpu_devices(config: Mapping[str, Any]) -> list[str]:
    """The --device values of every fakegpu-expose hook the runtime will run for this container."""
    hooks = (config.get("hooks") or {}).get("createContainer") or []
    out: list[str] = []
    for hook in hooks:
        args = (hook.get("args") or []) if isinstance(hook, dict) else []
        if len(args) > 1 and os.path.basename(str(hook.get("path", ""))) == HOOK_NAME and args[1] == "fakegpu-expose":
            out.extend(str(v) for flag, v in zip(args[2:], args[3:]) if flag == "--device")
    return out


def hook_main(argv: Sequence[str], env: Mapping[str, str], stdin_text: Optional[str] = None) -> int:
    parser = Parser(
        prog=HOOK_NAME,
        description="Fake nvidia-cdi-hook: run by the container runtime as a CDI "
        "spec's createContainer hook, with the OCI state on stdin.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    links = commands.add_parser("create-symlinks", help="create links in the container's root file system")
    links.add_argument("--link", action="append", default=[], help="TARGET::LINK")
    ldcache = commands.add_parser("update-ldcache", help="run ldconfig on the container's root file system")
    ldcache.add_argument("--folder", action="append", default=[], help="a folder with libraries")
    expose = commands.add_parser("fakegpu-expose", help="write the topology of the requested cards into the container")
    expose.add_argument("--device", action="append", default=[], help="a card or MIG device UUID")
    record: dict[str, Any] = {"time": time.time(), "command": " ".join(argv[1:2])}
    try:
        args = parser.parse_args(argv[1:])
        bundle = fg.load_bundle(sys.stdin.read() if stdin_text is None else stdin_text, HOOK_NAME)
        record.update(container_id=bundle.container_id, rootfs=str(bundle.rootfs))
        if args.command == "create-symlinks":
            for spec in args.link:
                target, sep, link = spec.partition("::")
                if not sep or not target or not link.startswith("/"):
                    raise UsageError(f"--link {spec}: want TARGET::/ABSOLUTE/LINK")
                where = fg.resolve_in_root(bundle.rootfs, os.path.dirname(link))
                where.mkdir(parents=True, exist_ok=True)
                if not os.path.lexists(where / os.path.basename(link)):
                    os.symlink(target, where / os.path.basename(link))
        elif args.command == "update-ldcache":
            if not fg.run_ldconfig(bundle.rootfs, args.folder):
                raise UsageError(f"ldconfig failed on {bundle.rootfs}")
        else:
            asked = fakegpu_devices(bundle.config)
            record["asked"] = ",".join(asked)
            path = env.get("FAKEGPU_TOPOLOGY") or fg.DEFAULT_TOPOLOGY
            record["topology"] = path
            topology = fg.load_topology(path, prog=HOOK_NAME)
            sel = fg.resolve_devices(topology, ",".join(asked))
            record["exposed_gpus"], record["exposed_migs"] = sel.gpus, sel.migs
            record["exposed"] = [g["uuid"] for g in fg.nvml_order(topology) if g["uuid"] in sel.gpus] + sel.migs
            record["written"] = [fg.write_container_topology(bundle.rootfs, fg.container_topology(topology, sel))]
        record["status"] = "ok"
        return 0
    except (UsageError, fg.HookError, OSError) as e:
        message = str(e) if isinstance(e, fg.HookError) else f"{HOOK_NAME}: ERROR: {e}"
        record["status"], record["error"] = "error", message
        print(message, file=sys.stderr)
        return 1
    finally:
        if "container_id" in record:
            fg.log_call(env, record)


def main(argv: Sequence[str]) -> int:
    tool = os.path.basename(argv[0]) if argv else ""
    if tool == HOOK_NAME:
        return hook_main(argv, os.environ)
    if tool == "nvidia-ctk":
        return ctk_main(argv, os.environ)
    print(f"fakegpu_cdi: run me as nvidia-ctk or {HOOK_NAME} (make fakegpu links both)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The entrypoint's verification, as a library call: expectation -> NVML -> plan -> CUDA driver -> torch.

`verify(environ, level)` returns the environment the workload must get and a `Verification` report, or raises a
`GpupinError` whose exit code says why the workload must not start. It never initialises CUDA in this process:
the driver and torch are asked in child processes under exactly the returned environment.
"""

from __future__ import annotations

import subprocess
import sys

from gpupin.core.contract import EXPECT_VAR, LEVELS, LEVELS_TEXT, PROBE_TIMEOUT_VAR, seconds
from gpupin.core.errors import GpuUnavailableError, MisalignedError, UsageError, shorten
from gpupin.core.expectation import ExpectedCard, format_expect
from gpupin.entrypoint import align, sources

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# The entrypoint runs in containers and on bare hosts alike: each hint says what to do in either place.
_CUDA_HINTS = {
    -1: "no CUDA driver library (libcuda.so.1) is visible here: in a container, start it with a GPU and the "
    "`compute` driver capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility); on a host, install the NVIDIA "
    "driver; --verify nvml skips the CUDA driver",
    100: "NVML sees the expected cards but the CUDA driver does not: a card in MIG mode is no CUDA device "
    "(name one of its MIG devices, `nvidia-smi -L`), or, in a container, the `compute` driver capability is "
    "missing (NVIDIA_DRIVER_CAPABILITIES)",
    101: "the CUDA driver refused CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER as gpupin set them: report it, with "
    "`nvidia-smi -L` and the driver version",
    34: "the CUDA toolkit's stub libcuda.so is first on the library path: remove it from LD_LIBRARY_PATH",
    999: "the CUDA driver failed in an unknown way: check `nvidia-smi` and the host's `dmesg`",
}
PROBE_TIMEOUT_DEFAULT = 120.0
PROBE_TIMEOUT_MAX = 86400.0  # a day: beyond it a hung driver is no longer told apart from a slow one


def probe_timeout(environ: Mapping[str, str]) -> float:
    """GPUPIN_PROBE_TIMEOUT in seconds (empty or unset: 120); anything but a number in (0, a day] is refused, so
    that `inf`, `nan` or a typo never turns into a probe without a limit, or a limit nobody asked for."""
    raw = environ.get(PROBE_TIMEOUT_VAR, "")
    if not raw.strip():
        return PROBE_TIMEOUT_DEFAULT
    return seconds(
        raw,
        f"{PROBE_TIMEOUT_VAR}={shorten(raw)}",
        PROBE_TIMEOUT_MAX,
        f"unset it for {PROBE_TIMEOUT_DEFAULT:.0f} s, or give one like {PROBE_TIMEOUT_VAR}=300",
    )


class Verification:
    """What was verified: the plan, the level, the variables set and the ones overridden."""

    __slots__ = ("cuda_devices", "env_set", "level", "notes", "overridden", "plan", "warnings")

    def __init__(self, plan: align.Plan, level: str) -> None:
        self.plan = plan
        self.level = level
        self.env_set: dict[str, str] = {}
        self.overridden: dict[str, str] = {}  # variable -> the value it had before
        self.cuda_devices: list[align.CudaDevice] = []
        self.notes: list[str] = []
        self.warnings: list[str] = []

    def to_dict(self) -> dict[str, Any]:
        exp = self.plan.expectation
        return {
            "level": self.level,
            "expectation": str(exp) if exp else None,
            "source": exp.source if exp else None,
            "source_detail": exp.detail if exp else None,
            "devices": [
                {
                    "local_rank": b.local_rank,
                    "cuda": f"cuda:{b.local_rank}",
                    "uuid": b.uuid,
                    "bus_id": str(b.bus_id) if b.bus_id else None,
                    "name": b.name,
                    "minor_number": b.card.minor_number if b.card else None,
                    "note": b.expected.note if b.expected else None,
                }
                for b in self.mapping()
            ],
            "set": self.env_set,
            "overridden": self.overridden,
            "notes": self.notes,
            "warnings": self.warnings,
        }

    def mapping(self) -> list[align.Binding]:
        """cuda:k -> card: the plan's bindings, or, with no expectation, what the driver enumerated."""
        if self.plan.expectation is not None or not self.cuda_devices:
            return self.plan.bindings
        by_hex = {align.uuid_hex(b.uuid): b for b in self.plan.bindings}
        out = []
        for d in self.cuda_devices:
            b = by_hex.get(d.uuid_hex)
            out.append(align.Binding(d.k, b.uuid if b else "UUID " + d.uuid_hex, d.bus_id, d.name))
        return out


def _run_child(args: list[str], env: Mapping[str, str], what: str) -> str:
    timeout = probe_timeout(env)
    try:
        done = subprocess.run(args, env=dict(env), capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # subprocess.run has killed the child
        raise GpuUnavailableError(
            f"{what} did not answer within {timeout:g} s",
            f"the driver hangs: check `nvidia-smi` on the host ({PROBE_TIMEOUT_VAR} sets the limit)",
        ) from None
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise GpuUnavailableError(
            f"{what} failed (exit {done.returncode}): {tail[0][:300]}",
            "check `nvidia-smi` here; --verify nvml skips the driver probe",
        )
    return done.stdout.decode(errors="replace")


def _cuda_devices(env: Mapping[str, str], pinned: bool) -> list[align.CudaDevice]:
    """What the CUDA driver enumerates under `env`; `pinned`: gpupin wrote CUDA_VISIBLE_DEVICES (else it is the
    inherited value, or none)."""
    from gpupin.entrypoint import cudaprobe

    # -I -S: the probe needs only the standard library, and skipping site saves most of a Python start-up.
    text = _run_child([sys.executable, *cudaprobe.CHILD_ARGS], env, "the CUDA driver probe")
    result = cudaprobe.from_lines(text)
    rc = result["rc"]
    if rc is None:
        raise GpuUnavailableError(
            f"the CUDA driver probe printed nothing usable: {text[:200]!r}",
            "check `nvidia-smi` here; --verify nvml skips the driver probe",
        )
    if rc != 0:
        name, msg = result["error"]
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        under = f"CUDA_VISIBLE_DEVICES={shorten(cvd)}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
        hint = _CUDA_HINTS.get(rc)
        if not pinned and cvd is not None and rc in (100, 101):
            hint = (
                "with no expectation gpupin leaves CUDA_VISIBLE_DEVICES as the image or caller set it, and the "
                "CUDA driver finds no usable device under it: unset or fix it, or pin the container "
                "(GPUPIN_EXPECT, --gpus device=UUID)"
            )
        raise GpuUnavailableError(f"cuInit failed with {name} ({rc}): {msg} (under {under})", hint)
    return [align.CudaDevice.from_probe(d) for d in result["devices"]]


def _torch_devices(env: Mapping[str, str], ver: Verification) -> list[align.CudaDevice]:
    from gpupin.entrypoint import torchprobe

    text = _run_child([sys.executable, torchprobe.__file__], env, "the torch probe")
    result = torchprobe.from_lines(text)
    if result["error"]:
        raise GpuUnavailableError(
            f"torch could not describe its devices: {result['error'][:300]}",
            "use --verify cuda, or install torch where the workload runs",
        )
    if result["missing"]:
        ver.warnings.append(
            f"torch {result['version']} lacks {', '.join(result['missing'])} in get_device_properties: "
            "the torch level compared what it has; the CUDA driver level proved the rest"
        )
    return [align.CudaDevice(d["k"], d["uuid_hex"], d["bus_id"], d["name"]) for d in result["devices"]]


def _set(env: dict[str, str], ver: Verification, key: str, value: str) -> None:
    old = env.get(key)
    if old is not None and old != value:
        ver.overridden[key] = old
    env[key] = value
    ver.env_set[key] = value


def verify(
    environ: Mapping[str, str], level: str = "cuda", require: bool = False
) -> tuple[dict[str, str], Verification]:
    """Verify that every cuda:k will be expectation k; return the workload's environment and the report."""
    if level not in LEVELS:
        raise UsageError(f"unknown verification level {shorten(level)}", f"use {LEVELS_TEXT}")
    probe_timeout(environ)  # a malformed limit is refused at every level, before anything runs
    found = sources.find(environ)
    expectation = found.expectation
    if expectation is None and require:
        raise MisalignedError(
            f"no expectation ({found.why_unpinned()}), but an expectation is required",
            "set GPUPIN_EXPECT=UUID[@BUSID] (`hostagent run` and `hostagent compose render` give a container one, "
            "through CDI too; so does `docker run --gpus device=UUID`)",
        )
    cards = found.context.cards()
    plan = align.plan(expectation, cards)
    if expectation is not None and expectation.sole is not None:
        align.check_sole(plan, cards)
    ver = Verification(plan, level)
    env = dict(environ)
    _set(env, ver, "CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if plan.cuda_visible_devices is not None:
        _set(env, ver, "CUDA_VISIBLE_DEVICES", plan.cuda_visible_devices)
        # The resolved expectation travels on, so that assert_pinned() in the workload checks the same cards.
        _set(env, ver, EXPECT_VAR, format_expect(ExpectedCard(b.uuid, b.bus_id) for b in plan.bindings))
        ver.overridden.pop(EXPECT_VAR, None)
        if plan.extra_cards:
            ver.notes.append(
                f"NVML sees {len(cards)} cards; CUDA_VISIBLE_DEVICES selects the {len(plan.bindings)} expected"
            )
    else:
        ver.notes.append(f"no expectation ({found.why_unpinned()}): running unpinned")
    if level in ("cuda", "torch"):
        ver.cuda_devices = _cuda_devices(env, plan.cuda_visible_devices is not None)
        align.check_devices(plan, ver.cuda_devices, cards, "the CUDA driver", env.get("CUDA_VISIBLE_DEVICES"))
    if level == "torch":
        align.check_devices(plan, _torch_devices(env, ver), cards, "torch", env.get("CUDA_VISIBLE_DEVICES"))
    return env, ver

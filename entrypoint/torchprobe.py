"""Ask torch what each `cuda:k` is (`torch.cuda.get_device_properties`), in a child process.

Run as `python torchprobe.py` under the workload's environment; prints tab-separated lines:

    torch    <version>
    missing  <comma-separated property names this torch lacks>
    dev      <k>  <uuid hex>  <pci bus id or ->  <name>
    error    <text>

torch gives `uuid` without the `GPU-` tag and the PCI address as integers (`pci_domain_id`, `pci_bus_id`,
`pci_device_id`); old releases lack some of them, which is reported, not guessed. Imports nothing from gpupin.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PCI = ("pci_domain_id", "pci_bus_id", "pci_device_id")


def identify(p: Any) -> tuple[str, tuple[int, int, int] | None]:
    """(UUID hex without tag or dashes, or ""; (PCI domain, bus, device) or None) of one device's properties."""
    uuid = str(getattr(p, "uuid", "")).replace("-", "").lower()
    if uuid[:3] in ("gpu", "mig"):
        uuid = uuid[3:]
    pci = (p.pci_domain_id, p.pci_bus_id, p.pci_device_id) if all(hasattr(p, f) for f in _PCI) else None
    return uuid, pci


def probe_lines() -> str:
    try:
        import torch
    except Exception as err:  # an ImportError, or a broken install raising anything
        return f"error\timport torch failed: {err}\n"
    lines = [f"torch\t{torch.__version__}"]
    try:
        count = torch.cuda.device_count()
        props = [torch.cuda.get_device_properties(k) for k in range(count)]
    except Exception as err:
        return "\n".join([*lines, f"error\t{type(err).__name__}: {err}"]) + "\n"
    missing = [f for f in ("uuid", *_PCI) if props and not hasattr(props[0], f)]
    if missing:
        lines.append("missing\t" + ",".join(missing))
    for k, p in enumerate(props):
        uuid, pci = identify(p)
        bus = f"{pci[0]:08X}:{pci[1]:02X}:{pci[2]:02X}.0" if pci else "-"
        lines.append("\t".join(("dev", str(k), uuid or "-", bus, str(p.name).replace("\t", " "))))
    return "\n".join(lines) + "\n"


def from_lines(text: str) -> dict[str, Any]:
    from gpupin.entrypoint.align import parse_cuda_bus

    out: dict[str, Any] = {"version": None, "missing": [], "devices": [], "error": None}
    for line in text.splitlines():
        f = line.split("\t")
        if f[0] == "torch" and len(f) > 1:
            out["version"] = f[1]
        elif f[0] == "missing" and len(f) > 1:
            out["missing"] = f[1].split(",")
        elif f[0] == "error":
            out["error"] = "\t".join(f[1:])
        elif f[0] == "dev" and len(f) >= 5:
            out["devices"].append(
                {
                    "k": int(f[1]),
                    "uuid_hex": "" if f[2] == "-" else f[2],
                    "bus_id": None if f[3] == "-" else parse_cuda_bus(f[3]),
                    "name": f[4],
                }
            )
    if out["version"] is None and out["error"] is None:
        out["error"] = f"the torch probe printed nothing usable: {text[:200]!r}"
    return out


if __name__ == "__main__":
    sys.stdout.write(probe_lines())

"""`hostagent ls --format TEMPLATE`: one line per card, for scripts, from Python str.format fields that name keys
of the card's `--json` object. The fields are checked before anything is read (a Go template is refused), and
every text goes through the one rule for a value from elsewhere (gpupin.core.errors.shown), so a line stays one
line and holds no terminal escape (docs/ls.md).
"""

from __future__ import annotations

import difflib
import re
import string

from gpupin.core.errors import UsageError, shown
from gpupin.hostagent.ls.view import CELL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_WIDTH = 1000  # characters: a field's width or precision (`{name:>999999999}` would take gigabytes per line)

# name -> (kind, what it is). Kinds: int, float, text, bool, list (joined by commas). The table of --help.
FIELDS: dict[str, tuple[str, str]] = {
    "index": ("int", "NVML index, as nvidia-smi numbers the card"),
    "uuid": ("text", "the card's UUID"),
    "bus_id": ("text", "PCI bus id (00000000:3B:00.0)"),
    "name": ("text", "model name"),
    "memory_used_mib": ("int", "memory used, MiB"),
    "memory_total_mib": ("int", "memory in all, MiB"),
    "memory_free_mib": ("int", "memory free, MiB"),
    "utilization_gpu": ("int", "GPU utilization, percent"),
    "temperature_c": ("int", "GPU temperature, degrees C"),
    "power_draw_w": ("float", "power draw, W"),
    "power_limit_w": ("float", "enforced power limit, W"),
    "compute_capability": ("text", "CUDA compute capability (8.0)"),
    "compute_processes": ("int", "how many compute processes run on it"),
    "processes": ("list", "the pids of its compute and graphics processes"),
    "mig_mode": ("bool", "MIG mode on"),
    "mig_devices": ("list", "its MIG devices' UUIDs"),
    "held": (
        "bool",
        "a container holds it (or one of its MIG devices) or a process uses it; N/A when that is "
        "unknown (Docker unavailable, or NVML will not list its processes): never read N/A as free",
    ),
    "shared": ("bool", "held only by containers started with --share"),
    "busy": ("bool", "a process of the host, or of a container not given it, uses it"),
    "state": ("text", "free, held, shared, busy or unknown"),
    "unknown": ("text", "why who uses it is unknown, else N/A"),
    "holders": ("list", "names of the containers that hold it"),
    "mislabelled": ("list", "names of containers labelled for it that hold other cards"),
    "error": ("text", "why NVML cannot read it (a lost card), else N/A"),
    "healthy": (
        "bool",
        "fit for use: no critical XID seen, no uncorrectable ECC error, no memory repair pending "
        "or failed, not lost; N/A when NVML cannot say",
    ),
    "health_reasons": ("list", "why it is unhealthy (or its health unknown), e.g. XID 79 (fallen off the bus)"),
    "health_since": ("text", "when it was first seen unhealthy, where known (an XID), else N/A"),
    "hostname": ("text", "this host's name"),
    "driver_version": ("text", "the NVIDIA driver's version"),
    "cuda_driver_version": ("text", "the CUDA version the driver supports"),
}
_HOST_FIELDS = ("hostname", "driver_version", "cuda_driver_version")
# What Docker alone tells (held and the others are null when who uses the card is unknown).
_LEDGER_FIELDS = ("holders", "mislabelled")
_HEALTH_FIELDS = {"healthy": "healthy", "health_reasons": "reasons", "health_since": "since"}  # in card["health"]
_SAMPLES = {"int": 0, "float": 0.0, "text": "x", "bool": "true", "list": "x"}
_ESCAPES = {"\\t": "\t", "\\n": "\n", "\\\\": "\\"}
_GO_TEMPLATE = re.compile(r"\{\{\s*(?:json\s+)?\.")

HELP = (
    "one line per card from Python str.format fields, e.g. '{index} {uuid} {held}' or "
    "'{index:>2} {name:<24} {memory_used_mib:>6} MiB' (\\t and \\n are a tab and a newline; fields below)"
)


def fields_help(width: int = 24) -> str:
    """The fields, one a line, for --help."""
    return "".join(f"  {name:<{width}} {what}\n" for name, (_, what) in FIELDS.items())


def _text_spec(spec: str, numeric: bool) -> str:
    """The fill, alignment and width of a format spec: what still applies to N/A (right-aligned where numbers
    are, so that a column stays a column)."""
    m = re.match(r"(?:(.)?([<>^=]))?[-+ ]?z?#?0?(\d+)?", spec)
    fill, align, width = m.groups() if m else (None, None, None)
    if not width:
        return ""
    if align in (None, "="):
        align = ">" if numeric else "<"
    return f"{fill or ''}{align}{width}"


class Template:
    """A checked --format template; `render(listing)` gives its lines."""

    def __init__(self, text: str) -> None:
        if _GO_TEMPLATE.search(text):
            raise UsageError(
                f"--format {text!r} is a Go template; hostagent's --format takes Python str.format fields",
                "write {index} where docker writes {{.Index}}, e.g. --format "
                "'{index} {uuid} {held}' (the fields: hostagent ls --help)",
            )
        self.text = re.sub(r"\\\\|\\t|\\n", lambda m: _ESCAPES[m.group(0)], text)
        try:
            parsed = list(string.Formatter().parse(self.text))
        except ValueError as err:
            raise UsageError(f"--format {text!r}: {err}", "write {{ and }} for a literal brace") from None
        self.fields: list[str] = []
        for _literal, field, spec, conversion in parsed:
            if field is None:
                continue
            self._check(text, field, spec or "", conversion)
            self.fields.append(field)

    @staticmethod
    def _check(text: str, field: str, spec: str, conversion: str | None) -> None:
        if not field or field.isdigit():
            raise UsageError(
                f"--format {text!r}: {{{field}}} names no field",
                "name one: {index}, {uuid}, ... (the fields: hostagent ls --help)",
            )
        if field not in FIELDS:
            close = difflib.get_close_matches(field.split(".")[0].split("[")[0], list(FIELDS), n=1)
            hint = (
                f"did you mean {{{close[0]}}}? `hostagent ls --help` lists the fields"
                if close
                else f"the fields: {', '.join(FIELDS)}"
            )
            raise UsageError(f"--format {text!r}: unknown field {{{field}}}", hint)
        if "{" in spec:
            raise UsageError(
                f"--format {text!r}: {{{field}:{spec}}}: a format spec cannot hold a field",
                "write the width as a number: {name:<24}",
            )
        if any(len(n) > 4 or int(n) > MAX_WIDTH for n in re.findall(r"\d+", spec)):
            raise UsageError(
                f"--format {text!r}: {{{field}:{spec}}}: a width or precision above {MAX_WIDTH}",
                f"give a width of at most {MAX_WIDTH} characters, e.g. {{name:<24}}",
            )
        sample = _SAMPLES[FIELDS[field][0]]
        try:
            format(string.Formatter().convert_field(sample, conversion), spec)
        except (ValueError, TypeError) as err:
            raise UsageError(
                f"--format {text!r}: {{{field}:{spec}}}: {err}",
                "str.format's spec: [[fill]align][width][.precision][type], e.g. {name:<24}",
            ) from None

    def render(self, listing: dict[str, Any]) -> str:
        out = []
        for card in listing["gpus"]:
            values = {name: _value(name, card, listing) for name in self.fields}
            out.append(_Formatter().vformat(self.text, (), values) + "\n")
        return "".join(out)


class _NotAvailable(str):
    """N/A where a value is missing: formatted with the spec's fill, alignment and width only."""

    numeric = False


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        if isinstance(value, _NotAvailable):
            return format(str(value), _text_spec(format_spec, value.numeric))
        return format(value, format_spec)


def _value(name: str, card: dict[str, Any], listing: dict[str, Any]) -> Any:
    value = listing.get(name) if name in _HOST_FIELDS else card.get(name)
    if name in _HEALTH_FIELDS:
        value = (card.get("health") or {}).get(_HEALTH_FIELDS[name])
    kind = FIELDS[name][0]
    if name in _LEDGER_FIELDS and not listing["docker"]["available"]:
        value = None  # unknown, not "free": the JSON says so under "docker"; a line must say so itself
    if value is None:
        na = _NotAvailable("N/A")
        na.numeric = kind in ("int", "float")
        return na
    if kind == "bool":
        return "true" if value else "false"
    if kind == "list":
        if name == "holders":
            items = sorted(h["name"] for h in value if h["holds"])
        elif name == "mislabelled":
            items = sorted(h["name"] for h in value)
        elif name == "mig_devices":
            items = [m["uuid"] for m in value]
        elif name == "health_reasons":
            items = value
        else:  # processes
            items = [p["pid"] for p in value]
        return ",".join(shown(i, CELL) if isinstance(i, str) else str(i) for i in items)
    return shown(value, CELL) if isinstance(value, str) else value

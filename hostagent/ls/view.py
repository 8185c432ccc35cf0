"""How `hostagent ls` looks on a terminal: the table, its colours, and `--watch`'s redraw in place. One block per
card, as gpustat lays it out: the card's line, its identity and health, its MIG devices, then its holders and
processes. Plain ASCII, so the table reads the same under any locale; colour only adds escape codes around the
same text, under the usual rules (NO_COLOR, TERM=dumb, `--color`).
"""

from __future__ import annotations

import os
import sys
import time

from gpupin.core.errors import shown
from gpupin.hostagent.ledger.booking import format_duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, TextIO

# ANSI SGR codes.
BOLD, DIM, RED, GREEN, YELLOW, BLUE, MAGENTA, CYAN = "1", "2", "31", "32", "33", "34", "35", "36"
HOT_C, WARM_C = 80, 60  # temperature thresholds: red from HOT_C, yellow from WARM_C
NA = "N/A"
CELL = 500  # a value shown longer than this is cut (gpupin.core.errors.shown says how long it was)
SHOWN_IDLE = 3  # pinned containers that hold nothing: named up to this many, then counted


def use_color(mode: str, stream: TextIO) -> bool:
    """Whether to colour output to `stream` for --color MODE (auto, always, never)."""
    if mode in ("always", "never"):
        return mode == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


class Cell:
    """A table cell: its text, its SGR codes (`;`-joined, empty for none), whether it is right-aligned, and the
    blanks between it and the next cell. `parts` ((text, codes), ...) colour pieces of a row's free-text end."""

    __slots__ = ("gap", "parts", "right", "style", "text")

    def __init__(
        self, text: str, style: str = "", right: bool = False, gap: int = 2, parts: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.text = "".join(t for t, _ in parts) if parts else text
        self.style = style
        self.right = right
        self.gap = gap
        self.parts = parts

    def painted(self, color: bool) -> str:
        if self.parts:
            return "".join(_paint(t, style, color) for t, style in self.parts)
        return _paint(self.text, self.style, color)


Row = list[Cell]
LABEL_WIDTH = len("not holding")  # the widest of the labels before a card's holders, processes, ...


def _lines(rows: Sequence[Row], color: bool, indent: str = "") -> list[str]:
    """Rows as aligned lines: each column as wide as its widest cell, `gap` blanks apart, no trailing blanks.
    A row's last cell is never padded, so that one long free-text end does not push the others."""
    widths: list[int] = []
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            if i == len(widths):
                widths.append(0)
            widths[i] = max(widths[i], len(cell.text))
    out = []
    for row in rows:
        parts = []
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            pad = "" if last else " " * (widths[i] - len(cell.text))
            text = cell.painted(color)
            parts.append(pad + text if cell.right else text + pad)
            if not last:
                parts.append(" " * cell.gap)
        out.append((indent + "".join(parts)).rstrip())
    return out


def _section(label: str, rows: Sequence[Row], color: bool, indent: str, style: str = DIM) -> list[str]:
    """A labelled group of rows under a card (held by, process, ...): the label on the first, columns aligned
    within the group."""
    lines = _lines(rows, color)
    blank = " " * LABEL_WIDTH
    head = _paint(label, style, color) + " " * (LABEL_WIDTH - len(label))
    return [(indent + (head if n == 0 else blank) + "  " + line).rstrip() for n, line in enumerate(lines)]


def _text(value: object) -> str:
    """A value a user or a container chose (a name, a label, a command), as the one rule shows it: as itself when
    it prints on one line, else escaped (a label's ESC [ 2 J must not clear the reader's screen)."""
    return NA if value is None else shown(value, CELL)


def _paint(text: str, style: str, color: bool) -> str:
    return f"\x1b[{style}m{text}\x1b[0m" if color and style and text else text


def _na(value: object, suffix: str = "") -> str:
    return NA if value is None else f"{value}{suffix}"


def _figures(pairs: Sequence[tuple[object, object]], unit: str) -> list[str]:
    """`used / total unit` for each pair, both numbers right-aligned across the pairs; N/A when both are missing."""
    texts = [(_na(a), _na(b)) for a, b in pairs]
    wa = max((len(a) for a, _ in texts), default=0)
    wb = max((len(b) for _, b in texts), default=0)
    return [
        NA if (a, b) == (None, None) else f"{ta:>{wa}} / {tb:>{wb}} {unit}" for (a, b), (ta, tb) in zip(pairs, texts)
    ]


def _temperature_style(t: int | None) -> str:
    if t is None:
        return DIM
    return f"{BOLD};{RED}" if t >= HOT_C else YELLOW if t >= WARM_C else ""


_STATES = {
    "free": GREEN,
    "shared": f"{BOLD};{CYAN}",
    "held": f"{BOLD};{YELLOW}",
    "busy": f"{BOLD};{RED}",
    "unknown": DIM,
}


def _state(item: dict[str, Any]) -> Cell:
    """free, held, shared, busy or unknown (a card or a MIG device; gpupin.hostagent.ls.listing decides); UNHEALTHY
    before all (a card that is not fit for use is not free, whoever holds it: its holders are listed under it)."""
    if (item.get("health") or {}).get("healthy") is False:
        return Cell("UNHEALTHY", f"{BOLD};{RED}")
    state = item.get("state")
    if state not in _STATES:  # an agent of an earlier version (ls --host): no state of its own
        state = (
            "unknown"
            if item.get("held") is None
            else "free"
            if not item["held"]
            else ("shared" if item.get("shared") else "held")
        )
    return Cell(state, _STATES[state])


def _watts(value: float | None) -> int | None:
    return None if value is None else round(value)


def _short(name: str | None, card: str | None) -> str:
    """A MIG device's profile (`3g.20gb`) from its NVML name (`NVIDIA A100-SXM4-40GB MIG 3g.20gb`)."""
    if not name:
        return "MIG device"
    for prefix in (f"{card} MIG ", f"{card} "):
        if card and name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _holders(holders: Sequence[dict[str, Any]], color: bool, indent: str) -> list[str]:
    rows = []
    owners = any(isinstance(h.get("owner"), dict) for h in holders)  # an agent of an earlier version names none
    for h in holders:
        # A pinned holder says the way hostagent pinned it (--gpus or CDI); another says how it was started.
        how = f"gpupin via {h['via']}" if h["how"] == "gpupin" and h.get("via") else _text(h["how"])
        tail: list[tuple[str, str]] = [(how, "")]
        if h["shared"]:
            tail += [("  ", ""), ("shared", CYAN)]
        if h["mismatch"]:
            tail += [
                ("  ", ""),
                (f"MISMATCH: labelled {','.join(_text(x) for x in h['label'] or ()) or 'nothing'}", f"{BOLD};{RED}"),
            ]
        if h["why"] and h["why"] != h["state"]:
            tail += [("  ", ""), (f"holds: {_text(h['why'])}", "")]
        if h.get("warned"):  # let in by the authorization plugin under enforce mode warn
            tail += [("  ", ""), (f"let in under warn: {_text(h['warned'])}", YELLOW)]
        left = (h.get("booking") or {}).get("left_s")
        if left is not None:  # a booking with an end (hostagent run --for, or the policy's default)
            tail += [("  ", ""), (f"ends in {format_duration(left)}" if left > 0 else "booking ended", YELLOW)]
        whose = [_whose(h)] if owners else []
        rows.append([Cell(_text(h["name"]), BOLD), Cell(h["id"][:12]), Cell(h["state"]), *whose, Cell("", parts=tail)])
    return _section("held by", rows, color, indent)


def _whose(h: dict[str, Any]) -> Cell:
    """Who owns a holder: the user the agent created it for, else `unverified` (with the uid its label claims)."""
    owner = h.get("owner")
    if not isinstance(owner, dict):
        return Cell("")
    if owner.get("verified"):
        return Cell(_text(str(owner.get("name") or owner.get("uid"))))
    claimed = owner.get("claimed_uid")
    return Cell("unverified" if claimed is None else f"unverified (claims uid {_text(str(claimed))})", YELLOW)


def _mismatches(mislabelled: Sequence[dict[str, Any]], color: bool, indent: str) -> list[str]:
    rows = [
        [
            Cell(_text(h["name"]), BOLD),
            Cell(h["id"][:12]),
            Cell(h["state"]),
            Cell(f"labelled for this card, given {','.join(h['uuids']) or 'no card'}"),
        ]
        for h in mislabelled
    ]
    return _section("MISMATCH", rows, color, indent, f"{BOLD};{RED}")


def _owner(p: dict[str, Any]) -> list[tuple[str, str]]:
    """Whose a process is: its container (an ESCAPE when that container was not given the card), the host,
    unknown, one that cannot be named (its cgroup names a container it is not in), or a user's rootless container."""
    if p["owner"] == "host":
        return [("host", "")]
    if p["owner"] == "rootless" and p.get("rootless"):  # a remote host's answer may lack it
        return [(_text(p["rootless"]["whose"]), BOLD)]
    if p["owner"] == "unknown":
        return [("owner unknown", DIM)]
    if p["owner"] == "unnamed":
        return [("owner cannot be named: a cgroup named for a container it is not in", f"{BOLD};{RED}")]
    out = [(_text(p["container"]) if p["container"] else (p["container_id"] or "")[:12], BOLD)]
    if p["escape"]:
        out += [("  ", ""), ("ESCAPE: not given this card", f"{BOLD};{RED}")]
    elif p["container"] is None and p["foreign"]:
        out += [("  ", ""), ("not this daemon's", DIM)]
    return out


def _processes(processes: Sequence[dict[str, Any]], color: bool, indent: str) -> list[str]:
    rows = [
        [
            Cell(str(p["pid"]), right=True),
            Cell(p["type"]),
            Cell(_text(p["user"])),
            Cell(_na(p["used_memory_mib"], " MiB"), right=True),
            Cell(_text(p["command"])),
            Cell("", parts=_owner(p)),
        ]
        for p in processes
    ]
    return _section("process", rows, color, indent)


def _idle(idle: Sequence[dict[str, Any]], color: bool, indent: str) -> list[str]:
    """Pinned containers that hold nothing now: a few by name, the rest counted (500 stopped ones stay one line)."""
    if not idle:
        return []
    names = ", ".join(f"{_text(h['name'])} ({h['state']})" for h in idle[:SHOWN_IDLE])
    more = f" and {len(idle) - SHOWN_IDLE} more" if len(idle) > SHOWN_IDLE else ""
    return _section("not holding", [[Cell(names + more)]], color, indent)


def _who(
    holders: Iterable[dict[str, Any]],
    processes: Sequence[dict[str, Any]],
    color: bool,
    indent: str,
    mislabelled: Sequence[dict[str, Any]] = (),
) -> list[str]:
    """Under a card or MIG device: who holds it (by name), who is labelled for it, what runs on it, and the pinned
    containers that hold nothing now."""
    ordered = sorted(holders, key=lambda h: h["name"])
    holding = [h for h in ordered if h["holds"]]
    return (
        _holders(holding, color, indent)
        + _mismatches(mislabelled, color, indent)
        + _processes(processes, color, indent)
        + _idle([h for h in ordered if not h["holds"]], color, indent)
    )


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _stop_said(stop_at: float | None, now: float | None = None) -> str:
    """When the idle rule stops the holder: ahead, or (its time past: the engine's stop and the container's grace
    take a while) under way. Never "will be stopped at" a time already past."""
    if not stop_at:
        return ""
    at = time.strftime("%H:%M:%S", time.localtime(stop_at))
    if stop_at > (time.time() if now is None else now):
        return f", will be stopped at {at}"
    return f", being stopped (due at {at})"


def _health(g: dict[str, Any], color: bool, indent: str) -> list[str]:
    """Why a card is unhealthy (and since when, where known), or why its health is unknown; nothing when healthy."""
    h = g.get("health") or {"healthy": None, "reasons": ["not read"]}
    if h["healthy"] is True:
        return []
    why = "; ".join(h["reasons"]) + (f"  since {h['since']}" if h.get("since") else "")
    if h["healthy"] is False:
        return _section("UNHEALTHY", [[Cell(why)]], color, indent, f"{BOLD};{RED}")
    return _section("health", [[Cell(f"unknown: {why}")]], color, indent, YELLOW)


def _card_block(g: dict[str, Any], head: str, color: bool, docker_ok: bool) -> list[str]:
    lines = [head]
    ident = [g["uuid"], _paint(g["bus_id"] or "", DIM, color)]
    if g["mig_mode"]:
        ident.append("MIG on")
    lines.append("    " + "  ".join(ident))
    lines += _health(g, color, "    ")
    if g.get("idle"):  # filled in by the resident agent only (hostagent ls --host)
        idle = f"IDLE: 0% utilization for {_duration(g['idle_seconds'])}"
        warning = g.get("idle_warning")  # the policy's idle rule warned its holders
        if warning:
            idle += f", no process; {_text(warning['container'])} warned" + _stop_said(warning.get("stop_at"))
        lines.append("    " + _paint(idle, f"{BOLD};{RED}", color))
    if g["mig_devices"]:
        mem = _figures([(m["memory_used_mib"], m["memory_total_mib"]) for m in g["mig_devices"]], "MiB")
        rows = [
            [
                Cell(f"MIG {m['index']}", CYAN),
                Cell(_short(m["name"], g["name"])),
                Cell(m["uuid"]),
                Cell(mem[i], YELLOW, right=True),
                _state(m),
            ]
            for i, m in enumerate(g["mig_devices"])
        ]
        for m, line in zip(g["mig_devices"], _lines(rows, color, "    ")):
            # A MIG device's own holders and processes; a holder of the whole card is listed under the card.
            mine = [h for h in g["holders"] if m["uuid"] in h["uuids"] and g["uuid"] not in h["uuids"]]
            lines += [line, *_who(mine, [p for p in g["processes"] if p["mig_uuid"] == m["uuid"]], color, "      ")]
    migs = {m["uuid"] for m in g["mig_devices"]}
    whole = [h for h in g["holders"] if g["uuid"] in h["uuids"] or not migs & set(h["uuids"])]
    if g["unknown"] and docker_ok:  # (Docker's absence is said once, on the header line)
        lines += _section("unknown", [[Cell(g["unknown"])]], color, "    ", f"{BOLD};{RED}")
    if g.get("unseen"):  # in use, and NVML names no process: busy (an agent of an earlier version: absent)
        lines += _section(
            "in use", [[Cell(f"{g['unseen']}, owner unseen: no process listed")]], color, "    ", f"{BOLD};{RED}"
        )
    return lines + _who(whole, [p for p in g["processes"] if not p["mig_uuid"]], color, "    ", g["mislabelled"])


def render(listing: dict[str, Any], color: bool = False, now: str | None = None) -> str:
    """The table; `now` (watch mode) goes on the header line."""
    docker_ok = bool(listing["docker"]["available"])
    head = [
        _paint(_text(listing.get("hostname") or ""), BOLD, color),
        f"driver {_na(listing['driver_version'])}",
        f"CUDA {_na(listing.get('cuda_driver_version'))}",
    ]
    if now:
        head.append(now)
    if not docker_ok:
        head.append(_paint("Docker unavailable: who holds which card is unknown", f"{BOLD};{RED}", color))
    degraded = (listing.get("record") or {}).get("degraded")  # the agent's record (docs/serve.md, "The record")
    if degraded:
        head.append(_paint(f"record degraded: {_text(degraded)}", f"{BOLD};{YELLOW}", color))
    out = ["  ".join(head)]
    gpus = listing["gpus"]
    ok = [g for g in gpus if not g["error"]]
    mem = _figures([(g["memory_used_mib"], g["memory_total_mib"]) for g in ok], "MiB")
    power = _figures([(_watts(g["power_draw_w"]), _watts(g["power_limit_w"])) for g in ok], "W")
    rows = [
        [
            Cell(f"[{g['index']}]", CYAN, gap=1),
            Cell(_text(g["name"] or NA), f"{BOLD};{BLUE}" if g["held"] else BLUE),
            Cell(_na(g["temperature_c"], "C"), _temperature_style(g["temperature_c"]), right=True),
            Cell(_na(g["utilization_gpu"], "%"), GREEN if g["utilization_gpu"] is not None else DIM, right=True),
            Cell(mem[i], YELLOW, right=True),
            Cell(power[i], MAGENTA, right=True),
            _state(g),
        ]
        for i, g in enumerate(ok)
    ]
    heads = iter(_lines(rows, color))
    for g in gpus:
        if g["error"]:
            # A card NVML cannot read: what is known of it, in red.
            h = g.get("health") or {}
            what = (
                f"[{g['index']}] UNHEALTHY: {'; '.join(h['reasons'])} ({g['error']})"
                if h.get("healthy") is False
                else f"[{g['index']}] ERROR: {g['error']}"
            )
            out.append(_paint(what, f"{BOLD};{RED}", color))
            continue
        out += _card_block(g, next(heads), color, docker_ok)
    return "\n".join(out) + "\n"


# --- --watch ---------------------------------------------------------------------------------------------------

# The alternate screen (the shell's screen comes back at the end, as with nvitop, htop, less), cursor hidden, no
# line wrap (a line wider than the window is cut, not folded into the next one's place).
_ENTER = "\x1b[?1049h\x1b[?25l\x1b[?7l"
_LEAVE = "\x1b[?7h\x1b[?25h\x1b[?1049l"


def watch(interval: float, color: bool, listing: Callable[[], dict[str, Any]]) -> int:
    """Redraw the table of `listing()` (hostagent.ls.listing.gather) every `interval` seconds until Ctrl-C (0) or
    SIGTERM (143), the terminal restored either way. On a terminal each frame overwrites the last in place (cursor
    home, each line cleared to its end, the rest of the screen cleared: no flicker); to a pipe or file, frames
    follow each other, a blank line apart."""
    import signal
    import time

    stream = sys.stdout
    tty = _isatty(stream)

    def frame(now: str) -> str:
        return render(listing(), color, now)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    if tty:
        stream.write(_ENTER)
    try:
        while True:
            started = time.monotonic()
            text = frame(f"every {interval:g}s  {time.strftime('%Y-%m-%d %H:%M:%S')}")
            if tty:
                stream.write("\x1b[H" + text.replace("\n", "\x1b[K\n") + "\x1b[J")
            else:
                stream.write(text + "\n")
            stream.flush()
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0
    except SystemExit as exit_:
        return int(exit_.code or 0)
    finally:
        if tty:
            stream.write(_LEAVE)
            stream.flush()
        signal.signal(signal.SIGTERM, previous)

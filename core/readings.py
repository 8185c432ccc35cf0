"""NVML readings beyond the listing of cards: memory errors (ECC, page retirement, row remapping), critical-XID
events and persistence mode. gpupin.core.health turns the first two into reasons; `hostagent doctor` reads the
third. NVML comes through the adapter (gpupin.core.nvml), which alone imports pynvml."""

from __future__ import annotations

import contextlib

from gpupin.core import health
from gpupin.core.nvml import _FUNCTION_NOT_FOUND, _GPU_IS_LOST, _NOT_SUPPORTED, _code, _module, _optional

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any, TypeVar

    from gpupin.core.nvml import Card

    T = TypeVar("T")

_MEMORY_ERROR_UNCORRECTED = 1  # nvmlMemoryErrorType_t
_VOLATILE_ECC = 0  # nvmlEccCounterType_t: since the driver loaded (or the card was reset)
_XID_CRITICAL_EVENT = 0x8  # nvmlEventTypeXidCriticalError


def memory_health(index: int) -> health.MemoryHealth:
    """The memory-error readings of the card at NVML index `index`."""
    nv = _module()
    out = health.MemoryHealth()

    def applicable(call: Callable[[], T]) -> T | None:
        # Only "the card has no such thing" is None: a refusal (no permission) leaves the health unknown.
        try:
            return call()
        except nv.NVMLError as err:
            if _code(err) in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                return None
            raise

    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        out.ecc_uncorrected = applicable(
            lambda: int(nv.nvmlDeviceGetTotalEccErrors(handle, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC))
        )
        pending = applicable(lambda: int(nv.nvmlDeviceGetRetiredPagesPendingStatus(handle)))
        out.retired_pending = None if pending is None else bool(pending)
        rows = applicable(lambda: nv.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            out.remap_pending, out.remap_failure = bool(rows[2]), bool(rows[3])
    except nv.NVMLError as err:
        out.lost = _code(err) == _GPU_IS_LOST
        out.error = str(err)
    return out


class XidEvents:
    """NVML's critical-XID events of some cards, from registration on: NVML delivers only the events that occur
    after it (an XID from before is in the host's kernel log, not here). Cards that cannot register (no event
    support, lost) are skipped."""

    def __init__(self, indices: Iterable[int]) -> None:
        nv = _module()
        self._set: Any = None
        self.watched: list[int] = []
        try:
            self._set = nv.nvmlEventSetCreate()
        except nv.NVMLError:  # a driver without events: no XID is seen, the other readings stand
            return
        for index in indices:
            try:
                nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(index), _XID_CRITICAL_EVENT, self._set)
            except nv.NVMLError:
                continue
            self.watched.append(index)

    def drain(self, timeout_ms: int = 0) -> list[tuple[int, int]]:
        """(card index, XID) for each event pending, waiting up to `timeout_ms` for the first; stops at the first
        error (a lost card: its own reading says so)."""
        nv = _module()
        events: list[tuple[int, int]] = []
        while self.watched:
            try:
                event = nv.nvmlEventSetWait_v2(self._set, timeout_ms if not events else 0)
                index = int(nv.nvmlDeviceGetIndex(event.device))
            except nv.NVMLError:
                break
            if int(event.eventType) & _XID_CRITICAL_EVENT:
                events.append((index, int(event.eventData)))
        return events

    def close(self) -> None:
        nv = _module()
        if self._set is not None:
            with contextlib.suppress(nv.NVMLError):  # a set NVML already dropped (its last shutdown)
                nv.nvmlEventSetFree(self._set)
            self._set = None


def persistence_modes(cards: list[Card]) -> dict[int, bool | None]:
    """Each card's persistence mode (nvidia-smi --query-gpu=persistence_mode), by index; None where NVML cannot
    say. Off, the driver tears the card down when its last client leaves, so every start pays the init again."""
    from functools import partial

    nv = _module()
    out: dict[int, bool | None] = {}
    for card in cards:
        if card.error is not None:
            out[card.index] = None
            continue
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(card.index)
            mode = _optional(partial(nv.nvmlDeviceGetPersistenceMode, handle))
        except nv.NVMLError:  # lost since it was listed: unknown, which is not "off"
            mode = None
        out[card.index] = bool(mode) if mode is not None else None
    return out


class XidLog:
    """Critical XIDs for a long-lived reader (the resident agent): one registration held from one read to the
    next, so that an XID arriving between two reads is not missed, and each card's XIDs kept (by UUID, with when
    the first arrived) for as long as the log lives: NVML does not say when a reset has cleared them."""

    def __init__(self) -> None:
        self._events: XidEvents | None = None
        self._watched: tuple[int, ...] = ()
        self.xids: dict[str, list[int]] = {}
        self.since: dict[str, str] = {}

    def update(self, cards: Sequence[Card]) -> None:
        """Register the readable cards (again when they changed) and keep what arrived since the last update."""
        readable = tuple(c.index for c in cards if c.error is None)
        if self._events is None or readable != self._watched:
            self.release()
            self._events, self._watched = XidEvents(readable), readable
        uuids = {c.index: c.uuid for c in cards}
        for index, xid in self._events.drain():
            uuid = uuids.get(index)
            if uuid:
                self.xids.setdefault(uuid, []).append(xid)
                self.since.setdefault(uuid, health.stamp())

    def release(self) -> None:
        """Drop the registration (before NVML is shut down); what arrived is kept."""
        if self._events is not None:
            with contextlib.suppress(Exception):  # NVML may be gone already, and the set with it
                self._events.close()
            self._events = None


def assess(cards: Sequence[Card], log: XidLog | None = None) -> None:
    """Reads every card's health into `card.health`: the XIDs that arrive while the cards are read (registered
    first, drained last), or with `log` every XID it has kept, then each card's memory-error readings. A card NVML
    could not read at all is lost or of unknown health."""
    readable = [c for c in cards if c.error is None]
    events = XidEvents(c.index for c in readable) if readable and log is None else None
    try:
        memory = {c.index: memory_health(c.index) for c in readable}
        arrived = events.drain() if events is not None else []
    finally:
        if events is not None:
            events.close()
    seen = health.stamp() if arrived else None
    if log is not None:
        log.update(cards)
    for card in cards:
        if card.error is not None:
            card.health = (
                health.Health(False, [health.LOST])
                if card.lost
                else health.Health(None, [f"NVML could not read the card: {card.error}"])
            )
            continue
        if log is not None:
            key = card.uuid or ""
            card.health = health.judge(memory[card.index], log.xids.get(key, ()), log.since.get(key))
        else:
            card.health = health.judge(memory[card.index], [x for i, x in arrived if i == card.index], seen)

"""gpupin's host side: resolve physical GPU requests through NVML and start pinned containers through the Docker
Engine, keeping a ledger (container labels) of who holds which card. What every part does the same way is here:
its name on stderr (`say`), the install hint, its helper threads (`start_thread`) and its phase marks (`mark`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

PROG = "hostagent"
INSTALL_HINT = "install the host side: pip install 'gpupin[host]'"
# The signals hostagent handles: Python runs their handlers in the main thread only (docs/design.md, "Signals").
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGWINCH)


def say(msg: str) -> None:
    """One line on stderr; dropped when it cannot be written (a log line is never worth the thread that writes it)."""
    try:
        sys.stderr.write(f"{PROG}: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # ValueError: closed; AttributeError: no stderr at all
        pass


def start_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = (), daemon: bool = True
) -> threading.Thread:
    """Start `target(*args)` on a thread that blocks HANDLED from its first instruction on, so that the kernel hands
    those signals to the main thread, whose blocking read they then interrupt."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)  # the new thread inherits this mask
    try:
        thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
        thread.start()
        return thread
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_TRACE_PATH = os.environ.get("GPUPIN_TRACE") or None


def mark(phase: str) -> None:
    """A phase of `hostagent run` for `make bench`'s breakdown: a `PHASE WALLCLOCK` line appended to GPUPIN_TRACE's
    file (docs/benchmarks.md lists the phases); nothing without it."""
    if _TRACE_PATH is None:
        return
    with open(_TRACE_PATH, "a", encoding="utf-8") as fh:
        fh.write(f"{phase} {time.time():.6f}\n")

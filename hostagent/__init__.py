"""gpupin's host side: resolve physical GPU requests through NVML and start pinned containers through the
Docker Engine, keeping a ledger (container labels) of who holds which card.

What every part of it does the same way is here: its name on stderr (`say`; an error's line is GpupinError.line's),
how to install what the host side needs (INSTALL_HINT), its helper threads (`start_thread`) and its phase marks
(`mark`).

hostagent's helper threads (the exit waiter, the stdin pump, the lock's release, a signal's action) are started so
that the signals hostagent handles always reach the main thread. Python runs signal handlers in the main thread
only, and only once it wakes. A process-directed signal that the kernel hands to a helper thread leaves the main
thread asleep in its read of the container's output, so Ctrl-C or a window resize would wait for the container's
next output. A thread started by `start_thread` blocks those signals from its first instruction on (it inherits the
mask its starter had at `start_thread`), so the kernel delivers them to the main thread, whose read they interrupt.

Where `hostagent run`'s time goes: phase marks for `make bench`'s breakdown, written only when GPUPIN_TRACE names a
file (one `PHASE WALLCLOCK` line per mark, appended); otherwise a mark costs one global lookup. The phases, in
order: main (the interpreter is up and hostagent's CLI imported), parsed, cards (NVML), connected (docker SDK
imported, API negotiated), locked (the ledger's lock taken), looked (the ledger read), attributed (the cards'
processes attributed), created, attached, started, exited (the container's exit learned), done.
"""

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


def help_width() -> int:
    """The width argparse gives --help, found as it finds it (shutil.get_terminal_size: COLUMNS, else the
    terminal, else 80, less 2) without importing shutil, which brings zlib, bz2 and lzma: 3 ms of every run's
    start-up, and argparse makes a formatter for each option it adds. hostagent's parsers pass this width."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


def say(msg: str) -> None:
    """One line on stderr from hostagent (a warning, or what it is doing), beside the results on stdout. A line that
    cannot be written (stderr closed, a pipe whose reader left) is dropped: a log line is never worth the thread
    that writes it (the agent's ledger thread, say)."""
    try:
        sys.stderr.write(f"{PROG}: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # ValueError: closed; AttributeError: no stderr at all
        pass


# --- helper threads ------------------------------------------------------------------------------------------------

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGWINCH)


def start_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = (), daemon: bool = True
) -> threading.Thread:
    """Start `target(*args)` on a thread that never takes SIGINT, SIGTERM or SIGWINCH."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    # Blocked here only for the start; a signal that comes meanwhile waits, and the main thread takes it after.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread


# --- phase marks ---------------------------------------------------------------------------------------------------

_TRACE_PATH = os.environ.get("GPUPIN_TRACE") or None


def mark(phase: str) -> None:
    if _TRACE_PATH is None:
        return
    with open(_TRACE_PATH, "a", encoding="utf-8") as fh:
        fh.write(f"{phase} {time.time():.6f}\n")

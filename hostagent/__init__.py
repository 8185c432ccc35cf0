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
They and their signals are made from the interpreter's C modules (_thread, _signal), not from threading and signal:
those bring enum, functools and collections, about 6 ms of `hostagent run`'s start-up through the agent.

Where `hostagent run`'s time goes: phase marks for `make bench`'s breakdown, written only when GPUPIN_TRACE names a
file (one `PHASE WALLCLOCK` line per mark, appended); otherwise a mark costs one global lookup. The phases, in
order: main (the interpreter is up and hostagent's CLI imported), parsed, cards (NVML), connected (docker SDK
imported, API negotiated), locked (the ledger's lock taken), looked (the ledger read), attributed (the cards'
processes attributed), created, attached, started, exited (the container's exit learned), done.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the signal module's C half (no type stubs)
import _thread
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
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

SIGINT: int = _signal.SIGINT
SIGTERM: int = _signal.SIGTERM
SIGWINCH: int = _signal.SIGWINCH
HANDLED = (SIGINT, SIGTERM, SIGWINCH)


def on_signal(signum: int, handler: Any) -> Any:
    """signal.signal: `handler(signum, frame)` for `signum` from now on; the handler it replaces."""
    return _signal.signal(signum, handler)


def signal_name(signum: int) -> str:
    """SIGINT for 2 (signal's names are enums: imported only when a signal came)."""
    import signal

    return signal.Signals(signum).name


class suppress:
    """contextlib.suppress, without contextlib's imports (collections, functools)."""

    __slots__ = ("_kinds",)

    def __init__(self, *kinds: type[BaseException]) -> None:
        self._kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, self._kinds)


class Helper:
    """A daemon thread of start_thread's: `join` it, ask whether it `is_alive`."""

    __slots__ = ("_done", "_ended", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._ended = False
        self._done = _thread.allocate_lock()
        self._done.acquire()  # released when its target returns

    def is_alive(self) -> bool:
        return not self._ended

    def join(self, timeout: float | None = None) -> None:
        if self._done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            self._done.release()

    def _run(self, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            target(*args)
        except BaseException as err:  # as threading's excepthook: said, and the thread ends
            if not isinstance(err, SystemExit):
                say(f"internal error in thread {self.name}: {type(err).__name__}: {err}")
        finally:
            self._ended = True
            self._done.release()


class Flag:
    """threading.Event's set and wait, on locks of _thread's: a lock held while unset, released once by `set`."""

    __slots__ = ("_guard", "_lock", "_set")

    def __init__(self) -> None:
        self._set = False
        self._guard = _thread.allocate_lock()
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        with self._guard:
            if not self._set:
                self._set = True
                self._lock.release()

    def wait(self, timeout: float) -> bool:
        """True once set (at once when it is), False after `timeout` seconds."""
        if self._set:
            return True
        if self._lock.acquire(timeout=max(timeout, 0.0)):
            self._lock.release()
            return True
        return self._set


def start_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = (), daemon: bool = True
) -> Helper | threading.Thread:
    """Start `target(*args)` on a thread that never takes SIGINT, SIGTERM or SIGWINCH. A daemon thread is a Helper
    (it ends with the process); one that the process must wait for at its exit (`daemon` False) is threading's."""
    # Blocked here only for the start; a signal that comes meanwhile waits, and the main thread takes it after.
    previous = _signal.pthread_sigmask(_signal.SIG_BLOCK, HANDLED)
    try:
        if daemon:
            helper = Helper(name)
            _thread.start_new_thread(helper._run, (target, args))
            return helper
        import threading

        thread = threading.Thread(target=target, args=args, name=name, daemon=False)
        thread.start()
        return thread
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, previous)


# --- phase marks ---------------------------------------------------------------------------------------------------

_TRACE_PATH = os.environ.get("GPUPIN_TRACE") or None


def mark(phase: str) -> None:
    if _TRACE_PATH is None:
        return
    with open(_TRACE_PATH, "a", encoding="utf-8") as fh:
        fh.write(f"{phase} {time.time():.6f}\n")

"""hostagent's helper threads (the exit waiter, the stdin pump, the lock's release, a signal's action), started so
that the signals hostagent handles always reach the main thread.

Python runs signal handlers in the main thread only, and only once it wakes. A process-directed signal that the
kernel hands to a helper thread leaves the main thread asleep in its read of the container's output, so Ctrl-C or
a window resize would wait for the container's next output. A thread started here blocks those signals from its
first instruction on (it inherits the mask its starter had at `start`), so the kernel delivers them to the main
thread, whose read they interrupt.
"""

from __future__ import annotations

import signal
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGWINCH)


def start(target: Callable[..., Any], name: str, args: tuple[Any, ...] = (), daemon: bool = True) -> threading.Thread:
    """Start `target(*args)` on a thread that never takes SIGINT, SIGTERM or SIGWINCH."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    # Blocked here only for the start; a signal that comes meanwhile waits, and the main thread takes it after.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread

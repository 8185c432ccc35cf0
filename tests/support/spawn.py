"""Processes the tests start get the signal dispositions a shell gives them, whatever this run inherited.

A signal ignored at exec stays ignored in the new program: under nohup (SIGHUP), in the background of a shell
without job control or under CI with no standard input (SIGINT, SIGQUIT), a test that sends Ctrl-C or SIGHUP to
a child and waits for it would wait for ever. Python itself ignores SIGPIPE, which subprocess restores but a bare
fork does not.

Two layers. `default_signals_at_exec()` (tests/conftest.py, at the start of the session) turns each such
inherited "ignored" into a handler that does nothing, so that this process still ignores it but every program it
starts, by subprocess, os.fork or pty.fork and exec, gets the default (exec resets a handled signal, not an
ignored one). `default_signals()` is for the child of a bare fork, before its exec or the code it runs.
"""

from __future__ import annotations

import signal
from types import FrameType

# The dispositions a program expects at its start: a shell resets them for its foreground jobs.
SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Ignored here, as inherited; a handler all the same, so that exec gives the child the default."""


def default_signals_at_exec() -> list[str]:
    """Replace every inherited SIG_IGN among SIGNALS (but SIGPIPE: Python's own, restored by subprocess) by a
    handler that ignores it; SIGINT gets Python's own (KeyboardInterrupt), as pytest expects. The names changed."""
    changed = []
    for sig in SIGNALS:
        if sig != signal.SIGPIPE and signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else _ignore)
            changed.append(sig.name)
    return changed


def default_signals() -> None:
    """In a forked child, before it execs or runs code of its own: every one of SIGNALS at its default."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def ignored_in(status: str) -> set[str]:
    """The names of SIGNALS ignored in a /proc/PID/status text."""
    mask = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:"))
    return {sig.name for sig in SIGNALS if mask & (1 << (sig - 1))}

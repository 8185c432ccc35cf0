"""The supervising parent of `gpupin-entrypoint --watch`: start CMD as a child, pass signals on, reap, report.

Modelled on tini (with -g) and dumb-init, since with --watch the entrypoint stays PID 1 instead of exec'ing CMD
(the rules: docs/entrypoint.md, "Watching the cards"). Everything the parent runs after the fork is imported
before it, so it adds nothing to the workload's memory or start. No `from __future__ import annotations`
(docs/design.md, Import rules).
"""

import contextlib
import os
import signal
import sys
import time
import warnings

from gpupin.core.errors import EX_SIGNAL_BASE, EX_SOFTWARE, GpupinError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

# Signals that are about the parent's own code: they must act on it (a crash stays a crash), never be queued.
_OWN = {signal.SIGFPE, signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS}
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}
# Job control: the parent is in the background once the child's group holds the terminal.
_JOB_CONTROL = {signal.SIGTTIN, signal.SIGTTOU}
# After SIGKILL, how long to wait for the workload before giving up on it: a process in uninterruptible sleep in
# the driver of a lost card may never die, and the container must still end so that its restart policy acts.
KILL_WAIT = 5.0
UNWATCHED = 30 * 86400.0  # the interval once the checks failed: the parent still reaps and passes signals on


def forwarded_signals() -> "set[int]":
    """What the parent passes on to the workload's process group: every catchable signal but its own."""
    keep: set[int] = {*_OWN, *_UNCATCHABLE, *_JOB_CONTROL, signal.SIGCHLD}
    return {int(num) for num in signal.valid_signals()} - keep


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128+N for death by signal N."""
    code = os.waitstatus_to_exitcode(status)
    return EX_SIGNAL_BASE - code if code < 0 else code


class Child:
    """The workload's process: its pid (also its process group's id) and, once reaped, its exit code."""

    __slots__ = ("code", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None

    def signal(self, signum: int) -> None:
        """Send `signum` to the workload's process group (tini -g), or to the workload alone if it left it."""
        try:
            os.kill(-self.pid, signum)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):  # already gone; its SIGCHLD is on the way
                os.kill(self.pid, signum)

    def reap(self) -> bool:
        """Reap every child that has ended (as PID 1: orphans too); True once the workload is among them."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.pid:
                self.code = exit_code(status)
        return self.code is not None


def _exec_child(
    cmd: "Sequence[str]",
    env: "dict[str, str]",
    mask: "set[int]",
    saved: "dict[int, Any]",
    run: "Callable[[Sequence[str], dict[str, str]], int]",
    prog: str,
) -> None:
    """In the forked child: a process group of its own, the terminal's foreground, default signals, then exec."""
    code = EX_SOFTWARE
    try:
        # The terminal is handed over only if the entrypoint held it: one started in the background (`... &`)
        # must not take it from the shell. No terminal (ENOTTY), or none of ours (ENXIO): nothing to hand over.
        foreground = False
        with contextlib.suppress(OSError):
            foreground = os.tcgetpgrp(0) == os.getpgrp()
        os.setpgid(0, 0)
        if foreground:
            # SIGTTOU is still ignored (inherited): taking the foreground from a background group cannot stop us.
            with contextlib.suppress(OSError):
                os.tcsetpgrp(0, os.getpgrp())
        # A handler of the parent's (Python's own for SIGINT, the entrypoint's for SIGTERM) must not run here if a
        # signal is pending when the mask is lifted: reset them while everything is still blocked.
        for num in forwarded_signals():
            handler = signal.getsignal(num)
            if callable(handler):
                signal.signal(num, signal.SIG_DFL)
        for num, handler in saved.items():
            signal.signal(num, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        code = run(cmd, env)  # execs; returns or raises only when CMD cannot be run
    except GpupinError as err:  # 127 or 126, said as without --watch
        code = err.exit_code
        sys.stderr.write(err.line(prog))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


class Watch:
    """What the parent does while the workload runs: `check()` every `interval` seconds; when it names a loss,
    SIGTERM, and SIGKILL `grace` seconds later; once the workload ended (or outlived SIGKILL by KILL_WAIT),
    `on_loss(what, how)`, which says what was lost and how the workload was stopped, and gives the exit code."""

    __slots__ = ("check", "grace", "interval", "on_loss")

    def __init__(
        self,
        interval: float,
        check: "Callable[[], str | None]",
        on_loss: "Callable[[str, str], int]",
        grace: float,
    ) -> None:
        self.interval = interval
        self.check = check
        self.on_loss = on_loss
        self.grace = grace


def supervise(
    cmd: "Sequence[str]",
    env: "dict[str, str]",
    watch: Watch,
    run: "Callable[[Sequence[str], dict[str, str]], int]",
    prog: str,
) -> int:
    """Run CMD (through `run`, which execs it) as a supervised child; return its exit code, or the loss's code once
    `watch.check()` named one and the workload was stopped."""
    waited = forwarded_signals() | {signal.SIGCHLD}
    # SIGCHLD at its default, never inherited as ignored: an ignored SIGCHLD makes the kernel reap for us, and the
    # workload's exit code would be lost.
    saved: dict[int, Any] = {signal.SIGCHLD: signal.signal(signal.SIGCHLD, signal.SIG_DFL)}
    for num in _JOB_CONTROL:
        saved[num] = signal.signal(num, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # The real NVML runs threads of its own (its event set's, measured on an H200), and Python 3.12 warns about
        # forking then; under PYTHONWARNINGS=error that warning would end the parent after the child exists. The
        # child only sets its group, signals and mask, then execs: it never touches NVML or another lock.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        _exec_child(cmd, env, mask, saved, run, prog)
    child = Child(pid)
    lost: str | None = None  # what check() found lost
    lost_at = 0.0  # when SIGTERM went
    killed = False
    until = time.monotonic() + watch.interval  # the next check; then the end of a grace period
    while child.code is None:
        info = signal.sigtimedwait(waited, max(until - time.monotonic(), 0.0))
        if info is not None:
            if info.si_signo == signal.SIGCHLD:
                if child.reap():
                    break
            else:
                child.signal(info.si_signo)
        now = time.monotonic()
        if now < until:
            continue
        if lost is not None:  # the grace period is over, or the wait after SIGKILL
            if killed:  # a process stuck in the driver outlives even SIGKILL: do not hang with it
                break
            child.signal(signal.SIGKILL)
            killed = True
            until = now + KILL_WAIT
            continue
        try:
            what = watch.check()
        except Exception as err:  # a bug in a check must neither end the workload nor leave it without its parent
            with contextlib.suppress(OSError, ValueError):  # stderr gone: the workload runs on all the same
                sys.stderr.write(
                    f"{prog}: WARNING: the card checks failed ({type(err).__name__}: {err}); the "
                    "workload runs on, unwatched\n"
                )
                sys.stderr.flush()
            watch.interval, what = UNWATCHED, None
        if what is None:
            # The next check is a whole interval after the one due, or after now if that one ran late.
            until = max(until + watch.interval, now)
            continue
        lost = what
        child.signal(signal.SIGTERM)
        lost_at = time.monotonic()
        until = lost_at + watch.grace
    if lost is not None:
        if not killed:
            how = f"stopped with SIGTERM after {time.monotonic() - lost_at:.1f} s"
        elif child.code is not None:
            how = f"killed with SIGKILL after the {watch.grace:g} s grace (SIGTERM did not stop it)"
        else:
            how = (
                f"sent SIGKILL after the {watch.grace:g} s grace, and had not ended {KILL_WAIT:g} s later (a "
                "process stuck in the driver of a lost card may never end)"
            )
        return watch.on_loss(lost, how)
    assert child.code is not None
    return child.code

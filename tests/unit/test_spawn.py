"""The processes the tests start get default signal dispositions, whatever the run inherited (tests/support/spawn.py):
a run under nohup or CI without standard input inherits SIGHUP or SIGINT ignored, and a test that sends Ctrl-C to a
child would otherwise wait for it for ever."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from tests.support.host import REPO
from tests.support.spawn import SIGNALS, default_signals, ignored_in

STATUS = ["cat", "/proc/self/status"]


def test_a_child_of_this_run_ignores_none_of_them() -> None:
    assert ignored_in(subprocess.run(STATUS, capture_output=True, text=True, check=True).stdout) == set()


def test_a_run_started_with_them_ignored_starts_children_with_the_defaults() -> None:
    script = (
        "import signal, subprocess\n"
        "from tests.support.spawn import SIGNALS, default_signals_at_exec, ignored_in\n"
        "for s in SIGNALS: signal.signal(s, signal.SIG_IGN)\n"
        "default_signals_at_exec()\n"
        "assert signal.getsignal(signal.SIGHUP) != signal.SIG_DFL  # still ignored by the run itself\n"
        "print(sorted(ignored_in(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)))"
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r


def test_the_child_of_a_bare_fork_gets_them_all_at_the_default() -> None:
    """pty.fork and exec, as the terminal tests do: Python's own SIGPIPE "ignored" is not restored there."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs
        try:
            default_signals()
            os.execvp(STATUS[0], STATUS)
        finally:
            os._exit(127)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child is gone
            break
        if not chunk:
            break
        out += chunk
    os.close(fd)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert ignored_in(out.decode()) == set(), [s.name for s in SIGNALS]

"""Black-box tests of `gpupin-entrypoint --watch`, the supervising parent, as dumb-init's tests are written.

The tests that take `ep` run here on the simulated host (the console script), and again in
tests/docker/test_entrypoint_watch.py in the project's image on each engine's sandbox, where the entrypoint is the
container's PID 1. They check what a user depends on: the workload's exit code and signals, its process group and
terminal, and that a lost card stops the workload with 79 and one line.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.entrypoint import Entrypoint, device, one_error_line
from tests.support.host import ENTRYPOINT, simhost_env
from tests.support.scenarios import uuids
from tests.support.spawn import default_signals
from tests.support.watch import LOOPING, PIN, WATCH, Faults, Running, loss_line, start

A800, RTX, A800B, A800C = uuids("mixed-4")  # RTX is the pinned card (watch.PIN)

# A workload that reports each signal it gets, and ends with 42 on SIGTERM (after saying which pid it is).
REPORTER = (
    "import os, signal, sys\n"
    "def got(n, f):\n"
    "    print('got', signal.Signals(n).name if n < signal.SIGRTMIN else 'SIGRTMIN+%d' % (n - signal.SIGRTMIN),"
    " flush=True)\n"
    "    if n == signal.SIGTERM: sys.exit(42)\n"
    "for n in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH,"
    " signal.SIGQUIT, signal.SIGCONT, signal.SIGRTMIN + 3):\n"
    "    signal.signal(n, got)\n"
    "print('ready', os.getpid(), os.getppid(), os.getpgrp(), flush=True)\n"
    "while True: signal.pause()\n"
)


# --- exit codes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 2, 42, 78, 79, 126, 127, 255])
def test_the_workload_exit_code_passes_through(ep: Entrypoint, code: int) -> None:
    r = ep.run(*WATCH, "sh", "-c", f"exit {code}", env=PIN, gpus=device(RTX))
    assert (r.rc, r.err) == (code, ""), r


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGSEGV])
def test_a_workload_killed_by_signal_n_ends_in_128_plus_n(ep: Entrypoint, sig: int) -> None:
    """As tini and a shell report it (and Docker for a container whose PID 1 died of a signal): no --init needed."""
    r = ep.run(*WATCH, "sh", "-c", f"kill -{int(sig)} $$", env=PIN, gpus=device(RTX))
    assert r.rc == 128 + sig, r


def test_a_missing_command_is_127_with_one_line(ep: Entrypoint) -> None:
    r = ep.run(*WATCH, "no-such-workload", env=PIN, gpus=device(RTX))
    assert r.rc == 127, r
    assert "cannot run 'no-such-workload': no such file" in one_error_line(r.err)


# --- the parent, the child, its group and its terminal ----------------------------------------------------------


def test_the_workload_is_a_child_in_a_process_group_of_its_own(ep: Entrypoint, running: list[Running]) -> None:
    r = start(ep, running, "{py}", "-c", REPORTER)
    pid, ppid, pgrp = map(int, r.wait_for("ready").split()[1:4])
    assert pgrp == pid and pid != ppid
    if ep.mode == "host":
        assert ppid == r.proc.pid
    else:
        assert ppid == 1, "the entrypoint is the container's PID 1, the workload its child"
    r.send(signal.SIGTERM)
    assert r.wait() == 42


def test_every_signal_reaches_the_workload(ep: Entrypoint, running: list[Running]) -> None:
    """docker kill -s ..., docker stop, a Ctrl-C passed on by `docker run`'s sig-proxy: each is the workload's,
    a real-time signal too; SIGTERM last, which it answers with 42, the container's exit code."""
    r = start(ep, running, "{py}", "-c", REPORTER)
    r.wait_for("ready")
    names = ["SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT", "SIGWINCH", "SIGQUIT", "SIGCONT"]
    for name in names:
        r.send(getattr(signal, name))
        r.wait_for(f"got {name}\n")
    r.send(signal.SIGRTMIN + 3)
    r.wait_for("got SIGRTMIN+3\n")
    r.send(signal.SIGTERM)
    assert r.wait() == 42
    assert "got SIGTERM" in r.output()


def test_a_signal_reaches_the_whole_process_group(ep: Entrypoint, running: list[Running]) -> None:
    """tini -g: docker stop ends the workload's own children too, not just the shell that started them."""
    script = 'trap "echo shell got TERM" TERM; sleep 1000 & echo ready; wait $!; wait $!; echo "sleep ended $?"'
    r = start(ep, running, "sh", "-c", script)
    r.wait_for("ready")
    r.send(signal.SIGTERM)
    assert r.wait() == 0
    out = r.wait_for("sleep ended")
    assert "shell got TERM" in out and "sleep ended 143" in out, out


def test_sigterm_to_the_parent_ends_an_untrapping_workload_with_143(ep: Entrypoint, running: list[Running]) -> None:
    r = start(ep, running, "sh", "-c", "echo ready; sleep 1000")
    r.wait_for("ready")
    r.send(signal.SIGTERM)
    assert r.wait() == 143


# The terminal tests wait for the entrypoint with waitpid: a Ctrl-C or SIGTERM that never lands (an inherited
# "ignored": tests/support/spawn.py) fails them in two minutes instead of hanging the run.
@pytest.mark.timeout(120)
def test_the_workload_holds_the_terminal(ep: Entrypoint) -> None:
    """With a terminal (docker run -it), the workload's group is the terminal's foreground, so Ctrl-C is typed
    straight to it, as without --watch: its stat shows its group as the terminal's foreground group (tpgid)."""
    script = "read -r _ _ _ _ pgrp _ _ tpgid _ < /proc/self/stat; echo pgrp=$pgrp tpgid=$tpgid; exec sleep 1000"
    argv, env = ep.argv([*WATCH, "sh", "-c", script], PIN, device(RTX), docker_args=("-it",))
    pid, fd = _spawn_in_pty(argv, env)
    try:
        out = _read_until(fd, "tpgid=")
        line = out[out.index("pgrp=") :].split("\r")[0].split("\n")[0]
        pgrp, tpgid = (int(f.split("=")[1]) for f in line.split())
        assert pgrp == tpgid, out
        os.write(fd, b"\x03")  # Ctrl-C
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT
    finally:
        os.close(fd)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.timeout(120)
def test_a_background_entrypoint_leaves_the_terminal_alone(fakegpu: Path) -> None:
    """Started in the background of a terminal (`gpupin-entrypoint --watch 5 CMD &`), it must not take the terminal
    from the shell: the workload's group stays in the background."""
    script = (
        "read -r _ _ _ _ pgrp _ _ tpgid _ < /proc/self/stat; echo pgrp=$pgrp tpgid=$tpgid ppid=$PPID; exec sleep 1000"
    )
    pid, fd = _spawn_in_pty([ENTRYPOINT, *WATCH, "sh", "-c", script], simhost_env(**PIN), background=True)
    try:
        out = _read_until(fd, "ppid=")
        fields = dict(f.split("=") for f in out[out.index("pgrp=") :].split())
        assert fields["pgrp"] != fields["tpgid"] and int(fields["tpgid"]) == pid, out
        os.kill(int(fields["ppid"]), signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM
    finally:
        os.close(fd)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _spawn_in_pty(argv: list[str], env: dict[str, str], background: bool = False) -> tuple[int, int]:
    """Run argv on a new terminal (its session's leader), or, `background`, in a background group of its session
    (as a shell's `&` does) under a leader that waits for it and exits with its code."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs
        try:
            default_signals()
            if background and (job := os.fork()):
                os._exit(os.waitstatus_to_exitcode(os.waitpid(job, 0)[1]) & 0xFF)
            if background:
                os.setpgid(0, 0)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    return pid, fd


def _read_until(fd: int, text: str, timeout: float = 60) -> str:
    out = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in out or not out.rstrip(b" ").endswith((b"\n", b"\r")):
        assert time.monotonic() < deadline, f"never printed {text!r}: {out!r}"
        if select.select([fd], [], [], 0.1)[0]:
            out += os.read(fd, 4096)
    return out.decode(errors="replace")


# --- the environment the workload gets ------------------------------------------------------------------------


@pytest.mark.parametrize("watch", [True, False], ids=["watch", "exec"])
def test_the_workload_gets_default_signal_dispositions(ep: Entrypoint, watch: bool) -> None:
    """Python ignores SIGPIPE and SIGXFSZ for itself; the workload must not inherit that: `yes | head -1` ends
    quietly, as in any shell. Nothing is left blocked either."""
    opts = WATCH if watch else ("--quiet",)
    r = ep.run(*opts, "sh", "-c", "yes | head -1; grep -E '^Sig(Ign|Blk)' /proc/self/status", env=PIN, gpus=device(RTX))
    assert (r.rc, r.err) == (0, ""), r
    first, blocked, ignored = r.out.splitlines()
    assert first == "y" and int(blocked.split()[1], 16) == 0, r
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not int(ignored.split()[1], 16) & (1 << (sig - 1)), f"{sig.name} ignored: {r}"


def test_without_watch_the_workload_still_replaces_the_entrypoint(ep: Entrypoint) -> None:
    """GPUPIN_WATCH empty is off: exec, same PID, as before --watch existed."""
    argv, env = ep.argv(["--quiet", "sh", "-c", "echo $$"], {**PIN, "GPUPIN_WATCH": ""}, device(RTX))
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p
    if ep.mode == "container":
        assert p.stdout.strip() == "1"


# --- the watch itself ---------------------------------------------------------------------------------------


def test_a_healthy_card_is_checked_without_a_word(ep: Entrypoint) -> None:
    """Many checks (every 0.05 s over a second) of a card that stays: the workload ends on its own, with its code."""
    r = ep.run("--quiet", "--watch", "0.05", "sh", "-c", "sleep 1; exit 7", env=PIN, gpus=device(RTX))
    assert (r.rc, r.err) == (7, ""), r


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "-inf", "five", "", "1e9"])
def test_a_bad_interval_is_64_with_one_line(ep: Entrypoint, value: str) -> None:
    r = ep.run("--watch", value, "sh", "-c", "echo ran", env=PIN, gpus=device(RTX))
    assert (r.rc, r.out) == (64, ""), r
    assert one_error_line(r.err).startswith(f"gpupin-entrypoint: ERROR: --watch {value!r} is not a number of seconds")
    if value:
        r = ep.run("sh", "-c", "echo ran", env={**PIN, "GPUPIN_WATCH": value}, gpus=device(RTX))
        assert (r.rc, r.out) == (64, ""), r
        assert "unset GPUPIN_WATCH to run without watching" in one_error_line(r.err)


@pytest.mark.parametrize("value", ["1e-300", "0.01"])
def test_an_interval_below_the_shortest_is_64_not_a_busy_loop(ep: Entrypoint, value: str) -> None:
    r = ep.run("sh", "-c", "echo ran", env={**PIN, "GPUPIN_WATCH": value}, gpus=device(RTX))
    assert (r.rc, r.out) == (64, ""), r
    assert f"GPUPIN_WATCH={value!r} is below the shortest interval, 0.05 seconds" in one_error_line(r.err)


@pytest.mark.parametrize("value", ["-1", "nan", "x"])
def test_a_bad_grace_is_64_with_one_line(value: str, fakegpu: Path) -> None:
    p = subprocess.run(
        [ENTRYPOINT, "--watch", "1", "true"],
        env=simhost_env(GPUPIN_WATCH_GRACE=value, **PIN),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 64 and "GPUPIN_WATCH_GRACE=" in one_error_line(p.stderr), p


# --- a card lost mid-run ----------------------------------------------------------------------------------------

AT = f"{RTX} at 00000000:3B:00.0"


@pytest.mark.parametrize(
    "fault, says",
    [
        ({"lost": True}, f"{AT} is lost to NVML (GPU is lost: fallen off the bus)"),
        ({"xid": [79]}, f"{AT} is unhealthy: XID 79 (fallen off the bus)"),
        ({"xid": [13, 48]}, f"{AT} is unhealthy: XID 48 (double-bit ECC error)"),
        ({"ecc": {"volatile_uncorrected": 2}}, f"{AT} is unhealthy: 2 volatile uncorrectable ECC errors"),
        ({"remap": {"failure": True}}, f"{AT} is unhealthy: row remapping failed"),
    ],
    ids=["lost", "xid-79", "xid-48", "ecc", "remap-failure"],
)
def test_a_card_lost_mid_run_stops_the_workload_with_79(
    ep: Entrypoint, running: list[Running], tmp_path: Path, fault: dict[str, object], says: str
) -> None:
    """The fault is planted under the running workload; within the interval (0.2 s) plus a second, the workload
    gets SIGTERM, and the entrypoint exits 79 with one line that says what was lost and what to do."""
    faults = Faults(ep, tmp_path)
    r = start(ep, running, "sh", "-c", LOOPING, env=faults.env, docker_args=faults.docker_args)
    r.wait_for("ready")
    planted = faults.plant({"cards": {RTX: fault}})
    r.wait_for("workload got TERM")
    assert time.monotonic() - planted < 0.2 + 1 + (1 if ep.mode == "container" else 0)  # docker logs' own delay
    assert r.wait() == 79
    line = loss_line(r.stderr())
    assert f": {says}; the workload was stopped" in line
    # Issue 23, trap 8: what was done, not what might have been: SIGTERM was enough.
    assert re.search(r"; the workload was stopped with SIGTERM after \d+\.\d s\. HINT: ", line), line
    assert "SIGKILL" not in line, line


def test_an_application_xid_does_not_stop_the_workload(ep: Entrypoint, running: list[Running], tmp_path: Path) -> None:
    """XID 13 (graphics engine exception) and 31 (memory page fault) are the application's own errors: NVIDIA's
    catalog says restart the application, the card is fine. The watch leaves that to the workload."""
    faults = Faults(ep, tmp_path)
    r = start(
        ep,
        running,
        "sh",
        "-c",
        "echo ready; sleep 1; exit 3",
        env=faults.env,
        docker_args=faults.docker_args,
        watch=("--quiet", "--watch", "0.05"),
    )
    r.wait_for("ready")
    faults.plant({"cards": {RTX: {"xid": [13, 31]}}})
    assert r.wait() == 3
    assert r.stderr() == ""


def test_a_workload_that_ignores_sigterm_is_killed_after_the_grace(
    ep: Entrypoint, running: list[Running], tmp_path: Path
) -> None:
    faults = Faults(ep, tmp_path)
    env = {**faults.env, "GPUPIN_WATCH_GRACE": "0.5"}
    r = start(
        ep,
        running,
        "sh",
        "-c",
        "trap 'echo ignored TERM' TERM; echo ready; while :; do sleep 0.05; done",
        env=env,
        docker_args=faults.docker_args,
    )
    r.wait_for("ready")
    planted = faults.plant({"cards": {RTX: {"lost": True}}})
    assert r.wait() == 79
    assert time.monotonic() - planted < 0.2 + 0.5 + 5
    assert "ignored TERM" in r.output()
    # Issue 23, trap 8: the line says SIGTERM did not stop it and SIGKILL did, after the grace.
    line = loss_line(r.stderr())
    assert "; the workload was killed with SIGKILL after the 0.5 s grace (SIGTERM did not stop it). HINT: " in line


def test_a_card_of_another_container_lost_does_not_stop_this_one(
    ep: Entrypoint, running: list[Running], tmp_path: Path
) -> None:
    """Only the pinned cards are watched: another card of the host falling off the bus is not this workload's."""
    faults = Faults(ep, tmp_path)
    r = start(
        ep,
        running,
        "sh",
        "-c",
        "echo ready; sleep 1; exit 3",
        env=faults.env,
        docker_args=faults.docker_args,
        watch=("--quiet", "--watch", "0.05"),
    )
    r.wait_for("ready")
    faults.plant({"cards": {A800: {"lost": True}}})
    assert r.wait() == 3
    assert r.stderr() == ""


def test_a_check_that_fails_leaves_the_workload_running_under_its_parent() -> None:
    """A bug in a check (an exception no check expects) must neither stop the workload nor leave it without its
    parent: one warning, then the workload runs on, still supervised, and its code is passed through."""
    code = (
        "import sys\n"
        "from gpupin.entrypoint.cli import run_workload\n"
        "from gpupin.entrypoint.supervise import Watch, supervise\n"
        "def check():\n"
        "    raise RuntimeError('boom')\n"
        "watch = Watch(0.05, check, lambda what, how: 79, 1.0)\n"
        "sys.exit(supervise(['sh', '-c', 'sleep 0.5; exit 4'], {'PATH': '/usr/bin:/bin'}, watch, run_workload,"
        " 'gpupin-entrypoint'))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 4, p
    assert p.stderr == (
        "gpupin-entrypoint: WARNING: the card checks failed (RuntimeError: boom); the workload runs on, unwatched\n"
    ), p


def test_watching_says_which_cards_and_how_often_when_it_starts(ep: Entrypoint, running: list[Running]) -> None:
    """Issue 23, trap 8: --watch said nothing at start. One line on stderr says which cards it watches and how
    often (after the report; --quiet keeps it quiet, as it keeps the report)."""
    r = start(ep, running, "sh", "-c", "echo ready; sleep 0.5", watch=("--watch", "0.2"))
    assert r.wait() == 0
    lines = r.stderr().splitlines()
    watching = [ln for ln in lines if "watching" in ln]
    assert watching == [
        f"gpupin-entrypoint: watching {RTX} (cuda:0) every 0.2 s; if it is lost, the workload is stopped (exit 79)"
    ], lines
    assert lines.index(watching[0]) > 0 and lines[0].startswith("gpupin-entrypoint: verified"), lines
    quiet = start(ep, running, "sh", "-c", "exit 0")  # WATCH has --quiet
    assert quiet.wait() == 0 and quiet.stderr() == ""

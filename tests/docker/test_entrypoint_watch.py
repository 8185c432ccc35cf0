"""`gpupin-entrypoint --watch` as a container's PID 1: the project's image on each engine's sandbox. The tests of
tests/unit/test_entrypoint_watch.py that a container adds to run here again, where this tier's `ep`
(tests/docker/conftest.py) runs them in the container: signals as `docker kill` and `docker stop` send them to PID
1, its process groups and terminal (`docker run -it`), a card's loss seen through the image's NVML. Bad values
(intervals, commands) are refused before anything a container changes and run in the unit tier only. The tests
below only a container has: the orphans of the whole container are PID 1's children, and its device cgroup can be
taken away under it.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.entrypoint import Entrypoint, device
from tests.support.watch import LOOPING, PIN, RTX, WATCH, Running, loss_line, start
from tests.unit import test_entrypoint_watch as unit
from tests.unit.test_entrypoint_watch import (  # noqa: F401  (collected here again, with this tier's `ep`)
    test_a_card_of_another_container_lost_does_not_stop_this_one,
    test_a_signal_reaches_the_whole_process_group,
    test_a_workload_that_ignores_sigterm_is_killed_after_the_grace,
    test_every_signal_reaches_the_workload,
    test_sigterm_to_the_parent_ends_an_untrapping_workload_with_143,
    test_the_workload_gets_default_signal_dispositions,
    test_the_workload_holds_the_terminal,
    test_the_workload_is_a_child_in_a_process_group_of_its_own,
)


@pytest.mark.parametrize("code", [0, 79, 255])
def test_the_workload_exit_code_passes_through(ep: Entrypoint, code: int) -> None:
    unit.test_the_workload_exit_code_passes_through(ep, code)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_workload_killed_by_signal_n_ends_in_128_plus_n(ep: Entrypoint, sig: int) -> None:
    unit.test_a_workload_killed_by_signal_n_ends_in_128_plus_n(ep, sig)


def test_a_card_lost_mid_run_stops_the_workload_with_79(ep: Entrypoint, running: list[Running], tmp_path: Path) -> None:
    """The fault file seen through a bind mount by the image's NVML; the unit tier runs every kind of loss."""
    fault: dict[str, Any] = {"lost": True}
    unit.test_a_card_lost_mid_run_stops_the_workload_with_79(
        ep, running, tmp_path, fault, f"{unit.AT} is lost to NVML (GPU is lost: fallen off the bus)"
    )


def test_orphans_are_reaped_by_the_entrypoint_as_pid_1(ep: Entrypoint) -> None:
    """An orphan of the workload ends as the child of PID 1, which must reap it, or it stays a zombie."""
    script = (
        "(sleep 0.2 & echo $! > /tmp/orphan); orphan=$(cat /tmp/orphan); i=0; "
        "while [ -e /proc/$orphan ] && [ $i -lt 200 ]; do i=$((i+1)); sleep 0.05; done; "
        "[ -e /proc/$orphan ] && grep State /proc/$orphan/status || echo reaped"
    )
    r = ep.run(*WATCH, "sh", "-c", script, env=PIN, gpus=device(RTX))
    assert (r.rc, r.out) == (0, "reaped\n"), r


def test_a_daemon_reload_that_takes_the_devices_away_is_a_loss(ep: Entrypoint, running: list[Running]) -> None:
    """What `systemctl daemon-reload` does to a container under the systemd cgroup driver (cgroup v1), done by hand:
    its device cgroup stops allowing the NVIDIA nodes. Open files keep working, so NVML's session answers on, but
    a new session would fail with "Unknown Error"; the watcher sees /dev/nvidiactl no longer open. (The simulated
    GPUs have no device nodes: /dev/full stands in for /dev/nvidiactl.)"""
    assert ep.sandbox is not None
    r = start(ep, running, "sh", "-c", LOOPING, docker_args=("--device", "/dev/full:/dev/nvidiactl"))
    r.wait_for("ready")
    pid = ep.sandbox.docker("inspect", "-f", "{{.State.Pid}}", r.cid, check=True).stdout.strip()
    cgroup = next(
        line.split(":", 2)[2]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if line.split(":")[1] == "devices"
    )
    Path(f"/sys/fs/cgroup/devices{cgroup}/devices.deny").write_text("c 1:7 rwm")
    assert r.wait() == 79
    assert "workload got TERM" in r.output()
    line = loss_line(r.stderr())
    assert "/dev/nvidiactl no longer opens here (Operation not permitted)" in line and "Unknown Error" in line, line

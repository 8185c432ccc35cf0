"""A watched workload (`gpupin-entrypoint --watch`) as its tests start it, on the simulated host or in a container
(tests/unit and tests/docker test_entrypoint_watch.py): its output as it comes, signals sent to the entrypoint, and
the fake NVML's fault file planted under it."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from tests.support.entrypoint import Entrypoint, device, one_error_line
from tests.support.scenarios import uuids

RTX = uuids("mixed-4")[1]  # the card every watched workload is pinned to
PIN = {"GPUPIN_EXPECT": RTX}
WATCH = ("--quiet", "--watch", "0.2")


class Running:
    """A watched workload started in the background: its output as it comes, and signals sent to the entrypoint
    (to its process on the host, through `docker kill` in a container)."""

    def __init__(
        self,
        ep: Entrypoint,
        *args: str,
        env: dict[str, str] | None = None,
        watch: tuple[str, ...] = WATCH,
        docker_args: tuple[str, ...] = (),
    ) -> None:
        self.ep = ep
        argv, penv = ep.argv([*watch, *args], env or PIN, device(RTX), detach=True, docker_args=docker_args)
        self.out: list[str] = []
        self.err: list[str] = []
        if ep.mode == "host":
            self.proc = subprocess.Popen(argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.cid = ""
            self.readers = [
                threading.Thread(target=lambda s=stream, ls=lines: ls.extend(s), daemon=True)
                for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
            ]
            for t in self.readers:
                t.start()
        else:
            self.cid = subprocess.run(argv, env=penv, capture_output=True, text=True, check=True).stdout.strip()

    def output(self) -> str:
        if self.ep.mode == "container":
            assert self.ep.sandbox is not None
            return self.ep.sandbox.docker("logs", self.cid).stdout
        return "".join(self.out)

    def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while text not in (out := self.output()):
            assert time.monotonic() < deadline, f"never printed {text!r}: {out!r}"
            time.sleep(0.05)
        return out

    def send(self, sig: int) -> None:
        if self.ep.mode == "host":
            self.proc.send_signal(sig)
        else:
            assert self.ep.sandbox is not None
            self.ep.sandbox.docker("kill", "-s", str(int(sig)), self.cid, check=True)

    def wait(self, timeout: float = 60) -> int:
        if self.ep.mode == "host":
            code = self.proc.wait(timeout=timeout)
            for t in self.readers:  # everything it printed, read
                t.join(timeout=10)
            return code
        assert self.ep.sandbox is not None
        return int(self.ep.sandbox.docker("wait", self.cid, check=True, timeout=timeout).stdout.strip())

    def stderr(self) -> str:
        if self.ep.mode == "host":
            return "".join(self.err)
        assert self.ep.sandbox is not None
        return self.ep.sandbox.docker("logs", self.cid).stderr

    def close(self) -> None:
        if self.ep.mode == "host":
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        elif self.ep.sandbox is not None:
            self.ep.sandbox.docker("rm", "-f", self.cid)


def start(
    ep: Entrypoint,
    started: list[Running],
    *args: str,
    env: dict[str, str] | None = None,
    watch: tuple[str, ...] = WATCH,
    docker_args: tuple[str, ...] = (),
) -> Running:
    r = Running(ep, *args, env=env, watch=watch, docker_args=docker_args)
    started.append(r)
    return r


class Faults:
    """The fake NVML's fault file (FAKEGPU_FAULTS, re-read at every call), in a folder a container sees too."""

    MOUNT = "/fakegpu-faults"

    def __init__(self, ep: Entrypoint, tmp_path: Path) -> None:
        self.dir = tmp_path / "faults"
        self.dir.mkdir()
        self.path = self.dir / "faults.json"
        inside = self.path if ep.mode == "host" else Path(self.MOUNT, self.path.name)
        self.env = {**PIN, "FAKEGPU_FAULTS": str(inside)}
        # The folder, not the file: a file replaced under a bind mount would not be seen through it.
        self.docker_args = () if ep.mode == "host" else ("-v", f"{self.dir}:{self.MOUNT}:ro")

    def plant(self, faults: dict[str, object]) -> float:
        """Write the faults atomically; return when (time.monotonic())."""
        tmp = self.dir / ".faults.json.tmp"
        tmp.write_text(json.dumps(faults))
        os.replace(tmp, self.path)
        return time.monotonic()


LOOPING = "trap 'echo workload got TERM; exit 5' TERM; echo ready; while :; do sleep 0.05; done"


def loss_line(err: str) -> str:
    line = one_error_line(err)
    assert line.startswith("gpupin-entrypoint: ERROR: a pinned card was lost while the workload ran: "), line
    assert "HINT: start the container again" in line and "--restart on-failure" in line, line
    assert "`hostagent doctor`" in line, line
    return line

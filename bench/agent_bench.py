"""`make bench`'s `agent` part: the resident agent's (`hostagent serve`) resident memory at rest, after start-up on
the simulated four-card host, and again after N pinned containers were churned through the daemon (created,
started, exited, removed, a few at a time), with what its answers take (GET /api/ls and GET /metrics over HTTP,
medians). The memory is VmRSS, what `ps` and the OOM killer count; the soak test holds its growth over 500
containers to less than 10 MB (tests/docker/test_serve_soak.py)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

MIB = 2**20
PARALLEL = 4  # containers in flight at once


class ResidentAgent:
    """`hostagent serve` on a socket of the bench's own (no HTTP), for the runs through the agent."""

    def __init__(self, env: dict[str, str], hostagent: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpupin-bench-agent-"))
        self.socket = str(self.dir / "agent.sock")
        self.proc = subprocess.Popen(
            [hostagent, "serve", "--socket", self.socket, "--http", "none", "--record", str(self.dir / "record.db")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(
                    f"bench: hostagent serve did not listen: {self.proc.stderr.read().decode()[-500:]}"
                    if self.proc.stderr
                    else "bench: hostagent serve did not listen"
                )
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:"))) * 1024


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def _wait(ready: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        time.sleep(0.1)


def _held(port: int) -> int:
    status, body = _get(port, "/api/ls")
    return sum(len(g["holders"]) for g in json.loads(body)["gpus"]) if status == 200 else -1


def _answers(port: int) -> bool:
    try:
        return _get(port, "/api/agent")[0] == 200
    except OSError:
        return False


def _churn(host: str, image: str, count: int, uuids: list[str]) -> None:
    """`count` pinned containers (docker's own `--gpus device=U` with gpupin's label), `PARALLEL` at a time."""
    import docker

    api = docker.APIClient(base_url=host, version="auto", timeout=120)
    left = iter(range(count))
    lock = threading.Lock()
    errors: list[str] = []

    def work() -> None:
        while True:
            with lock:
                i = next(left, None)
            if i is None:
                return
            card = uuids[i % len(uuids)]
            try:
                c = api.create_container(
                    image,
                    [],
                    entrypoint=["true"],
                    labels={"gpupin.devices": card, "gpupin.bench": "agent"},
                    host_config=api.create_host_config(
                        network_mode="none",
                        device_requests=[
                            docker.types.DeviceRequest(driver="nvidia", device_ids=[card], capabilities=[["gpu"]])
                        ],
                    ),
                )
                api.start(c["Id"])
                api.wait(c["Id"], timeout=120)
                api.remove_container(c["Id"])
            except Exception as err:
                errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=work) for _ in range(PARALLEL)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"bench: {len(errors)} of {count} containers failed: {errors[0]}")


def bench_agent(
    results: dict[str, object],
    env: dict[str, str],
    hostagent: str,
    image: str,
    prefix: str = "",
    containers: int = 100,
    n: int = 30,
) -> None:
    topo = json.loads(Path(env["FAKEGPU_TOPOLOGY"]).read_text())
    uuids = [g["uuid"] for i, g in enumerate(topo["gpus"]) if i != 2]  # card 2 runs a host process in mixed-4
    folder = tempfile.mkdtemp(prefix="gpupin-bench-agent-")
    port = _port()
    agent = subprocess.Popen(
        [
            hostagent,
            "serve",
            "--socket",
            f"{folder}/agent.sock",
            "--http",
            f"127.0.0.1:{port}",
            "--record",
            f"{folder}/record.db",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(lambda: _answers(port), 30, "the agent to answer")
        # At rest: the daemon's event stream open (its thread imports the docker SDK), and each route served once
        # (what a first client makes it import).
        _wait(lambda: json.loads(_get(port, "/api/agent")[1])["events_followed"], 30, "the agent to follow events")
        for path in ("/api/ls", "/metrics", "/api/agent"):
            _get(port, path)
        rest = _rss(agent.pid)
        t0 = time.perf_counter()
        _churn(env["DOCKER_HOST"], image, containers, uuids)
        churned = time.perf_counter() - t0
        _wait(lambda: _held(port) == 0, 30, "the agent to show no holder left")
        after = _rss(agent.pid)
        took = {}
        for path in ("/api/ls", "/metrics"):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                status, _ = _get(port, path)
                times.append(time.perf_counter() - t)
                if status != 200:
                    raise SystemExit(f"bench: the agent answered {path} with {status}")
            took[path] = statistics.median(times)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.communicate()
        # Its record (and a socket left by an agent that did not stop in time): the folder is the bench's own.
        shutil.rmtree(folder, ignore_errors=True)
    growth = after - rest
    print(
        f"{prefix + 'hostagent serve: resident memory':<44} {rest / MIB:8.1f} MiB at rest, {after / MIB:.1f} MiB "
        f"after {containers} containers churned ({growth / MIB:+.2f} MiB; churned in {churned:.0f} s)",
        flush=True,
    )
    print(
        f"{prefix + 'hostagent serve: answers (medians of ' + str(n) + ')':<44} GET /api/ls "
        f"{took['/api/ls'] * 1000:.2f} ms, GET /metrics {took['/metrics'] * 1000:.2f} ms",
        flush=True,
    )
    results[f"{prefix}hostagent serve: resident memory"] = {
        "rest_mib": round(rest / MIB, 2),
        "after_mib": round(after / MIB, 2),
        "containers": containers,
        "growth_mib": round(growth / MIB, 2),
        "cell": f"{rest / MIB:.1f} MiB at rest, {after / MIB:.1f} MiB after {containers} ({growth / MIB:+.2f})",
    }
    results[f"{prefix}hostagent serve: answers"] = {
        "api_ls_ms": round(took["/api/ls"] * 1000, 2),
        "metrics_ms": round(took["/metrics"] * 1000, 2),
        "cell": f"/api/ls {took['/api/ls'] * 1000:.2f} ms, /metrics {took['/metrics'] * 1000:.2f} ms",
    }

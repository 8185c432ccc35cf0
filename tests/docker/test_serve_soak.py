"""The agent under churn, on every engine at once: pinned containers created, started, exited and removed while
Prometheus-like scrapes and a dashboard's event stream read it, and the agent's resident memory grows by less than
10 MB (docs/serve.md, "What survives what"), its open files and threads not at all.

Two lengths, one pace (500 containers in 10 minutes, one every 1.2 s per engine): `make soak` runs the full one,
500 containers over 600 s (GPUPIN_SOAK_SECONDS=600); `make test` and CI the short one, 75 over 90 s, the default.
Both keep every assertion: a leak of a file, a thread or a socket per container or per event counts tens at the
least, and the memory bound is the same.

Bounded by count and time alike. The i-th container starts no earlier than i/CONTAINERS of the way through the
soak, so the churn covers the whole soak rather than a burst at its start; the soak ends when the last one is
removed. A machine that cannot keep that pace fails the test (a quarter of the duration late, at most): a shorter
churn would pass for a soak it is not. GPUPIN_SOAK_SECONDS and GPUPIN_SOAK_CONTAINERS (by default the pace's count
for that length) scale it; `-m soak` selects it. The engines churn concurrently, each with its own agent, so the
soak costs the suite its duration once, not once per engine.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent, Sandboxes, agent_on, engines_under_test
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

pytestmark = pytest.mark.soak

PACE = 500 / 600  # containers a second, per engine
SECONDS = float(os.environ.get("GPUPIN_SOAK_SECONDS", "90"))
CONTAINERS = int(os.environ.get("GPUPIN_SOAK_CONTAINERS", str(round(SECONDS * PACE))))
GROWTH_LIMIT = 10 * 2**20  # bytes of resident memory the agent may gain over the soak
LATE = 0.25  # how far past SECONDS (as a share of it) the last container may end
WORKERS = 4  # containers in flight per engine: a lifecycle takes ~1.4 s here, the pace asks one every 1.2 s
PROBES = 10  # containers started through `hostagent run` and waited for in the agent's view, spread over the soak
WARMUP = 0.1  # the share of the containers churned before the baseline is taken
SLACK = 8  # open files, or threads, the agent may hold beyond its baseline at the end (requests in flight)
A800, RTX, A800B, A800C = uuids("mixed-4")
CHURN_CARDS = (A800, A800C)  # card 1 is the probes' (hostagent run refuses a held card); card 2 is busy (pid 4242)


class Soak:
    """One engine's soak: its agent, the churn, the readers, and what they saw."""

    def __init__(self, agent: Agent, resident: Resident) -> None:
        import docker

        self.agent = agent
        self.resident = resident
        self.api = docker.APIClient(base_url=agent.sandbox.host, version="auto", timeout=120)
        self.next = 0  # the next container's number
        self.lock = threading.Lock()
        self.done = 0
        self.warm = threading.Event()
        self.errors: list[str] = []
        self.names: set[str] = set()  # every container churned
        self.seen: set[str] = set()  # every holder the event stream showed
        self.events = 0
        self.scrapes = 0
        self.rss: list[tuple[float, int]] = []
        self.stop = threading.Event()

    # --- the churn ---

    def take(self) -> int | None:
        with self.lock:
            if self.next >= CONTAINERS:
                return None
            self.next += 1
            return self.next - 1

    def churn(self, started: float, deadline: float) -> None:
        while not self.stop.is_set() and (i := self.take()) is not None:
            self.stop.wait(max(0.0, started + i * SECONDS / CONTAINERS - time.monotonic()))
            if time.monotonic() > deadline:
                return
            name = f"soak-{self.agent.tag}-{i}"
            try:
                self.probe(name) if i % max(CONTAINERS // PROBES, 1) == PROBES // 2 else self.one(name, i)
            except Exception as err:  # the soak goes on; the test fails at its end with every error seen
                self.errors.append(f"{name}: {type(err).__name__}: {err}")
            with self.lock:
                self.names.add(name)
                self.done += 1
                if self.done == int(CONTAINERS * WARMUP):
                    self.warm.set()

    def one(self, name: str, i: int) -> None:
        """A pinned container as docker itself makes it (`--gpus device=U`) with gpupin's label, through its
        life: created, started, run for a second, exited, removed."""
        import docker

        card = CHURN_CARDS[i % len(CHURN_CARDS)]
        c = self.api.create_container(
            TEST_IMAGE,
            ["1"],
            entrypoint=["sleep"],
            name=name,
            labels={"gpupin.devices": card, "gpupin.test": self.agent.tag},
            host_config=self.api.create_host_config(
                network_mode="none",
                device_requests=[
                    docker.types.DeviceRequest(driver="nvidia", device_ids=[card], capabilities=[["gpu"]])
                ],
            ),
        )
        self.api.start(c["Id"])
        self.api.wait(c["Id"], timeout=120)
        self.api.remove_container(c["Id"])

    def probe(self, name: str) -> None:
        """A container that `hostagent run` pins, shown as its card's holder, then gone from the view: the
        agent follows the daemon all through the soak, not only at its start."""
        r = self.agent("run", "-d", "--name", name, "--gpu", "1", TEST_IMAGE, "sleep", "300")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: name in holders(self.resident, RTX), 30, f"{name} in the agent's view")
        self.api.remove_container(name, force=True)
        wait_for(lambda: name not in holders(self.resident, RTX), 30, f"{name} gone from the agent's view")

    # --- the readers ---

    def scrape(self) -> None:
        """What Prometheus, a script and the dashboard do: /metrics, /api/ls, /api/agent and the cards' last hour
        (/api/samples, which the agent keeps all along) once a second."""
        while not self.stop.wait(1.0):
            for path in ("/metrics", "/api/ls", "/api/agent", "/api/samples"):
                with contextlib.suppress(OSError):
                    self.resident.get(path)
            self.scrapes += 1

    def follow(self) -> None:
        """A dashboard's event stream, open all through the soak: the holders each event shows."""
        conn = http.client.HTTPConnection("127.0.0.1", self.resident.port, timeout=30)
        conn.request("GET", "/api/events")
        res = conn.getresponse()
        try:
            while not self.stop.is_set():
                line = res.fp.readline()
                if not line:
                    return
                if line.startswith(b"data: "):
                    self.events += 1
                    view = json.loads(line[6:])
                    self.seen.update(h["name"] for g in view.get("gpus", ()) for h in g["holders"])
        except OSError:
            pass
        finally:
            conn.close()

    def sample(self) -> None:
        while not self.stop.wait(5.0):
            self.rss.append((time.monotonic(), self.resident.rss()))


def holders(r: Resident, uuid: str) -> list[str]:
    return [h["name"] for h in r.card(uuid)["holders"] if h["holds"]]


def no_holder_left(r: Resident) -> dict[str, Any]:
    """The agent's view when no card has a holder left, else nothing (to wait on)."""
    view = r.ls()
    return {} if any(g["holders"] for g in view["gpus"]) else view


@pytest.fixture
def soaks(sandboxes: Sandboxes) -> Iterator[list[Soak]]:
    with contextlib.ExitStack() as stack:
        out = []
        for engine in engines_under_test():
            agent = stack.enter_context(contextlib.contextmanager(agent_on)(sandboxes.get(engine)))
            resident = Resident(agent.env)
            stack.callback(resident.close)
            out.append(Soak(agent, resident))
        yield out


# The churn's length, a quarter late at most, the containers in flight at its end (130 s) and the fixtures.
@pytest.mark.needs("gpus")
@pytest.mark.timeout(SECONDS * (1 + LATE) + 300)
@pytest.mark.per_engine  # it churns every engine of its run: side by side, each run its own
def test_churned_containers_grow_the_agent_by_less_than_10_mb(soaks: list[Soak]) -> None:
    started = time.monotonic()
    deadline = started + SECONDS * (1 + LATE)
    threads = [
        threading.Thread(target=target, daemon=True, name=f"{s.agent.sandbox.engine}-{target.__name__}")
        for s in soaks
        for target in (s.scrape, s.follow, s.sample)
    ]
    churners = [
        threading.Thread(target=s.churn, args=(started, deadline), daemon=True) for s in soaks for _ in range(WORKERS)
    ]
    for t in threads + churners:
        t.start()
    baseline, files = {}, {}
    for s in soaks:
        s.warm.wait(max(0.0, deadline - time.monotonic()))
        baseline[s.agent.sandbox.engine] = s.resident.rss()
        files[s.agent.sandbox.engine] = (s.resident.fds(), s.resident.threads())
    for t in churners:
        t.join(max(0.0, deadline - time.monotonic()) + 130)  # a container in flight ends within its timeouts
    took = time.monotonic() - started
    for s in soaks:
        engine = s.agent.sandbox.engine
        # All gone from the view: no holder left on any card, and its series with them.
        view = wait_for(functools.partial(no_holder_left, s.resident), 30, f"[{engine}] no holder left")
        assert view["docker"]["available"] and json.loads(s.resident.get("/api/agent")[1])["events_followed"]
        assert b"gpupin_holder_info{" not in s.resident.get("/metrics")[1]
        end = s.resident.rss()
        fds, tasks = s.resident.fds(), s.resident.threads()
        s.stop.set()
        peak = max([r for _, r in s.rss] + [end])
        print(
            f"\n[{engine}] soak: {s.done} containers in {took:.0f} s, {s.events} events streamed, "
            f"{len(s.seen & s.names)} of them seen holding, {s.scrapes} scrapes; agent RSS "
            f"{baseline[engine] / 2**20:.1f} MiB after {int(CONTAINERS * WARMUP)}, {end / 2**20:.1f} MiB at the end "
            f"(+{(end - baseline[engine]) / 2**20:.2f} MiB), peak {peak / 2**20:.1f} MiB; open files "
            f"{files[engine][0]} then {fds}, threads {files[engine][1]} then {tasks}"
        )
        assert not s.errors, s.errors[:5]
        assert s.done == CONTAINERS, f"[{engine}] only {s.done} of {CONTAINERS} containers in {took:.0f} s"
        # The view followed: most containers, alive a second each, were shown holding as they ran.
        assert len(s.seen & s.names) >= CONTAINERS // 2, f"[{engine}] {len(s.seen & s.names)} seen holding"
        assert end - baseline[engine] < GROWTH_LIMIT, (engine, baseline[engine], end, s.rss)
        # Nor files or threads: a socket or a thread kept per container, event or scrape would count hundreds.
        # (A scrape in flight at either moment holds a connection and its thread: a few more are allowed.)
        assert fds <= files[engine][0] + SLACK and tasks <= files[engine][1] + SLACK, (
            engine,
            files[engine],
            fds,
            tasks,
        )
    assert took <= SECONDS * (1 + LATE), f"the churn took {took:.0f} s for {SECONDS:.0f} s asked"

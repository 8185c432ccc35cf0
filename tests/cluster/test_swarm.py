"""Docker Swarm with GPUs on a real three-node swarm (tests/sandbox/swarm.sh: manager mixed-4, worker1 dgx-8,
worker2 mig) whose nodes are configured from what `hostagent swarm node-config` prints
(tests/unit/test_swarm.py tests that command itself). Swarm's own accounting gives each card to one task, each
task gets its own DOCKER_RESOURCE_GPU, the NVIDIA runtime (faked at its boundary) exposes just that card, and
gpupin-entrypoint proves it; the NVIDIA-GPU naming trap is reproduced on one node and diagnosed by --check."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.hostagent.authz.grant import LABEL
from gpupin.hostagent.engine import created_time
from gpupin.hostagent.swarm.resources import from_engine
from tests.support import authz
from tests.support.host import HOSTAGENT, REPO, hostagent, simhost_env
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Sandboxes
from tests.support.scenarios import swarm_resources, topology
from tests.support.wait import wait_for

SWARM_SCRIPT = REPO / "tests" / "sandbox" / "swarm.sh"
TRAPPED = "worker1"
CUDA_LIKE = "gpupin:all-cards"  # gpupin:test with a CUDA image's NVIDIA_VISIBLE_DEVICES=all


# --- the cluster ----------------------------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    host: str
    topology: str
    address: str
    kind: str

    @property
    def run_dir(self) -> Path:
        return Path(self.host.removeprefix("unix://")).parent

    @property
    def engine(self) -> str:  # tests.support.authz's messages
        return f"20.10 ({self.name})"

    def check(self, *args: str) -> subprocess.CompletedProcess[str]:
        return hostagent(
            "swarm",
            "node-config",
            "--check",
            "--daemon-json",
            str(self.run_dir / "daemon.json"),
            "--toolkit-config",
            str(self.run_dir / "nvidia-container-runtime" / "config.toml"),
            *args,
            scenario_name=self.topology,
            timeout=60,
        )


class Cluster:
    """The swarm of tests/sandbox/swarm.sh, driven by the real docker CLI against each node's own socket."""

    def __init__(self, image_source: str, docker_cli: str) -> None:
        self.image_source = image_source
        self.docker_cli = docker_cli
        self.nodes: dict[str, Node] = {}

    def up(self, trap: str = "") -> None:
        env = dict(os.environ, GPUPIN_SWARM_IMAGE_SOURCE=self.image_source, GPUPIN_SWARM_TRAP=trap)
        r = subprocess.run([str(SWARM_SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.fail(f"swarm.sh up failed ({r.returncode}):\n{r.stderr}", pytrace=False)
        self.nodes = {}
        for line in r.stdout.splitlines():
            head, address, kind = line.rsplit(None, 2)
            name, host, topo = head.split(None, 2)  # the topology's path may hold spaces
            self.nodes[name] = Node(name, host, Path(topo).stem, address, kind)

    def down(self) -> None:
        subprocess.run([str(SWARM_SCRIPT), "down"], capture_output=True, timeout=300)

    def docker(self, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [self.docker_cli, "-H", self.nodes[node].host, *args], capture_output=True, text=True, timeout=120
        )
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:3])} on {node}: {r.stderr.strip()}")
        return r

    def manager(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.docker("manager", *args, check=check)

    def tasks(self, service: str, every: bool = False) -> list[dict[str, str]]:
        """The service's current tasks (desired state running; `every`: its history too), as `docker service ps`
        reports them."""
        current = () if every else ("--filter", "desired-state=running")
        out = self.manager("service", "ps", service, "--no-trunc", *current, "--format", "{{json .}}").stdout
        return [json.loads(line) for line in out.splitlines()]

    def printed(self, service: str, running: bool = True) -> list[tuple[str, dict[str, Any]]]:
        """Every JSON line the service's containers (running ones, or all) have printed so far, with the node."""
        found = []
        for node in self.nodes:
            ids = self.docker(
                node,
                "ps",
                "-q",
                *(() if running else ("-a",)),
                "--filter",
                f"label=com.docker.swarm.service.name={service}",
            ).stdout
            for cid in ids.split():
                logs = self.docker(node, "logs", cid)
                found += [(node, json.loads(x)) for x in (logs.stdout + logs.stderr).splitlines() if x.startswith("{")]
        return found

    def probes(self, service: str) -> list[tuple[str, dict[str, Any]]]:
        """What each running task of the service has printed so far (PROBE's JSON line), with its node."""
        return [(node, x) for node, x in self.printed(service) if "env" in x]

    def reports(self, service: str) -> list[tuple[str, dict[str, Any]]]:
        """gpupin-entrypoint's --json report of each running task (on stderr, as it is given a command)."""
        return [(node, x) for node, x in self.printed(service) if "level" in x and "devices" in x]

    def hostagent(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """hostagent on the manager's host, talking to the manager (whose cards NVML sees: mixed-4)."""
        r = subprocess.run(
            [HOSTAGENT, *args],
            env=simhost_env(self.nodes["manager"].topology, DOCKER_HOST=self.nodes["manager"].host),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"hostagent {' '.join(args)}: {r.returncode}: {r.stderr.strip()}")
        return r

    def ls(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.hostagent("ls", "--swarm", "--json").stdout)
        return data

    def node_op(self, op: str, node: str) -> None:
        """swarm.sh stop-node|start-node NODE."""
        subprocess.run([str(SWARM_SCRIPT), op, node], check=True, capture_output=True, timeout=120)

    def containers_gone(self, label: str, timeout: float = 60) -> None:
        wait_for(
            lambda: (
                not any(
                    self.docker(n, "ps", "-aq", "--filter", f"label={label}").stdout.strip()
                    for n in self.nodes
                    if self.docker(n, "version", check=False).returncode == 0
                )
            ),
            timeout,
            f"the containers labelled {label} to go",
        )

    @contextmanager
    def stack(self, name: str, source: str, *render_args: str, tmp: Path) -> Iterator[str]:
        """`hostagent compose render --swarm` of `source` (a compose file's text), then `docker stack deploy` of the
        rendered file on the manager, removed afterwards. Yields the rendered file's path."""
        (tmp / f"{name}.yml").write_text(source)
        rendered = tmp / f"{name}.stack.yml"
        self.hostagent("compose", "render", "--swarm", *render_args, str(tmp / f"{name}.yml"), "-o", str(rendered))
        self.manager("stack", "deploy", "--resolve-image", "never", "-c", str(rendered), name)
        try:
            yield str(rendered)
        finally:
            self.manager("stack", "rm", name, check=False)
            self.containers_gone(f"com.docker.stack.namespace={name}")

    @contextmanager
    def service(self, name: str, *args: str) -> Iterator[str]:
        self.manager(
            "service", "create", "-d", "--name", name, "--restart-condition", "none", "--no-resolve-image", *args
        )
        try:
            yield name
        finally:
            self.manager("service", "rm", name, check=False)
            self.containers_gone(f"com.docker.swarm.service.name={name}")


# What a task reports of itself: Swarm's and the runtime's variables, and the cards and MIG devices its NVML sees.
PROBE = """
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
out = {"env": {k: v for k, v in os.environ.items() if k.startswith(("DOCKER_RESOURCE_", "NVIDIA_", "CUDA_", "SWARM_"))}}
try:
    import pynvml as n
    n.nvmlInit()
    out["cards"], out["migs"] = [], []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        out["cards"].append(n.nvmlDeviceGetUUID(h))
        if n.nvmlDeviceGetMigMode(h)[0]:
            for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    out["migs"].append(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
                except n.NVMLError:
                    pass
except Exception as e:
    out["error"] = str(e)
print(json.dumps(out), flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="session")
def swarm(sandboxes: Sandboxes) -> Iterator[Cluster]:
    """The three-node swarm of Debian 12 daemons, started once (gpupin:test comes from the 20.10 sandbox) and
    stopped at the end."""
    source = sandboxes.get("20.10")
    cluster = Cluster(source.host, source.docker_cli)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def all_resources(cluster: Cluster) -> dict[str, str]:
    """Every card of the swarm: advertised value -> node."""
    return {u: node.name for node in cluster.nodes.values() for u in swarm_resources(node.topology)}


def parent_of(uuid: str, topology_name: str) -> str:
    return next(
        str(g["uuid"])
        for g in topology(topology_name)["gpus"]
        if uuid == g["uuid"] or uuid in [d["uuid"] for d in (g.get("mig") or {}).get("devices", [])]
    )


def test_three_nodes_joined_with_their_generic_resources(swarm: Cluster) -> None:
    rows = [json.loads(x) for x in swarm.manager("node", "ls", "--format", "{{json .}}").stdout.splitlines()]
    assert sorted((r["Hostname"], r["Status"], r["ManagerStatus"]) for r in rows) == [
        ("manager", "Ready", "Leader"),
        ("worker1", "Ready", ""),
        ("worker2", "Ready", ""),
    ]
    for node in swarm.nodes.values():
        described = json.loads(
            swarm.manager(
                "node", "inspect", node.name, "--format", "{{json .Description.Resources.GenericResources}}"
            ).stdout
        )
        assert [(r.kind, r.value, r.discrete) for r in from_engine(described)] == [
            ("GPU", u, False) for u in swarm_resources(node.topology)
        ], node.name
    # The nodes joined at the addresses the setup made inside their namespaces; the host's own namespace has none.
    for node in swarm.nodes.values():
        assert (
            swarm.manager("node", "inspect", node.name, "--format", "{{.Status.Addr}}").stdout.strip() == node.address
        )
        host_addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
        assert f" {node.address}/" not in host_addresses


def compose_source(
    service: str,
    replicas: int,
    body: str = "x-gpupin: {count: 1}",
    command: str = PROBE,
    entrypoint: tuple[str, ...] = ("gpupin-entrypoint", "--json"),
    environment: dict[str, str] | None = None,
) -> str:
    """A compose file as a user writes it for the swarm: x-gpupin asks for a count, replicas for more tasks. Its
    tasks use the host's network (the sandboxed daemons make no overlay network), are not restarted, and know their
    task ID (a service template the daemon fills in)."""
    svc: dict[str, Any] = {
        "image": TEST_IMAGE,
        "entrypoint": list(entrypoint),
        "command": ["python3", "-c", command],
        "environment": {"SWARM_TASK_ID": "{{.Task.ID}}", **(environment or {})},
        "deploy": {"replicas": replicas, "restart_policy": {"condition": "none"}},
        "networks": ["hostnet"],
    }
    svc.update(yaml.safe_load(body) or {})
    doc = {"services": {service: svc}, "networks": {"hostnet": {"external": True, "name": "host"}}}
    return str(yaml.safe_dump(doc, sort_keys=False))


STACK = "gp"


def test_ls_swarm_from_a_worker_is_69_in_one_line(swarm: Cluster) -> None:
    worker = swarm.nodes["worker1"]
    r = subprocess.run(
        [HOSTAGENT, "ls", "--swarm"],
        env=simhost_env(worker.topology, DOCKER_HOST=worker.host),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout) == (69, "")
    assert r.stderr.startswith(
        f"hostagent: ERROR: the Docker daemon at {worker.host} is not a swarm manager: it is a worker of a swarm (node "
    )
    assert r.stderr.endswith("HINT: point DOCKER_HOST at a manager of the swarm (`docker node ls` works there)\n")
    assert r.stderr.count("\n") == 1


@pytest.fixture(scope="class")
def every_card(swarm: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`hostagent compose render --swarm` of a compose file with one replica per card of the swarm (x-gpupin
    count 1), deployed with `docker stack deploy`; each task runs PROBE behind gpupin-entrypoint --json."""
    n = len(all_resources(swarm))
    tmp = tmp_path_factory.mktemp("every-card")
    with swarm.stack(STACK, compose_source("every-card", n), tmp=tmp):
        name = f"{STACK}_every-card"
        wait_for(
            lambda: (
                sum(t["CurrentState"].startswith("Running") for t in swarm.tasks(name)) == n
                and len(swarm.probes(name)) == n
            ),
            180,
            f"{n} running tasks",
        )
        yield name, n


class TestEveryCard:
    """A rendered stack with one replica per card of the swarm (torn down before the trap reconfigures a node)."""

    def test_the_rendered_stack_reserves_one_card_per_task(self, swarm: Cluster, every_card: tuple[str, int]) -> None:
        name, n = every_card
        spec = json.loads(swarm.manager("service", "inspect", name, "--format", "{{json .Spec}}").stdout)
        task = spec["TaskTemplate"]
        assert task["Resources"]["Reservations"]["GenericResources"] == [
            {"DiscreteResourceSpec": {"Kind": "GPU", "Value": 1}}
        ]
        assert spec["Mode"] == {"Replicated": {"Replicas": n}}
        assert "GPUPIN_REQUIRE=1" in task["ContainerSpec"]["Env"]

    def test_each_task_gets_its_own_card_and_sees_only_it(self, swarm: Cluster, every_card: tuple[str, int]) -> None:
        name, n = every_card
        cards = all_resources(swarm)
        probes = swarm.probes(name)
        given = [p["env"].get("DOCKER_RESOURCE_GPU") for _, p in probes]
        assert sorted(given) == sorted(cards), "each card to exactly one task"
        for node, p in probes:
            uuid = p["env"]["DOCKER_RESOURCE_GPU"]
            assert cards[uuid] == node, f"{uuid} is a card of {cards[uuid]}, its task ran on {node}"
            topo = swarm.nodes[node].topology
            if uuid.startswith("MIG-"):
                assert (p["cards"], p["migs"]) == ([parent_of(uuid, topo)], [uuid]), p
            else:
                assert (p["cards"], p["migs"]) == ([uuid], []), p
            # gpupin-entrypoint took the expectation from DOCKER_RESOURCE_GPU, proved cuda:0 and let the task run.
            assert p["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "NVIDIA_VISIBLE_DEVICES" not in p["env"], p
        assert len(probes) == n

    def test_each_task_proves_its_card_from_inside(self, swarm: Cluster, every_card: tuple[str, int]) -> None:
        """The entrypoint's own report (--json) in every task: the CUDA driver under the final environment said
        cuda:0 is the card Swarm gave the task."""
        name, n = every_card
        reports = swarm.reports(name)
        assert len(reports) == n
        proved = set()
        for node, r in reports:
            assert (r["level"], r["source"]) == ("cuda", "DOCKER_RESOURCE_GPU"), r
            (dev,) = r["devices"]
            assert (dev["cuda"], dev["uuid"]) == ("cuda:0", r["expectation"].split("@")[0]), r
            assert all_resources(swarm)[dev["uuid"]] == node
            proved.add(dev["uuid"])
        assert proved == set(all_resources(swarm))

    def test_ls_swarm_shows_every_card_held_and_agrees_with_docker(
        self, swarm: Cluster, every_card: tuple[str, int]
    ) -> None:
        name, n = every_card
        data = swarm.ls()
        assert data["summary"] == {"nodes": 3, "resources": n, "held": n, "free": 0, "pending": 0}
        holders = {(nd["hostname"], r["value"]): r["held_by"] for nd in data["nodes"] for r in nd["resources"]}
        # The same facts from the docker CLI: `docker node ls` for the nodes, `docker service ps` for the tasks.
        nodes = {
            json.loads(x)["Hostname"] for x in swarm.manager("node", "ls", "--format", "{{json .}}").stdout.splitlines()
        }
        assert {nd["hostname"] for nd in data["nodes"]} == nodes
        running = {(t["Name"], t["Node"]) for t in swarm.tasks(name) if t["CurrentState"].startswith("Running")}
        assert {(h["name"], h["node"]) for h in holders.values() if h} == running
        # Each holder is the task that says, from inside, that it has that card.
        inside = {p["env"]["SWARM_TASK_ID"]: p["env"]["DOCKER_RESOURCE_GPU"] for _, p in swarm.probes(name)}
        assert {h["id"]: value for (_, value), h in holders.items() if h} == inside
        # The manager's own cards are resolved through NVML; the workers' are shown by UUID.
        manager = next(nd for nd in data["nodes"] if nd["hostname"] == "manager")
        assert manager["self"] and [r["card"]["bus_id"] for r in manager["resources"]] == [
            "00000000:1B:00.0",
            "00000000:3B:00.0",
            "00000000:86:00.0",
            "00000000:AF:00.0",
        ]
        text = swarm.hostagent("ls", "--swarm").stdout
        assert text.splitlines()[-1] == f"3 node(s), {n} advertised resource(s): {n} held, 0 free; 0 task(s) pending"

    def test_hostagent_run_on_a_node_does_not_take_a_card_a_task_holds(
        self, swarm: Cluster, every_card: tuple[str, int]
    ) -> None:
        """The node's own ledger (`hostagent ls`, `run`) counts what Swarm gave its tasks (DOCKER_RESOURCE_GPU under
        the nvidia runtime): a local run on a busy swarm node waits or refuses, it never shares a task's card."""
        name, _ = every_card
        data = json.loads(swarm.hostagent("ls", "--json").stdout)
        held = {g["uuid"]: [(gr["form"], h["name"]) for h in g["holders"] for gr in h["grants"]] for g in data["gpus"]}
        assert all(
            len(v) == 1 and v[0][0] == "swarm-resource" and v[0][1].startswith(f"{name}.") for v in held.values()
        ), held
        r = swarm.hostagent("run", "--dry-run", "--count", "1", TEST_IMAGE, "true", check=False)
        assert r.returncode == 75, r.stderr
        assert "--count 1: 0 of 4 card(s) are free" in r.stderr

    def test_one_replica_more_than_cards_stays_pending(
        self, swarm: Cluster, every_card: tuple[str, int], tmp_path: Path
    ) -> None:
        name, n = every_card
        before = sorted(p["env"]["DOCKER_RESOURCE_GPU"] for _, p in swarm.probes(name))
        # Rendered again with N + 1 replicas: render says one will wait, and the stack is updated in place.
        (tmp_path / "more.yml").write_text(compose_source("every-card", n + 1))
        r = swarm.hostagent("compose", "render", "--swarm", str(tmp_path / "more.yml"), "-o", str(tmp_path / "s.yml"))
        assert (
            f"warning: asks for {n + 1} replica(s) x 1 GPU, but the nodes it may run on now hold {n} such task(s) "
            "at a time" in r.stderr
        )
        swarm.manager("stack", "deploy", "--resolve-image", "never", "-c", str(tmp_path / "s.yml"), STACK)

        def pending() -> list[dict[str, str]]:
            return [
                t
                for t in swarm.tasks(name)
                if t["CurrentState"].startswith("Pending") and "insufficient resources on 3 nodes" in t["Error"]
            ]

        (extra,) = wait_for(pending, 60, "the extra task to be refused for want of resources")
        assert extra["Node"] == ""
        time.sleep(2)  # the scheduler retries; the task must stay pending and no card may be given twice
        assert len(pending()) == 1
        running = [t for t in swarm.tasks(name) if t["CurrentState"].startswith("Running")]
        assert len(running) == n
        assert sorted(p["env"]["DOCKER_RESOURCE_GPU"] for _, p in swarm.probes(name)) == before
        # ls --swarm says which task waits and why, in Swarm's words.
        data = swarm.ls()
        assert [(p["name"], p["reserves"]) for p in data["pending"]] == [(extra["Name"], ["GPU=1"])]
        assert "no suitable node (insufficient resources on 3 nodes)" in data["pending"][0]["why"]
        assert data["summary"]["free"] == 0 and data["summary"]["pending"] == 1
        text = swarm.hostagent("ls", "--swarm").stdout
        assert (
            f"PENDING  {extra['Name']} ({extra['ID'][:12]}) (reserves GPU=1): no suitable node (insufficient "
            "resources on 3 nodes)" in text
        )
        swarm.manager("service", "scale", "-d", f"{name}={n}")


# A task that logs, every 0.2 s until it is stopped, which card Swarm gave it and which cards its NVML sees, to a
# file of its own in a folder every node mounts (the nodes share the host's file system and clock).
HOLDER = """
import json, os, signal, sys, time
import pynvml as n
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
n.nvmlInit()
seen = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    if not n.nvmlDeviceGetMigMode(h)[0]:
        seen.append(n.nvmlDeviceGetUUID(h))
        continue
    for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            seen.append(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
        except n.NVMLError:
            pass
task, gpu = os.environ["SWARM_TASK_ID"], os.environ["DOCKER_RESOURCE_GPU"]
with open(f"/holds/{task}.jsonl", "a", buffering=1) as f:
    while True:
        f.write(json.dumps({"t": time.time(), "task": task, "node": os.environ["SWARM_NODE"], "gpu": gpu,
                            "seen": seen}) + "\\n")
        time.sleep(0.2)
"""


class Hold:
    """One task's holding of its card, as the task logged it from inside."""

    def __init__(self, ticks: list[dict[str, Any]]) -> None:
        self.task = ticks[0]["task"]
        self.node = ticks[0]["node"]
        self.gpu = ticks[0]["gpu"]
        self.seen = {u for t in ticks for u in t["seen"]}
        self.start = ticks[0]["t"]
        self.end = ticks[-1]["t"]


def holds(folder: Path) -> list[Hold]:
    out = []
    for f in sorted(folder.glob("*.jsonl")):
        ticks = [json.loads(line) for line in f.read_text().splitlines() if line.endswith("}")]
        if ticks:
            out.append(Hold(ticks))
    return out


def running_on(swarm: Cluster, name: str) -> dict[str, int]:
    """How many of the service's tasks run on each node, as Swarm reports them."""
    out: dict[str, int] = {}
    for t in swarm.tasks(name):
        if t["CurrentState"].startswith("Running"):
            out[t["Node"]] = out.get(t["Node"], 0) + 1
    return out


def test_a_drained_then_stopped_worker_and_a_stopped_one_never_put_two_tasks_on_one_card(
    swarm: Cluster, tmp_path: Path
) -> None:
    """Four tasks of one GPU each. A worker with tasks is drained (they move to free cards elsewhere), then its
    daemon is stopped; then the other worker's daemon is stopped without a drain (Swarm reschedules its tasks once
    it marks the node down). Every task logs, from inside, the card it was given and the cards its NVML sees: no
    task ever sees another card than its own, and no card has two tasks logging at once over the whole run."""
    folder = tmp_path / "holds"
    folder.mkdir()
    folder.chmod(0o777)
    source = compose_source(
        "hold",
        4,
        command=HOLDER,
        entrypoint=("gpupin-entrypoint", "--quiet"),
        environment={"SWARM_NODE": "{{.Node.Hostname}}"},
    )
    doc = yaml.safe_load(source)
    svc = doc["services"]["hold"]
    svc["volumes"] = [f"{folder}:/holds"]
    svc["deploy"]["restart_policy"] = {"condition": "any", "delay": "0s"}  # a service meant to keep running
    stopped: list[str] = []
    name = "holds_hold"

    def ticking(n: int) -> bool:
        return sum(1 for h in holds(folder) if h.end > time.time() - 2) == n

    try:
        with swarm.stack("holds", yaml.safe_dump(doc, sort_keys=False), tmp=tmp_path):
            wait_for(lambda: sum(running_on(swarm, name).values()) == 4 and ticking(4), 120, "4 tasks holding")
            placed = running_on(swarm, name)
            drained = max(("worker1", "worker2"), key=lambda w: placed.get(w, 0))
            other = "worker2" if drained == "worker1" else "worker1"
            assert placed.get(drained), f"no task on a worker to move: {placed}"
            swarm.manager("node", "update", "--availability", "drain", drained)
            wait_for(
                lambda: (
                    drained not in running_on(swarm, name) and sum(running_on(swarm, name).values()) == 4 and ticking(4)
                ),
                120,
                f"the tasks of {drained} to move to other cards",
            )
            swarm.node_op("stop-node", drained)
            stopped.append(drained)
            wait_for(
                lambda: (
                    swarm.manager("node", "inspect", drained, "--format", "{{.Status.State}}").stdout.strip() == "down"
                ),
                60,
                f"{drained} to be down",
            )
            listing = {n["hostname"]: n for n in swarm.ls()["nodes"]}
            assert (listing[drained]["state"], listing[drained]["availability"]) == ("down", "drain")
            assert not any(r["held_by"] for r in listing[drained]["resources"])
            on_other = running_on(swarm, name).get(other, 0)
            swarm.node_op("stop-node", other)  # no drain: Swarm learns of it from the missed heartbeats
            stopped.append(other)
            wait_for(
                lambda: running_on(swarm, name).get("manager", 0) == 4 and ticking(4),
                120,
                f"the {on_other} task(s) of {other} to be rescheduled on the manager",
            )
            listing = {n["hostname"]: n for n in swarm.ls()["nodes"]}
            assert sum(1 for r in listing["manager"]["resources"] if r["held_by"]) == 4
            # What the stopped node ran (and did not report stopped before it went) is shown as it last reported it,
            # marked so in the text.
            assert listing[other]["state"] == "down"
            last = sum(1 for r in listing[other]["resources"] if r["held_by"])
            stale = [ln for ln in swarm.hostagent("ls", "--swarm").stdout.splitlines() if "[node down" in ln]
            assert len(stale) == last <= on_other, stale
            since = time.time()  # and the manager's four go on holding their cards, each its own
            wait_for(lambda: sum(1 for h in holds(folder) if h.end > since) == 4, 60, "the 4 tasks to hold on")
    finally:
        for node in stopped:
            swarm.node_op("start-node", node)
        swarm.manager("node", "update", "--availability", "active", "worker1", check=False)
        swarm.manager("node", "update", "--availability", "active", "worker2", check=False)
        wait_for(
            lambda: all(
                swarm.manager("node", "inspect", w, "--format", "{{.Status.State}}").stdout.strip() == "ready"
                for w in ("worker1", "worker2")
            ),
            60,
            "the workers back",
        )
    found = holds(folder)
    assert len(found) >= 4 + placed[drained] + on_other, [(h.task, h.node) for h in found]
    cards = all_resources(swarm)
    for h in found:
        assert h.seen == {h.gpu}, f"task {h.task} on {h.node} was given {h.gpu} but saw {h.seen}"
        assert cards[h.gpu] == h.node
    for gpu in {h.gpu for h in found}:
        spans = sorted((h.start, h.end, h.task) for h in found if h.gpu == gpu)
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            assert start > end, f"{gpu}: task {b} logged from {start:.2f} while task {a} logged until {end:.2f}"


def test_check_on_a_good_node(swarm: Cluster) -> None:
    for node in swarm.nodes.values():
        r = node.check()
        assert r.returncode == 0, r.stdout
        assert r.stdout.endswith(
            f"OK: {len(swarm_resources(node.topology))} GPU resource(s); tasks get them as "
            "DOCKER_RESOURCE_GPU, which the nvidia runtime reads\n"
        ), r.stdout


def test_docker_run_gpus_on_a_node_gets_the_hook_once(swarm: Cluster) -> None:
    """`--gpus` on a node whose default runtime is nvidia: Docker adds the hook, the runtime sees it there and adds
    none, so the card is exposed once, as asked."""
    uuid = swarm_resources("mixed-4")[1]
    listing = (
        "import pynvml as n; n.nvmlInit(); "
        "print([n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) for i in range(n.nvmlDeviceGetCount())])"
    )
    cid = swarm.docker(
        "manager", "run", "-d", "--gpus", f"device={uuid}", "--entrypoint", "python3", TEST_IMAGE, "-c", listing
    ).stdout.strip()
    try:
        assert swarm.docker("manager", "wait", cid).stdout.strip() == "0"
        assert swarm.docker("manager", "logs", cid).stdout.strip() == repr([uuid])
        assert swarm.docker("manager", "inspect", cid, "--format", "{{.HostConfig.Runtime}}").stdout.strip() == "nvidia"
        log = (swarm.nodes["manager"].run_dir / "hook.log").read_text().splitlines()
        calls = [e for e in map(json.loads, log) if e["container_id"] == cid]
        assert [(e["source"], e["exposed"]) for e in calls] == [("NVIDIA_VISIBLE_DEVICES", [uuid])]
    finally:
        swarm.docker("manager", "rm", "-f", cid, check=False)


@pytest.fixture
def trapped(swarm: Cluster) -> Iterator[Node]:
    """worker1 advertises its cards as Docker's example does (NVIDIA-GPU=<UUID>) while its runtime reads
    DOCKER_RESOURCE_GPU; the cluster is restored afterwards."""
    swarm.up(trap=TRAPPED)
    try:
        yield swarm.nodes[TRAPPED]
    finally:
        swarm.up()


def test_the_nvidia_gpu_trap_exposes_every_card(swarm: Cluster, trapped: Node, tmp_path: Path) -> None:
    assert trapped.kind == "NVIDIA-GPU"
    cards = swarm_resources(trapped.topology)
    # A CUDA image's NVIDIA_VISIBLE_DEVICES=all, and no gpupin-entrypoint: what the runtime alone gives the task.
    with swarm.service(
        "trap",
        "--replicas",
        "2",
        "--generic-resource",
        "NVIDIA-GPU=1",
        "-e",
        "NVIDIA_VISIBLE_DEVICES=all",
        "--entrypoint",
        "python3",
        TEST_IMAGE,
        "-c",
        PROBE,
    ) as name:
        probes = wait_for(lambda: found if len(found := swarm.probes(name)) == 2 else [], 120, "2 trapped tasks")
        given = sorted(p["env"]["DOCKER_RESOURCE_NVIDIA-GPU"] for _, p in probes)
        assert len(set(given)) == 2 and set(given) <= set(cards), "Swarm still accounts each card to one task"
        for node, p in probes:
            assert node == TRAPPED and p["cards"] == cards, "every task sees every card"
    r = trapped.check()
    assert r.returncode == 64
    assert (
        'swarm-resource = "DOCKER_RESOURCE_GPU", but this node advertises its cards as NVIDIA-GPU (tasks get '
        "DOCKER_RESOURCE_NVIDIA-GPU)" in r.stdout
    )
    # With gpupin-entrypoint (the image's ENTRYPOINT) the same task is refused before its command runs, and says why.
    # The image sets NVIDIA_VISIBLE_DEVICES=all, as CUDA's base images do (built on the trapped node, offline).
    subprocess.run(
        [swarm.docker_cli, "-H", trapped.host, "build", "-q", "-t", CUDA_LIKE, "-"],
        check=True,
        input=f"FROM {TEST_IMAGE}\nENV NVIDIA_VISIBLE_DEVICES=all\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    source = compose_source(
        "trap",
        1,
        command="print('the workload ran')",
        entrypoint=("gpupin-entrypoint",),
        body=f"x-gpupin: {{count: 1}}\nimage: '{CUDA_LIKE}'",
    )
    with swarm.stack("trapgp", source, "--kind", "NVIDIA-GPU", tmp=tmp_path):
        name = "trapgp_trap"
        (task,) = wait_for(
            lambda: [t for t in swarm.tasks(name, every=True) if t["CurrentState"].startswith("Failed")],
            120,
            "the trapped task to be refused",
        )
        assert task["Node"] == TRAPPED and "non-zero exit (78)" in task["Error"], task
        (cid,) = swarm.docker(
            TRAPPED, "ps", "-aq", "--filter", f"label=com.docker.swarm.service.name={name}"
        ).stdout.split()
        logs = swarm.docker(TRAPPED, "logs", cid)
        assert "the workload ran" not in logs.stdout
        (line,) = [ln for ln in logs.stderr.splitlines() if "ERROR:" in ln]
        assert line.startswith("gpupin-entrypoint: ERROR: DOCKER_RESOURCE_NVIDIA-GPU reserves GPU-"), line
        assert f"but it also sees {len(cards) - 1} device(s) it did not reserve" in line
        assert (
            "HINT: the NVIDIA runtime did not read DOCKER_RESOURCE_NVIDIA-GPU: the node advertises NVIDIA-GPU "
            "resources, but its runtime's swarm-resource does not name DOCKER_RESOURCE_NVIDIA-GPU, so it fell "
            "back to NVIDIA_VISIBLE_DEVICES (NVIDIA_VISIBLE_DEVICES='all' here); run `hostagent swarm "
            "node-config --check` on that node" in line
        )


def test_a_swarm_services_booking_is_ended_by_the_managers_agent(swarm: Cluster, tmp_path: Path) -> None:
    """x-gpupin: {count: 1, for: 8s} in a stack: the tasks carry the length as a label, and the agent of the manager
    scales the service to 0 once 8 s from the service's creation have passed (a task started again would renew
    nothing: the booking is the service's)."""
    m = swarm.nodes["manager"]
    agent = Resident(simhost_env(m.topology, DOCKER_HOST=m.host), "--interval", "0.2")
    name = "booked_train"
    try:
        source = compose_source("train", 2, "x-gpupin: {count: 1, for: 8s}")
        with swarm.stack("booked", source, tmp=tmp_path) as rendered:
            assert yaml.safe_load(Path(rendered).read_text())["services"]["train"]["labels"] == {
                "gpupin.booking.for": "8s"
            }
            service = json.loads(swarm.manager("service", "inspect", name).stdout)[0]
            assert service["Spec"]["TaskTemplate"]["ContainerSpec"]["Labels"]["gpupin.booking.for"] == "8s"

            def mode() -> Any:
                return json.loads(swarm.manager("service", "inspect", name, "--format", "{{json .Spec.Mode}}").stdout)

            wait_for(lambda: mode() == {"Replicated": {"Replicas": 0}}, 60, "the manager's agent to scale it to 0")
            assert time.time() - created_time(service["CreatedAt"]) >= 8
            swarm.containers_gone(f"com.docker.swarm.service.name={name}")
        code, _, log = agent.stop()
        assert code == 0, log
        late = re.findall(rf"booking ended: swarm service {name} \(\w+\) scaled to 0, ([0-9.]+)s after its end", log)
        assert len(late) == 1 and float(late[0]) < 5, log
        print(f"swarm expiry lateness: {late[0]}s")  # the report's figure (-s)
    finally:
        agent.close()


def test_a_stack_under_enforce_on_is_deployed_with_the_agents_grant(swarm: Cluster, tmp_path: Path) -> None:
    """gpupin's plugin in front of the manager's dockerd (at the node's own /run/docker/plugins), its agent's policy
    at enforce mode `on` (docs/authz.md, Swarm): a service that reserves GPUs is refused without the agent's grant;
    `compose render --swarm` through the agent writes one, and `docker stack deploy` of that file goes through, its
    redeploy too, and its tasks run on the manager's cards (created by the node's daemon without asking the
    plugin); more replicas, a forged grant or a copy on another stack are refused, with what was asked and granted."""
    m = swarm.nodes["manager"]
    policy = tmp_path / "policy.toml"
    policy.write_text('[enforce]\nmode = "on"\n')
    env = simhost_env(m.topology, DOCKER_HOST=m.host, GPUPIN_POLICY=str(policy))
    agent = Resident(env)
    sock = authz.plugin_socket(m)
    plugin = subprocess.Popen(
        [HOSTAGENT, "authz", "--socket", str(sock), "--agent-socket", agent.socket, "--policy", str(policy)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def deploy(file: Path, stack: str) -> subprocess.CompletedProcess[str]:
        return swarm.manager("stack", "deploy", "--resolve-image", "never", "-c", str(file), stack, check=False)

    name = "granted_train"
    try:
        wait_for(lambda: authz.activates(sock), 30, "the plugin to serve")
        with authz.plugin_on(m):
            r = swarm.manager(
                "service", "create", "-d", "--name", "ungranted", "--generic-resource", "GPU=1",
                "--no-resolve-image", TEST_IMAGE, "true", check=False,
            )  # fmt: skip
            assert "only the agent's stacks may reserve GPUs on this swarm (--generic-resource GPU=1)" in r.stderr, r
            assert r.returncode != 0
            # What no node's plugin will see of a task: its own device variables, the escape baseline.
            for form, line in (
                (
                    ["-e", "NVIDIA_VISIBLE_DEVICES=all"],
                    "-e NVIDIA_VISIBLE_DEVICES=all: a service's own device variable",
                ),
                (
                    ["--mount", "type=bind,source=/var/run/docker.sock,target=/d.sock"],
                    "a bind mount of /var/run/docker.sock: refused on this host",
                ),
            ):
                r = swarm.manager(
                    "service", "create", "-d", "--name", "escape", *form, "--no-resolve-image", TEST_IMAGE, "true",
                    check=False,
                )  # fmt: skip
                assert r.returncode != 0 and line in r.stderr, (form, r.stderr)
            # A service that reserves no card is not the agent's business (the plugin answers it alone).
            with swarm.service("plain", "--entrypoint", "true", TEST_IMAGE):
                pass
            # Rendered through the agent: the grant in deploy.labels; deployed, then deployed again (an update).
            on_manager = (
                "deploy: {replicas: 2, restart_policy: {condition: none}, "
                "placement: {constraints: [node.hostname==manager]}}\nx-gpupin: {count: 1}"
            )
            source = compose_source("train", 2, on_manager)
            source_path, rendered = tmp_path / "train.yml", tmp_path / "train.stack.yml"
            source_path.write_text(source)
            r = subprocess.run(
                [HOSTAGENT, "compose", "render", "--swarm", str(source_path), "-o", str(rendered)],
                env={**env, "GPUPIN_AGENT_SOCKET": agent.socket},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert r.returncode == 0 and "`docker stack deploy` within 15 minutes" in r.stderr, r.stderr
            doc = yaml.safe_load(rendered.read_text())
            grant = doc["services"]["train"]["deploy"]["labels"][LABEL]
            assert grant.startswith("s1.") and ".2*GPU=1." in grant
            try:
                first = deploy(rendered, "granted")
                assert first.returncode == 0 and "Creating service granted_train" in first.stdout, first
                again = deploy(rendered, "granted")
                assert again.returncode == 0 and "Updating service granted_train" in again.stdout, again
                # Its tasks run on the manager's cards: its daemon made their containers (DOCKER_RESOURCE_GPU set,
                # which the plugin refuses in a create without a container's grant) without asking the plugin.
                wait_for(lambda: len(swarm.probes(name)) == 2, 120, "2 running tasks on the manager")
                seen = {x["env"]["DOCKER_RESOURCE_GPU"] for node, x in swarm.probes(name) if node == "manager"}
                assert len(seen) == 2 and seen <= set(swarm_resources(m.topology)), seen
                # More replicas than granted: refused, saying both.
                doc["services"]["train"]["deploy"]["replicas"] = 3
                more = tmp_path / "more.yml"
                more.write_text(yaml.safe_dump(doc))
                r = deploy(more, "granted")
                asked = "service granted_train asks for 3 task(s) x 1 GPU, its grant is for 2 task(s) x 1 GPU: refused"
                assert r.returncode != 0 and asked in r.stderr, r
                print(f"docker stack deploy, 3 replicas on a grant for 2: {r.stderr.strip()}")  # the figure (-s)
                # ... and with the reservation written into the grant by hand: not the agent's signature.
                doc["services"]["train"]["deploy"]["labels"][LABEL] = grant.replace("2*", "3*")
                more.write_text(yaml.safe_dump(doc))
                r = deploy(more, "granted")
                assert r.returncode != 0 and "not signed by this agent for a service train" in r.stderr, r
                # The same file as another stack (a copy of the grant): refused.
                r = deploy(rendered, "copied")
                assert "its grant admitted service granted_train already" in r.stderr, r
                # Scaled to 0, as the manager's agent does when a booking ends: no card, no grant needed.
                swarm.manager("service", "scale", "-d", f"{name}=0")
            finally:
                swarm.manager("stack", "rm", "granted", "copied", check=False)
                swarm.containers_gone("com.docker.stack.namespace=granted")
    finally:
        plugin.kill()
        _, log = plugin.communicate(timeout=10)
        agent.close()
        print(log)

"""`hostagent compose render --swarm` and `hostagent ls --swarm` over documents and swarms described as the
Engine describes them (no daemon): the reservations a stack gets, what Swarm could never place, placement
constraints as swarmkit reads them, and the listing of nodes, cards, holders and waiting tasks. The same commands
against a real three-node swarm are in tests/cluster/test_swarm.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.core.errors import UsageError
from gpupin.hostagent.compose import load
from gpupin.hostagent.compose.problems import RenderRefused
from gpupin.hostagent.compose.stack import examine, render
from gpupin.hostagent.swarm import ls as swarmls
from gpupin.hostagent.swarm.cluster import Cluster, Constraint, Node, Task
from gpupin.hostagent.swarm.resources import GenericResource, parse_terms
from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.scenarios import cards

U = [f"GPU-0000000{i}-aaaa-4bbb-8ccc-dddddddddddd" for i in range(9)]


def node(hostname: str, n: int, kind: str = "GPU", **kw: Any) -> Node:
    return Node(f"id-{hostname}", hostname, parse_terms([f"{kind}={u}" for u in U[:n]]), **kw)


SWARM = [node("manager", 4, role="manager", leader=True), node("worker1", 8), node("worker2", 3)]


def stack(text: str, nodes: list[Node] | None = SWARM, kind: str = "GPU") -> dict[str, Any]:
    out, _ = render(load.parse(text), kind, nodes)
    return out


def refused(text: str, nodes: list[Node] | None = SWARM, kind: str = "GPU") -> list[str]:
    with pytest.raises(RenderRefused) as info:
        render(load.parse(text), kind, nodes)
    assert info.value.exit_code == 64
    lines = [p.line("f.yml") for p in info.value.problems]
    assert all("\n" not in line and " HINT: " in line for line in lines), lines
    return lines


def svc(body: str, name: str = "train") -> str:
    head = f"version: '3.8'\nservices:\n  {name}:\n    image: img\n"
    return head + "".join(f"    {ln}\n" for ln in body.splitlines())


GPU1 = [{"discrete_resource_spec": {"kind": "GPU", "value": 1}}]


# --- what a service reserves --------------------------------------------------------------------------------------


def test_a_count_becomes_a_reservation_per_task_and_replicas_stay() -> None:
    out = stack(svc("x-gpupin: {count: 2, verify: nvml}\ndeploy: {replicas: 3}\nenvironment: [A=1]"))
    s = out["services"]["train"]
    assert "x-gpupin" not in s
    assert s["deploy"] == {
        "replicas": 3,
        "resources": {"reservations": {"generic_resources": [{"discrete_resource_spec": {"kind": "GPU", "value": 2}}]}},
    }
    assert s["environment"] == ["A=1", "GPUPIN_REQUIRE=1", "GPUPIN_VERIFY=nvml"]  # the user's list form kept
    assert "NVIDIA_VISIBLE_DEVICES" not in str(out) and "GPUPIN_EXPECT" not in str(out)  # no card is known here


def test_a_deploy_device_request_count_becomes_the_reservation() -> None:
    out = stack(
        svc(
            "deploy:\n  resources:\n    limits: {memory: 1G}\n    reservations:\n      devices:\n"
            "        - {driver: nvidia, count: 2, capabilities: [gpu]}\n      memory: 512M"
        )
    )
    assert out["services"]["train"]["deploy"]["resources"] == {
        "limits": {"memory": "1G"},
        "reservations": {
            "memory": "512M",
            "generic_resources": [{"discrete_resource_spec": {"kind": "GPU", "value": 2}}],
        },
    }


def test_a_reservation_already_written_is_kept_and_a_rendered_stack_renders_to_itself() -> None:
    text = svc(
        "x-gpupin: {count: 1}\ndeploy:\n  replicas: 2\n  resources:\n    reservations:\n"
        "      generic_resources: [{discrete_resource_spec: {kind: SSD, value: 1}}]"
    )
    once = stack(text)
    assert once["services"]["train"]["deploy"]["resources"]["reservations"]["generic_resources"] == [
        {"discrete_resource_spec": {"kind": "SSD", "value": 1}},
        *GPU1,
    ]
    assert stack(load.dump(once)) == once
    assert examine(once, "GPU", SWARM).reserving[0].written


def test_kind_is_the_one_reserved() -> None:
    nodes = [node("w", 2, kind="NVIDIA-GPU")]
    out = stack(svc("x-gpupin: {count: 1}"), nodes, kind="NVIDIA-GPU")
    assert out["services"]["train"]["deploy"]["resources"]["reservations"]["generic_resources"] == [
        {"discrete_resource_spec": {"kind": "NVIDIA-GPU", "value": 1}}
    ]


def test_services_without_gpus_are_untouched() -> None:
    text = svc("x-gpupin: {count: 1}") + "  web:\n    image: nginx\n    deploy: {replicas: 2}\n"
    assert stack(text)["services"]["web"] == {"image": "nginx", "deploy": {"replicas": 2}}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            "x-gpupin: {gpus: [GPU-0000000, 1]}",
            "x-gpupin names cards (GPU-0000000, 1), but a Swarm task reserves a number of cards, never named ones",
        ),
        (
            "deploy:\n  resources:\n    reservations:\n"
            "      devices: [{driver: nvidia, device_ids: ['0'], capabilities: "
            "[gpu]}]",
            "deploy device request names cards (0)",
        ),
        ("runtime: nvidia\nenvironment: [NVIDIA_VISIBLE_DEVICES=GPU-00000001]", "runtime: nvidia names cards"),
        (
            "deploy:\n  resources:\n    reservations:\n      devices: [{driver: nvidia, capabilities: [gpu]}]",
            "deploy device request asks for every card, which a Swarm task cannot reserve",
        ),
        ("runtime: nvidia\nenvironment: [NVIDIA_VISIBLE_DEVICES=all]", "runtime: nvidia asks for every card"),
        (
            "x-gpupin: {count: 1, share: true}",
            "asks to share its cards, but Swarm never gives a reserved card to two tasks",
        ),
        (
            "x-gpupin: {count: 1}\nenvironment: {GPUPIN_EXPECT: GPU-00000001}",
            "environment sets GPUPIN_EXPECT by hand "
            "beside `x-gpupin`. HINT: remove it: Swarm names each task's cards (DOCKER_RESOURCE_<KIND>)",
        ),
        (
            "deploy:\n  resources:\n    reservations:\n"
            "      devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]\n"
            "labels: [gpupin.devices=GPU-00000001]",
            "sets the label gpupin.devices by hand beside a count: 1, which names "
            "no card. HINT: remove it: Swarm names",
        ),
        (
            "x-gpupin: {count: 1}\ndeploy:\n  resources:\n    reservations:\n      generic_resources: "
            "[{discrete_resource_spec: {kind: GPU, value: 1}}]",
            "asks for GPUs twice: x-gpupin and deploy.resources.reservations.generic_resources (GPU)",
        ),
        (
            "deploy:\n  resources:\n    reservations:\n      generic_resources: [{discrete_resource_spec: {kind: GPU, "
            "value: 0}}]",
            "deploy.resources.reservations.generic_resources reserves GPU 0, which is not a number of cards >= 1",
        ),
        (
            "x-gpupin: {count: 1}\nenvironment: [DOCKER_RESOURCE_GPU=GPU-00000001]",
            "environment sets "
            "DOCKER_RESOURCE_GPU='GPU-00000001', which the NVIDIA toolkit reads to pick the devices "
            "it exposes, beside its "
            "pin, so it could get devices outside it. HINT: remove it",
        ),
        (
            "environment: [DOCKER_RESOURCE_GPU=GPU-00000001]",
            "environment sets DOCKER_RESOURCE_GPU='GPU-00000001', "
            "which the NVIDIA toolkit reads to pick the devices it exposes, "
            "so the NVIDIA runtime may give it devices that "
            "no request names and nothing checks",
        ),
        (
            "x-gpupin: {count: 1}\ndeploy: {mode: daemonset}",
            "`deploy.mode: 'daemonset'` is neither replicated nor global",
        ),
        (
            "x-gpupin: {count: 1}\ndeploy: {placement: {constraints: ['node.hostname']}}",
            "the placement constraint 'node.hostname' is not KEY==VALUE or KEY!=VALUE",
        ),
        ("x-gpupin: {count: 1}\ndeploy: {replicas: many}", "`deploy.replicas: 'many'` is not a number of containers"),
    ],
)
def test_what_swarm_cannot_give_is_refused_in_one_line(body: str, says: str) -> None:
    lines = refused(svc(body))
    assert any(f"f.yml: service train: {says}" in line for line in lines), lines


@pytest.mark.parametrize(
    ("version", "written", "note"),
    [
        (None, "3.8", "the file has no `version`; it gets 3.8"),
        (
            "'3'",
            "3.5",
            "`version: 3` becomes 3.5, the first format with deploy.resources.reservations.generic_resources",
        ),
        ("3.2", "3.5", "`version: 3.2` becomes 3.5"),
        ("'3.9'", "3.9", None),
    ],
)
def test_the_version_is_one_docker_stack_deploy_takes(version: str | None, written: str, note: str | None) -> None:
    text = (f"version: {version}\n" if version else "") + "services:\n  a:\n    image: i\n    x-gpupin: {count: 1}\n"
    out, exam = render(load.parse(text), "GPU", SWARM)
    assert str(out["version"]) == written and next(iter(out)) == "version"
    if note is None:
        assert exam.notes == []
    else:
        assert len(exam.notes) == 1 and note in exam.notes[0]


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("'2.4'", "`version: '2.4'` is a format 2 file, which `docker stack deploy` does not take"),
        ("x", "`version: 'x'` is no compose file format"),
    ],
)
def test_a_version_stack_deploy_refuses_is_refused(version: str, says: str) -> None:
    lines = refused(f"version: {version}\nservices:\n  a:\n    image: i\n    x-gpupin: {{count: 1}}\n")
    assert any(line.startswith(f"f.yml: {says}") for line in lines), lines


# --- what Swarm can place -----------------------------------------------------------------------------------------


def test_a_kind_no_node_advertises_is_refused_naming_the_kinds_there() -> None:
    lines = refused(svc("x-gpupin: {count: 1}"), [node("w1", 2, kind="NVIDIA-GPU"), node("cpu", 0)])
    assert lines == [
        "f.yml: service train: reserves 1 GPU per task, but no node of the swarm advertises GPU (GPU "
        "kinds advertised: w1: NVIDIA-GPU, cpu: none). HINT: render with --kind NVIDIA-GPU (and check "
        "those nodes with `hostagent swarm node-config --check`: their runtime must read "
        "DOCKER_RESOURCE_NVIDIA-GPU)"
    ]


def test_more_cards_per_task_than_any_node_has_is_refused() -> None:
    assert refused(svc("x-gpupin: {count: 9}")) == [
        "f.yml: service train: reserves 9 GPU per task, but the most any node has is 8 (manager: 4, worker1: 8, "
        "worker2: 3). HINT: ask for at most 8 per task and more replicas"
    ]
    # The placement constraints narrow the nodes: worker1's 8 do not count when it may not run there.
    lines = refused(svc("x-gpupin: {count: 5}\ndeploy: {placement: {constraints: ['node.hostname != WORKER1']}}"))
    assert lines == [
        "f.yml: service train: reserves 5 GPU per task, but the most any node its placement constraints "
        "allow (node.hostname!=WORKER1) has is 4 (manager: 4, worker2: 3). HINT: ask for at most 4 per "
        "task and more replicas, or loosen the placement constraints"
    ]
    assert (
        "has is 0 (no node)"
        in refused(svc("x-gpupin: {count: 1}\ndeploy: {placement: {constraints: ['node.labels.gpu==yes']}}"))[0]
    )


def test_tasks_that_would_wait_even_on_an_idle_swarm_are_a_warning() -> None:
    _, exam = render(load.parse(svc("x-gpupin: {count: 2}\ndeploy: {replicas: 8}")), "GPU", SWARM)
    assert [p.line("f.yml") for p in exam.warnings] == [
        "f.yml: service train: warning: asks for 8 replica(s) x 2 GPU, but the nodes it may run on now hold 7 such "
        "task(s) at a time (manager: 4, worker1: 8, worker2: 3): 1 will stay pending. HINT: lower deploy.replicas, "
        "or add nodes"
    ]
    drained = [node("a", 4, availability="drain"), node("b", 2)]
    _, exam = render(load.parse(svc("x-gpupin: {count: 1}\ndeploy: {replicas: 3}")), "GPU", drained)
    assert "now hold 2 such task(s) at a time (b: 2): 1 will stay pending" in exam.warnings[0].problem
    _, exam = render(load.parse(svc("x-gpupin: {count: 4}\ndeploy: {mode: global}")), "GPU", SWARM)
    assert (
        "is global (a task on every node it may run on), but worker2 advertise(s) fewer than 4 GPU"
        in exam.warnings[0].problem
    )


def test_without_the_nodes_nothing_is_checked_against_them() -> None:
    assert stack(svc("x-gpupin: {count: 99}"), nodes=None)["services"]["train"]["deploy"]["resources"] == {
        "reservations": {"generic_resources": [{"discrete_resource_spec": {"kind": "GPU", "value": 99}}]}
    }


# --- placement constraints as swarmkit reads them ------------------------------------------------------------------


def test_constraints_match_as_swarmkit_matches() -> None:
    n = Node(
        "abc123",
        "gpu-node-1",
        role="worker",
        addr="192.168.213.12",
        labels={"Gpu": "A100"},
        engine_labels={"zone": "b"},
        os="linux",
        arch="x86_64",
    )

    def ok(text: str) -> bool:
        return Constraint.parse(text).matches(n)

    assert ok("node.hostname==GPU-NODE-1") and ok("NODE.ID == abc123") and ok("node.role!=manager")
    assert ok("node.labels.Gpu==a100") and not ok("node.labels.gpu==a100")  # the label's name is case-sensitive
    assert ok("node.labels.missing!=x") and not ok("node.labels.missing==x")  # a missing label is ""
    assert ok("engine.labels.zone==b") and ok("node.platform.os==linux") and ok("node.platform.arch==x86_64")
    assert ok("node.ip==192.168.213.0/24") and not ok("node.ip!=192.168.213.12") and not ok("node.ip==bogus")
    assert not ok("node.color==blue")  # an unknown key matches no node
    for bad in ("node.hostname", "==x", "node.hostname==", "9node==x"):
        with pytest.raises(UsageError):
            Constraint.parse(bad)


def test_a_node_counts_named_resources_or_a_discrete_count() -> None:
    assert node("w", 3).count("GPU") == 3 and node("w", 3).count("SSD") == 0
    assert Node("i", "h", parse_terms(["GPU=4"])).count("GPU") == 4


# --- ls --swarm over a swarm as the Engine describes it ----------------------------------------------------------


def task(
    id: str,
    service: str,
    slot: int,
    node_id: str,
    state: str,
    *values: str,
    err: str = "",
    desired: str = "running",
    reserves: str = "GPU=1",
) -> Task:
    return Task(
        id,
        service,
        slot,
        node_id,
        state,
        desired,
        [GenericResource("GPU", v) for v in values],
        parse_terms([reserves]),
        err,
        "",
        f"c-{id}" if node_id else "",
    )


def sample() -> Cluster:
    mixed = cards("mixed-4")
    nodes = [
        Node("n-mgr", "manager", parse_terms([f"GPU={c.uuid}" for c in mixed]), role="manager", leader=True),
        Node("n-w1", "worker1", parse_terms([f"GPU={U[0]}", f"GPU={U[1]}", "SSD=2"]), availability="drain"),
    ]
    tasks = [
        task("t1aaaaaaaaaaaaa", "s1", 1, "n-mgr", "running", str(mixed[1].uuid)),
        task("t2aaaaaaaaaaaaa", "s1", 2, "n-mgr", "starting", str(mixed[3].uuid)),
        task("t3aaaaaaaaaaaaa", "s1", 3, "n-mgr", "shutdown", str(mixed[0].uuid), desired="shutdown"),  # past: free
        task("t4aaaaaaaaaaaaa", "s1", 4, "", "pending", err="no suitable node (insufficient resources on 2 nodes)"),
        task("t5aaaaaaaaaaaaa", "s2", 1, "n-w1", "running", U[5]),  # held, though the node no longer advertises it
        Task("t6aaaaaaaaaaaaa", "s2", 2, "n-w1", "running", assigned=parse_terms(["SSD=1"])),
    ]
    return Cluster(nodes, tasks, {"s1": "train", "s2": "infer"})


def test_ls_swarm_data_names_each_holder_the_free_cards_and_the_waiting_tasks() -> None:
    data = swarmls.gather(sample(), ("n-mgr", cards("mixed-4")))
    mgr, w1 = data["nodes"]
    assert (mgr["hostname"], mgr["self"], mgr["leader"], w1["schedulable"]) == ("manager", True, True, False)
    held = [(r["card"]["bus_id"], r["held_by"] and r["held_by"]["name"]) for r in mgr["resources"]]
    assert held == [
        ("00000000:1B:00.0", None),
        ("00000000:3B:00.0", "train.1"),
        ("00000000:86:00.0", None),
        ("00000000:AF:00.0", "train.2"),
    ]
    assert [
        (r["value"], r["card"], r["held_by"] and r["held_by"]["name"], r["advertised"]) for r in w1["resources"]
    ] == [(U[0], None, None, True), (U[1], None, None, True), (U[5], None, "infer.1", False)]
    assert w1["discrete"] == [{"kind": "SSD", "total": 2, "used": 1}]
    assert [(p["name"], p["why"], p["reserves"]) for p in data["pending"]] == [
        ("train.4", "no suitable node (insufficient resources on 2 nodes)", ["GPU=1"])
    ]
    assert data["summary"] == {"nodes": 2, "resources": 7, "held": 3, "free": 4, "pending": 1}
    json.dumps(data)  # what --json prints


def test_ls_swarm_text() -> None:
    mixed = cards("mixed-4")
    text = swarmls.render(swarmls.gather(sample(), ("n-mgr", mixed)))
    lines = text.splitlines()
    assert lines[0].split() == ["NODE", "ROLE", "STATUS", "RESOURCE", "BUS", "ID", "NAME", "HELD", "BY"]
    assert lines[1].startswith("manager *  leader  ready/active  GPU=" + str(mixed[0].uuid))
    assert lines[2].endswith("00000000:3B:00.0  NVIDIA GeForce RTX 4090  train.1 (t1aaaaaaaaaa, running)")
    assert lines[5].startswith("worker1    worker  ready/drain ") and lines[5].endswith("free (node drain, ready)")
    assert lines[7].endswith(
        f"GPU={U[5]}  -                 -                        infer.1 (t5aaaaaaaaaa, running) "
        "[no longer advertised by the node]"
    )
    assert lines[8].split() == ["SSD=2", "1", "of", "2", "reserved"]
    assert lines[-2:] == [
        "PENDING  train.4 (t4aaaaaaaaaa) (reserves GPU=1): no suitable node (insufficient resources on 2 nodes)",
        "2 node(s), 7 advertised resource(s): 3 held, 4 free; 1 task(s) pending",
    ]


# --- the commands without a swarm --------------------------------------------------------------------------------


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HOSTAGENT, *args], env=simhost_env(**env), capture_output=True, text=True, timeout=60)


def test_render_swarm_without_a_manager_says_so_and_renders(fakegpu: Path, tmp_path: Path) -> None:
    f = tmp_path / "train.yml"
    f.write_text(svc("x-gpupin: {count: 1}\ndeploy: {replicas: 2}"))
    r = run(
        "compose",
        "render",
        "--swarm",
        str(f),
        "-o",
        str(tmp_path / "stack.yml"),
        DOCKER_HOST=f"unix://{tmp_path}/none.sock",
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("hostagent: warning: the swarm's nodes were not read (the Docker daemon at unix://")
    assert "whether Swarm can place each task is not checked" in r.stderr
    out = load.load(str(tmp_path / "stack.yml"))
    assert out["services"]["train"]["deploy"]["resources"]["reservations"]["generic_resources"] == GPU1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kind", "GPU"], "--kind goes with --swarm"),
        (["--swarm", "--kind", "GPU=1"], "'GPU=1' is not a usable generic resource kind"),
    ],
)
def test_render_swarm_bad_usage_is_one_line(fakegpu: Path, tmp_path: Path, args: list[str], says: str) -> None:
    f = tmp_path / "train.yml"
    f.write_text(svc("x-gpupin: {count: 1}"))
    r = run("compose", "render", *args, str(f), DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert (r.returncode, r.stdout) == (64, "")
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("hostagent: ERROR: ") and says in r.stderr, r.stderr


def test_ls_swarm_without_a_daemon_is_69_in_one_line(fakegpu: Path, tmp_path: Path) -> None:
    r = run("ls", "--swarm", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert (r.returncode, r.stdout) == (69, "")
    assert r.stderr.count("\n") == 1 and "does not answer" in r.stderr and "HINT: " in r.stderr


def test_a_task_as_the_engine_describes_it() -> None:
    """What Swarm gave the task: the daemon sends `GenericResources` (Engine 20.10, measured), the API's swagger
    documents `AssignedGenericResources`; both are read."""
    given = [{"NamedResourceSpec": {"Kind": "GPU", "Value": U[0]}}]
    raw: dict[str, Any] = {
        "ID": "t1",
        "ServiceID": "s1",
        "Slot": 3,
        "NodeID": "n1",
        "DesiredState": "running",
        "Status": {"State": "running", "ContainerStatus": {"ContainerID": "c1"}},
        "Spec": {
            "Resources": {"Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "GPU", "Value": 1}}]}}
        },
    }
    for key in ("GenericResources", "AssignedGenericResources"):
        t = Task.from_engine({**raw, key: given})
        assert ([r.term for r in t.assigned], [r.term for r in t.reserves]) == ([f"GPU={U[0]}"], ["GPU=1"])
        assert (t.holds, t.waiting, t.name("train"), t.container_id) == (True, False, "train.3", "c1")
    waiting = Task.from_engine(
        {"ID": "t2", "ServiceID": "s1", "Slot": 4, "Status": {"State": "pending", "Err": "no suitable node"}}
    )
    assert (waiting.holds, waiting.waiting, waiting.err) == (False, True, "no suitable node")


def test_the_swarm_example_renders_to_four_tasks_of_one_card() -> None:
    out, exam = render(load.load(str(REPO / "compose" / "swarm-replicas.yml")), "GPU", SWARM)
    s = out["services"]["trainer"]
    assert s["deploy"] == {"replicas": 4, "resources": {"reservations": {"generic_resources": GPU1}}}
    assert s["environment"] == {"GPUPIN_REQUIRE": "1", "GPUPIN_VERIFY": "cuda"}
    assert exam.problems == [] and str(out["version"]) == "3.8"

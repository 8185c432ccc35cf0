"""`hostagent compose render|check`: the pure core over Card objects, the CLI on the simulated host, and the
rendered examples started on the sandboxed daemons by their compose (docker-compose 1.29 beside Engine 20.10,
`docker compose` v2 beside Engine 26), each service proving its card.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.entrypoint.identity import BusId
from gpupin.entrypoint.nvml import Card
from gpupin.hostagent import compose
from gpupin.hostagent.compose import GpuRequest, ServiceError
from gpupin.hostagent.ledger import Holder, held
from tests.conftest import REPO, TEST_IMAGE, Sandbox, docker_required, gpu_uuids, simhost_env

A800, RTX, A800B, A800C = gpu_uuids("mixed-4")  # NVML order: 1B, 3B, 86 (busy), AF
HOSTAGENT = str(REPO / ".venv" / "bin" / "hostagent")
EXAMPLES = REPO / "compose"
GIB = 1024**3


# --- the mixed-4 host as Card objects -------------------------------------------------------------------------

def mixed4() -> list[Card]:
    rows = [(A800, "1B", "NVIDIA A800-SXM4-80GB", 80, 0, 0), (RTX, "3B", "NVIDIA GeForce RTX 4090", 24, 0, 0),
            (A800B, "86", "NVIDIA A800-SXM4-80GB", 80, 40, 87), (A800C, "AF", "NVIDIA A800-SXM4-80GB", 80, 0, 0)]
    cards = []
    for index, (uuid, bus, name, total, used, util) in enumerate(rows):
        c = Card(index, uuid, BusId.parse(f"{bus}:00.0"), name)
        c.memory_total, c.memory_used, c.utilization_gpu, c.mig_mode = total * GIB, used * GIB, util, False
        cards.append(c)
    return cards


def holding(*uuids: str, name: str = "other-job", shared: bool = False) -> dict[str, list[Holder]]:
    return held([Holder("f" * 64, name, "running", uuids, True, "gpupin", shared)])


def load(text: str) -> Any:
    return compose.parse_text(text, "test.yml")


def render(text: str, busy: dict[str, list[Holder]] | None = None) -> dict[str, Any]:
    doc, _, _ = compose.render(load(text), mixed4(), busy or {})
    return doc


def refusals(text: str, busy: dict[str, list[Holder]] | None = None) -> compose.RenderRefused:
    with pytest.raises(compose.RenderRefused) as info:
        compose.render(load(text), mixed4(), busy or {})
    return info.value


def devices(svc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = svc["deploy"]["resources"]["reservations"]["devices"]
    return out


def expect(*uuids: str) -> str:
    bus = {c.uuid: str(c.bus_id) for c in mixed4()}
    return ",".join(f"{u}@{bus[u]}" for u in uuids)


def service(image: str = "img", **extra: str) -> str:
    lines = [f"    image: {image}"] + [f"    {k}: {v}" for k, v in extra.items()]
    return "\n".join(lines)


# --- render: the pure core ------------------------------------------------------------------------------------

def test_specs_are_pinned_by_uuid_in_local_rank_order_and_the_rest_is_kept() -> None:
    doc = render("""
version: "3.8"
x-common: &common
  restart: "no"
services:
  trainer:
    <<: *common
    image: img
    command: ["python3", "train.py"]
    x-gpupin: {gpus: [GPU-e218, 1], verify: nvml}
    volumes: ["./data:/data"]
    ports: ["5000:5000", 22:22]
  web:
    image: nginx
""")
    svc = doc["services"]["trainer"]
    assert "x-gpupin" not in svc
    assert devices(svc) == [{"driver": "nvidia", "device_ids": [A800C, RTX], "capabilities": ["gpu"]}]
    assert svc["environment"] == {"NVIDIA_VISIBLE_DEVICES": f"{A800C},{RTX}",
                                  "GPUPIN_EXPECT": f"{A800C}@00000000:AF:00.0,{RTX}@00000000:3B:00.0",
                                  "GPUPIN_VERIFY": "nvml"}
    assert svc["labels"] == {"gpupin.devices": f"{A800C},{RTX}"}
    assert svc["command"] == ["python3", "train.py"] and svc["restart"] == "no"
    assert svc["volumes"] == ["./data:/data"]
    # YAML 1.1 would read 22:22 as the base-60 number 1342: it stays the text the user meant.
    assert svc["ports"] == ["5000:5000", "22:22"]
    assert doc["version"] == "3.8" and doc["services"]["web"] == {"image": "nginx"}
    assert "'22:22'" in compose.dump(doc)


@pytest.mark.parametrize("form", ["list", "mapping"])
def test_environment_and_labels_keep_the_users_form(form: str) -> None:
    if form == "list":
        extra = "    environment: [RUN=1]\n    labels: [team=ml]"
    else:
        extra = "    environment: {RUN: '1'}\n    labels: {team: ml}"
    svc = render(f"services:\n  a:\n{service()}\n{extra}\n    x-gpupin: {{gpus: [GPU-95c6], share: true}}\n")[
        "services"]["a"]
    if form == "list":
        assert svc["environment"] == ["RUN=1", f"NVIDIA_VISIBLE_DEVICES={RTX}", f"GPUPIN_EXPECT={expect(RTX)}"]
        assert svc["labels"] == ["team=ml", f"gpupin.devices={RTX}", "gpupin.shared=true"]
    else:
        assert svc["environment"] == {"RUN": "1", "NVIDIA_VISIBLE_DEVICES": RTX, "GPUPIN_EXPECT": expect(RTX)}
        assert svc["labels"] == {"team": "ml", "gpupin.devices": RTX, "gpupin.shared": "true"}


def test_a_quoted_bus_id_an_index_and_an_unquoted_bus_id_all_name_their_card() -> None:
    doc = render("services:\n  a:\n    image: i\n    x-gpupin: {gpus: ['0000:3b:00.0']}\n"
                 "  b:\n    image: i\n    x-gpupin: {gpus: [86:00.0]}\n"
                 "  c:\n    image: i\n    x-gpupin: {gpus: [3]}\n")
    assert [devices(doc["services"][s])[0]["device_ids"] for s in "abc"] == [[RTX], [A800B], [A800C]]


def test_count_takes_the_best_free_cards_after_the_named_ones() -> None:
    doc = render("services:\n  a:\n    image: i\n    x-gpupin: {count: 2}\n"
                 "  b:\n    image: i\n    x-gpupin: {gpus: [GPU-6cd4]}\n")
    # b's named card is taken first; then the most free memory: the idle A800s, not the 24 GiB 4090.
    assert devices(doc["services"]["a"])[0]["device_ids"] == [A800, A800C]
    assert devices(doc["services"]["b"])[0]["device_ids"] == [A800B]


def test_count_skips_cards_held_by_running_containers() -> None:
    doc = render("services:\n  a:\n    image: i\n    x-gpupin: {count: 2}\n", holding(A800, A800C))
    assert devices(doc["services"]["a"])[0]["device_ids"] == [A800B, RTX]


def test_a_count_that_the_ledger_blocks_is_75_naming_the_holder() -> None:
    err = refusals("services:\n  a:\n    image: i\n    x-gpupin: {count: 3}\n", holding(A800, A800C, name="job7"))
    assert err.exit_code == 75
    assert "only 2 card(s) are left free" in err.errors[0].message and "job7" in err.errors[0].message


def test_a_file_that_asks_for_more_cards_than_the_host_has_is_64() -> None:
    err = refusals("services:\n  a:\n    image: i\n    x-gpupin: {gpus: ['0', '1', '2']}\n"
                   "  b:\n    image: i\n    x-gpupin: {count: 2}\n")
    assert err.exit_code == 64 and err.errors[0].service == "b"
    err = refusals("services:\n  a:\n    image: i\n    x-gpupin: {count: 5}\n")
    assert err.exit_code == 64 and "only 4 whole card(s)" in err.errors[0].message


def test_a_named_card_held_by_a_running_container_is_75_unless_shared() -> None:
    text = "services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]%s}\n"
    err = refusals(text % "", holding(RTX, name="job7"))
    assert err.exit_code == 75 and "held by running container job7" in err.errors[0].message
    doc = render(text % ", share: true", holding(RTX))
    assert doc["services"]["a"]["labels"]["gpupin.shared"] == "true"


def test_one_card_for_two_services_is_64_unless_both_share() -> None:
    text = ("services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]%s}\n"
            "  b:\n    image: i\n    x-gpupin: {gpus: ['1']%s}\n")
    err = refusals(text % ("", ""))
    assert err.exit_code == 64 and err.errors[0].service == "b"
    assert "is also given to service a" in err.errors[0].message
    assert refusals(text % ("", ", share: true")).exit_code == 64
    doc = render(text % (", share: true", ", share: true"))
    assert devices(doc["services"]["b"])[0]["device_ids"] == [RTX]


def test_every_refusal_is_collected_and_any_usage_error_makes_it_64() -> None:
    err = refusals("services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-0000]}\n"
                   "  b:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]}\n", holding(RTX))
    assert [e.service for e in err.errors] == ["a", "b"] and [e.exit_code for e in err.errors] == [64, 75]
    assert err.exit_code == 64


@pytest.mark.parametrize(("body", "says"), [
    ("    x-gpupin: {gpus: [GPU-6c]}", "ambiguous"),
    ("    x-gpupin: {gpus: [GPU-0000]}", "no card's UUID starts with"),
    ("    x-gpupin: {gpus: ['7']}", "out of range"),
    ("    x-gpupin: {gpus: [GPU-95c6, '1']}", "already asked for"),
    ("    x-gpupin: {gpus: [GPU-95c6], count: 1}", "not both"),
    ("    x-gpupin: {}", "not both and not neither"),
    ("    x-gpupin: {gpu: [GPU-95c6]}", "unknown key(s) gpu"),
    ("    x-gpupin: {count: 0}", "not a number of cards"),
    ("    x-gpupin: {count: 1, verify: full}", "unknown level"),
    ("    x-gpupin: [GPU-95c6]", "not a mapping"),
    ("    x-gpupin: {gpus: [GPU-95c6]}\n    deploy: {replicas: 2}", "2 replicas"),
    ("    x-gpupin: {gpus: [GPU-95c6]}\n    environment: [GPUPIN_EXPECT=GPU-95c6]", "sets GPUPIN_EXPECT by hand"),
    ("    x-gpupin: {gpus: [GPU-95c6]}\n    environment: {NVIDIA_VISIBLE_DEVICES: all}",
     "sets NVIDIA_VISIBLE_DEVICES by hand"),
    ("    x-gpupin: {gpus: [GPU-95c6]}\n    labels: [gpupin.devices=x]", "sets the label gpupin.devices"),
    ("    x-gpupin: {gpus: [GPU-95c6]}\n    deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}",
     "asks for GPUs twice"),
    ("    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, device_ids: ['0']}]}}}",
     "both `count` and `device_ids`"),
    ("    environment: 7\n    x-gpupin: {count: 1}", "neither a list nor a mapping"),
])
def test_refusals_are_64_and_name_the_service(body: str, says: str) -> None:
    err = refusals(f"services:\n  svc:\n    image: i\n{body}\n")
    assert err.exit_code == 64, err.errors
    assert err.errors[0].service == "svc" and says in err.errors[0].message, err.errors


@pytest.mark.parametrize("text", ["services: [", "services: {a: {image: i}\n  x: ]", "[1, 2]", "services: {}"])
def test_a_malformed_file_is_64_naming_it(text: str) -> None:
    with pytest.raises(ServiceError) as info:
        compose.render(load(text), mixed4(), {})
    assert info.value.exit_code == 64 and info.value.service is None
    if text.startswith("services: ") and "[" in text:
        assert "test.yml is not valid YAML" in info.value.message and "line" in info.value.message


def test_a_malformed_service_is_64_naming_it() -> None:
    err = refusals("services:\n  a: just-text\n  b:\n    image: i\n    deploy: [1]\n    x-gpupin: {count: 1}\n")
    assert err.exit_code == 64 and [(e.service, e.message) for e in err.errors] == [
        ("a", "the service is not a mapping"), ("b", "`deploy` is not a mapping")]


def test_standard_deploy_requests_are_pinned_by_uuid() -> None:
    doc = render("""
services:
  by-index:
    image: i
    deploy:
      resources:
        limits: {cpus: '2'}
        reservations:
          devices:
            - {driver: nvidia, device_ids: ['3', '1'], capabilities: [gpu, utility]}
            - {driver: other, count: 1, capabilities: [fpga]}
  by-count:
    image: i
    deploy: {resources: {reservations: {devices: [{capabilities: [gpu], count: 1}]}}}
""")
    a, b = doc["services"]["by-index"], doc["services"]["by-count"]
    assert devices(a)[0] == {"driver": "nvidia", "device_ids": [A800C, RTX], "capabilities": ["gpu", "utility"]}
    assert devices(a)[1] == {"driver": "other", "count": 1, "capabilities": ["fpga"]}
    assert a["deploy"]["resources"]["limits"] == {"cpus": "2"}
    assert a["environment"]["GPUPIN_EXPECT"] == expect(A800C, RTX)
    # The count lands on the best free card not taken by the other service, not on index 0 by default.
    assert devices(b)[0]["device_ids"] == [A800]


# --- check: the pure core -------------------------------------------------------------------------------------

def check(text: str, busy: dict[str, list[Holder]] | None = None) -> compose.CheckResult:
    return compose.check(load(text), mixed4(), busy or {})


def deploy_ids(*ids: str, extra: str = "") -> str:
    quoted = ", ".join(f"'{i}'" for i in ids)
    return f"    deploy: {{resources: {{reservations: {{devices: [{{driver: nvidia, device_ids: [{quoted}], " \
           f"capabilities: [gpu]}}]}}}}}}\n{extra}"


def errors_of(result: compose.CheckResult) -> list[compose.Problem]:
    return [p for p in result.problems if p.severity == "error"]


def test_a_rendered_file_checks_clean() -> None:
    text = (EXAMPLES / "two-services.yml").read_text()
    result = check(compose.dump(render(text)))
    assert result.ok and result.problems == []
    assert result.summary() == "ok: 2 service(s) with GPUs, 2 card(s) pinned"
    assert check(text).ok


def test_an_index_is_flagged_with_the_uuid_it_names_today() -> None:
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids('1')}")
    (p,) = errors_of(result)
    assert p.service == "a" and "device id 1 is an NVML index" in p.problem and RTX in p.problem
    assert p.hint is not None and f"device_ids: [{RTX}]" in p.hint


@pytest.mark.parametrize(("ids", "says"), [
    (("GPU-95c6",), "is a UUID prefix"),
    (("3b:00.0",), "without its PCI domain"),
    (("GPU-00000000-0000-0000-0000-000000000000",), "no card with UUID"),
    (("9",), "out of range"),
])
def test_device_ids_the_runtime_would_not_take_are_errors(ids: tuple[str, ...], says: str) -> None:
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids(*ids)}")
    assert not result.ok and says in errors_of(result)[0].problem


def test_full_bus_ids_and_uuids_are_fine() -> None:
    assert check(f"services:\n  a:\n    image: i\n{deploy_ids('0000:86:00.0', RTX)}").ok


def test_the_wrong_way_count_is_flagged() -> None:
    result = check((EXAMPLES / "wrong-way-count.yml").read_text())
    assert not result.ok
    warnings = [p for p in result.problems if p.severity == "warning"]
    assert [p.service for p in warnings] == ["trainer", "evaluator"]
    assert all("count: 1 is not a pin" in p.problem and A800 in p.problem for p in warnings)
    (err,) = errors_of(result)
    assert err.service == "evaluator" and f"{A800} (index 0" in err.problem and "also given to service trainer" \
        in err.problem


def test_double_booking_by_uuid_and_index_is_one_problem_per_extra_service() -> None:
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}  b:\n    image: i\n    x-gpupin: "
                   f"{{gpus: [GPU-95c6]}}\n  c:\n    image: i\n{deploy_ids('00000000:3B:00.0')}")
    errs = errors_of(result)
    assert [p.service for p in errs] == ["b", "c"]
    assert "also given to service a, b" in errs[1].problem


def test_sharing_is_allowed_when_every_service_says_so() -> None:
    shared = "    labels: {gpupin.shared: 'true'}\n"
    text = f"services:\n  a:\n    image: i\n{deploy_ids(RTX, extra=shared)}" \
           f"  b:\n    image: i\n    x-gpupin: {{gpus: [GPU-95c6], share: true}}\n"
    assert check(text).ok
    assert not check(text.replace(shared, "")).ok


def test_a_card_held_by_a_running_container_is_flagged_unless_shared() -> None:
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}", holding(RTX, name="job7"))
    assert "held by running container job7" in errors_of(result)[0].problem
    assert check("services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6], share: true}\n",
                 holding(RTX)).ok


def test_replicas_and_count_with_device_ids_are_errors() -> None:
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}    scale: 3\n"
                   "  b:\n    image: i\n    deploy: {resources: {reservations: {devices: "
                   "[{driver: nvidia, count: 1, device_ids: ['0']}]}}}\n")
    assert [(p.service, p.severity) for p in result.problems] == [("a", "error"), ("b", "error")]
    assert "3 replicas" in result.problems[0].problem and "both `count` and `device_ids`" in \
        result.problems[1].problem


@pytest.mark.parametrize(("value", "ok", "says"), [
    (f"{RTX}@3b:00.0,{A800C}", True, ""),
    (f"{A800C},GPU-95c6", True, ""),  # another order is another local-rank order, not a mismatch
    (RTX, False, f"names {RTX} but the service is given"),
    (f"{RTX}@af:00.0,{A800C}", False, "but it is at 00000000:3B:00.0"),
    ("GPU-6c", False, "ambiguous"),
    ("cuda:0", False, "is not a GPU UUID"),
])
def test_gpupin_expect_must_agree_with_the_device_ids(value: str, ok: bool, says: str) -> None:
    env = f"    environment: ['GPUPIN_EXPECT={value}']\n"
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX, A800C, extra=env)}")
    assert result.ok is ok, result.problems
    if says:
        assert says in errors_of(result)[0].problem


def test_the_legacy_runtime_form_is_read_as_device_ids() -> None:
    result = check("services:\n  a:\n    image: i\n    runtime: nvidia\n    environment: [NVIDIA_VISIBLE_DEVICES=2]\n")
    assert "NVIDIA_VISIBLE_DEVICES 2 is an NVML index" in errors_of(result)[0].problem


def test_a_ledger_label_that_is_not_the_cards_is_an_error() -> None:
    labels = f"    labels: [gpupin.devices={A800}]\n"
    assert "the ledger would be wrong" in errors_of(check(f"services:\n  a:\n    image: i\n"
                                                           f"{deploy_ids(RTX, extra=labels)}"))[0].problem
    assert check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX, extra=labels.replace(A800, RTX))}").ok


def test_the_legacy_runtime_form_renders_to_a_device_request() -> None:
    svc = render("services:\n  a:\n    image: i\n    runtime: nvidia\n"
                 "    environment: [NVIDIA_VISIBLE_DEVICES=3, X=1]\n")["services"]["a"]
    assert "runtime" not in svc and devices(svc)[0]["device_ids"] == [A800C]
    assert svc["environment"] == ["X=1", f"NVIDIA_VISIBLE_DEVICES={A800C}", f"GPUPIN_EXPECT={expect(A800C)}"]


def test_problems_print_as_one_line_and_as_json() -> None:
    p = compose.Problem("a", "something is wrong", "fix it")
    assert p.line("f.yml") == "f.yml: service a: something is wrong. HINT: fix it"
    assert compose.Problem(None, "x", None, "warning").line("f.yml") == "f.yml: warning: x."
    assert p.to_dict() == {"service": "a", "problem": "something is wrong", "hint": "fix it", "severity": "error"}


def test_the_projects_own_containers_are_not_counted_against_it(tmp_path: Path) -> None:
    doc = load("name: Ml-Run\nservices: {a: {image: i}}\n")
    names = compose.project_names(doc, [str(tmp_path / "My Dir" / "f.yml")], {"COMPOSE_PROJECT_NAME": "p1"})
    assert names == {"p1", "Ml-Run", "mydir"}
    summaries = [{"Id": "1", "Labels": {"com.docker.compose.project": "p1", "com.docker.compose.service": "a"}},
                 {"Id": "2", "Labels": {"com.docker.compose.project": "p1", "com.docker.compose.service": "z"}},
                 {"Id": "3", "Labels": {"com.docker.compose.project": "p2", "com.docker.compose.service": "a"}}]
    assert compose.own_container_ids(summaries, names, {"a"}) == {"1"}


def test_gpu_request_reads_each_form() -> None:
    r = compose.gpu_request("s", load("image: i\nx-gpupin: {gpus: 'GPU-95c6, 3'}\n"))
    assert isinstance(r, GpuRequest) and r.specs == ["GPU-95c6", "3"] and r.source == "x-gpupin"
    r = compose.gpu_request("s", load("image: i\ndeploy: {resources: {reservations: {devices: [{capabilities: "
                                      "[gpu]}]}}}\n"))
    assert r is not None and r.count == -1  # no count and no ids: every card, as `--gpus all`
    assert compose.gpu_request("s", load("image: i\n")) is None


# --- the CLI on the simulated host ----------------------------------------------------------------------------

def hostagent(*args: str, docker_host: str = "unix:///nonexistent/docker.sock",
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = simhost_env(DOCKER_HOST=docker_host)
    return subprocess.run([HOSTAGENT, *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_cli_render_writes_the_pinned_file_and_says_docker_was_not_read(fakegpu: Path, tmp_path: Path) -> None:
    out = tmp_path / "pinned.yml"
    src = tmp_path / "two-services.yml"
    shutil.copy(EXAMPLES / "two-services.yml", src)
    r = hostagent("compose", "render", str(src), "-o", str(out))
    assert r.returncode == 0, r
    assert r.stdout == "" and "the ledger was not read" in r.stderr
    text = out.read_text()
    assert text.startswith("# Rendered by `hostagent compose render two-services.yml`")
    assert f"#   trainer: cuda:0 = {RTX} at 00000000:3B:00.0 (NVIDIA GeForce RTX 4090)" in text
    doc = load(text)
    assert devices(doc["services"]["evaluator"])[0]["device_ids"] == [A800C]
    assert hostagent("compose", "check", str(out)).stdout.splitlines() == [
        "ok: 2 service(s) with GPUs, 2 card(s) pinned"]


def test_cli_render_refusal_writes_nothing_and_prints_one_line_each(fakegpu: Path, tmp_path: Path) -> None:
    src = tmp_path / "bad.yml"
    src.write_text("services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-6c]}\n"
                   "  b:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]}\n    deploy: {replicas: 2}\n")
    out = tmp_path / "out.yml"
    r = hostagent("compose", "render", str(src), "-o", str(out))
    assert r.returncode == 64, r
    lines = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(lines) == 2 and r.stdout == ""
    assert lines[0].startswith(f"hostagent: ERROR: {src}: service a: the UUID prefix 'GPU-6c' is ambiguous")
    assert "HINT:" in lines[0] and f"{src}: service b: asks for 2 replicas" in lines[1]
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["bad.yml"]


def test_cli_malformed_yaml_is_64_naming_the_file(fakegpu: Path, tmp_path: Path) -> None:
    src = tmp_path / "broken.yml"
    src.write_text("services:\n  a: {image: i\n")
    r = hostagent("compose", "render", str(src))
    assert r.returncode == 64 and r.stderr.startswith(f"hostagent: ERROR: {src} is not valid YAML"), r
    r = hostagent("compose", "check", str(src), "--json")
    assert r.returncode == 64 and json.loads(r.stdout)[0]["service"] is None, r
    assert hostagent("compose", "render", str(tmp_path / "missing.yml")).returncode == 64


def test_cli_check_refuses_a_double_booked_file_one_line_per_problem(fakegpu: Path, tmp_path: Path) -> None:
    src = tmp_path / "double.yml"
    src.write_text(f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}  b:\n    image: i\n{deploy_ids(RTX)}"
                   f"  c:\n    image: i\n{deploy_ids('1')}")
    r = hostagent("compose", "check", str(src))
    assert r.returncode == 64, r
    assert r.stdout.splitlines() == [
        f"{src}: service b: {RTX} (index 1, 00000000:3B:00.0, NVIDIA GeForce RTX 4090) is also given to "
        "service a: both would run on one card. HINT: give each service its own card by UUID (`hostagent compose "
        "render` places them), or mark every service that shares it `x-gpupin: {share: true}` / label "
        "gpupin.shared=true",
        f"{src}: service c: device id 1 is an NVML index: today it is {RTX} (index 1, 00000000:3B:00.0, NVIDIA "
        "GeForce RTX 4090), but indices follow PCI bus order and name another card after a card is added, removed "
        f"or lost. HINT: pin it by UUID: device_ids: [{RTX}] (or `x-gpupin: {{gpus: [{RTX}]}}` and render)",
        f"{src}: service c: {RTX} (index 1, 00000000:3B:00.0, NVIDIA GeForce RTX 4090) is also given to service "
        "a, b: both would run on one card. HINT: give each service its own card by UUID (`hostagent compose "
        "render` places them), or mark every service that shares it `x-gpupin: {share: true}` / label "
        "gpupin.shared=true",
    ]
    r = hostagent("compose", "check", str(src), "--json")
    problems = json.loads(r.stdout)
    assert r.returncode == 64 and [(p["service"], p["severity"]) for p in problems] == [
        ("b", "error"), ("c", "error"), ("c", "error")]
    assert set(problems[0]) == {"service", "problem", "hint", "severity"}


# --- on the sandbox: docker-compose runs the rendered files ---------------------------------------------------

_project_ids = itertools.count()


class ComposeRun:
    """One compose project on the sandbox, under a name of its own; `down` removes what it created."""

    def __init__(self, sandbox: Sandbox, file: Path) -> None:
        if not os.path.exists(sandbox.compose_cli[0]):
            if docker_required():
                pytest.fail(f"{sandbox.compose_cli[0]} is missing (`make sandbox-up` installs it)", pytrace=False)
            pytest.skip(f"{sandbox.compose_cli[0]} is missing")
        self.sandbox = sandbox
        self.file = file
        self.project = f"gpupintest{os.getpid()}x{next(_project_ids)}"

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.sandbox.compose("-p", self.project, "-f", str(self.file), *args, timeout=timeout)

    def up(self) -> None:
        r = self.compose("up", "--no-color")  # attached: returns when every service has exited
        assert r.returncode == 0, r.stdout + r.stderr

    def logs(self, service: str) -> tuple[int, str, str]:
        """The service's exit code, stdout (the workload) and stderr (the entrypoint's mapping)."""
        # `-a`: compose v2 lists only running containers without it (1.x lists stopped ones too)
        cid = self.compose("ps", "-a", "-q", service).stdout.strip()
        assert cid, f"no container for {service}"
        logs = self.sandbox.docker("logs", cid)
        code = self.sandbox.docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip()
        return int(code), logs.stdout, logs.stderr

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans")


def rendered(example: str, tmp_path: Path, docker_host: str) -> Path:
    out = tmp_path / example.replace(".yml", ".pinned.yml")
    r = hostagent("compose", "render", str(EXAMPLES / example), "-o", str(out), docker_host=docker_host)
    assert r.returncode == 0, r
    return out


@pytest.mark.docker
@pytest.mark.parametrize(("example", "want"), [
    ("two-services.yml", {"trainer": [(RTX, "00000000:3B:00.0", "NVIDIA GeForce RTX 4090")],
                          "evaluator": [(A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB")]}),
    ("two-cards-one-service.yml", {"trainer": [(A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB"),
                                               (RTX, "00000000:3B:00.0", "NVIDIA GeForce RTX 4090")]}),
])
def test_rendered_examples_start_and_each_service_proves_its_cards(
        mixed4_sandbox: Sandbox, tmp_path: Path, example: str, want: dict[str, list[tuple[str, str, str]]]) -> None:
    run = ComposeRun(mixed4_sandbox, rendered(example, tmp_path, mixed4_sandbox.host))
    try:
        run.up()
        for svc, cards in want.items():
            code, out, err = run.logs(svc)
            assert code == 0, (svc, out, err)
            assert out.splitlines() == [f"cuda:{k} = {u} at {bus} ({name}), as expected"
                                        for k, (u, bus, name) in enumerate(cards)], (svc, out, err)
            for k, (u, bus, name) in enumerate(cards):
                assert f"cuda:{k}  {u}  {bus}  {name}  (local rank {k})" in err, (svc, err)
            assert "expectation from GPUPIN_EXPECT" in err
    finally:
        run.down()


@pytest.mark.docker
def test_the_wrong_way_puts_both_services_on_one_card_and_check_refuses_it(
        mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    run = ComposeRun(mixed4_sandbox, EXAMPLES / "wrong-way-count.yml")
    try:
        run.up()
        seen = {}
        for svc in ("trainer", "evaluator"):
            code, out, err = run.logs(svc)
            assert code == 0, (svc, out, err)
            mapping = [ln for ln in err.splitlines() if "cuda:0  " in ln]
            assert len(mapping) == 1, err
            seen[svc] = mapping[0].split()[2]
    finally:
        run.down()
    assert seen == {"trainer": A800, "evaluator": A800}  # both on GPU 0: the problem is real
    r = hostagent("compose", "check", str(EXAMPLES / "wrong-way-count.yml"), docker_host=mixed4_sandbox.host)
    assert r.returncode == 64, r
    errors = [ln for ln in r.stdout.splitlines() if "warning:" not in ln]
    assert len(errors) == 1 and "service evaluator" in errors[0] and "also given to service trainer" in errors[0]


@pytest.mark.docker
def test_render_and_check_see_the_cards_running_pinned_containers_hold(
        mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    sb = mixed4_sandbox
    name = f"gpupintest-holder-{os.getpid()}"
    started = sb.docker("run", "-d", "--name", name, "--label", f"gpupin.devices={RTX}",
                        "--gpus", f"device={RTX}", TEST_IMAGE, "sleep", "60")
    assert started.returncode == 0, started
    try:
        src = EXAMPLES / "two-services.yml"
        r = hostagent("compose", "render", str(src), "-o", str(tmp_path / "out.yml"), docker_host=sb.host)
        assert r.returncode == 75, r
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"hostagent: ERROR: {src}: service trainer: {RTX}") and name in line
        assert not (tmp_path / "out.yml").exists()
        r = hostagent("compose", "check", str(src), docker_host=sb.host)
        assert r.returncode == 64 and f"held by running container {name}" in r.stdout, r
        counted = tmp_path / "count.yml"
        counted.write_text("services:\n  a:\n    image: i\n    x-gpupin: {count: 3}\n")
        r = hostagent("compose", "render", str(counted), docker_host=sb.host)
        assert r.returncode == 0, r
        assert devices(load(r.stdout)["services"]["a"])[0]["device_ids"] == [A800, A800C, A800B]
    finally:
        sb.docker("rm", "-f", name)

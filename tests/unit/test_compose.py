"""`hostagent compose render|check`: loading (limits, bad input), the rules both commands share, placement and the
rendered pin over Card objects; the CLI on the simulated host (`-o`, one line per problem, exit codes). The
rendered examples started on the sandboxed daemons: tests/docker/test_compose.py. Property-based tests over
generated documents are in test_compose_fuzz.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.compose import command, load
from gpupin.hostagent.compose.problems import Problem, RenderRefused, ServiceError
from gpupin.hostagent.compose.render import render as render_core
from gpupin.hostagent.compose.request_forms import gpu_request
from gpupin.hostagent.compose.rules import Examination, examine
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger.holders import Holder, held
from tests.support.compose import CDI_DEPLOY, devices
from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")  # NVML order: 1B, 3B, 86 (busy), AF
EXAMPLES = REPO / "compose"
# A "billion laughs" alias bomb of about the size (461 bytes there): 9**8 strings once expanded, which is
# gigabytes in any copy, dump or repr of it.
ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")
)


def holding(*uuids: str, name: str = "other-job", shared: bool = False) -> dict[str, list[Holder]]:
    return held([Holder("f" * 64, name, "running", uuids, True, "gpupin", shared)])


def parse(text: str) -> Any:
    return load.parse(text)


def render(text: str, busy: dict[str, list[Holder]] | None = None) -> dict[str, Any]:
    doc, _ = render_core(parse(text), scenario_cards(), busy or {})
    return doc


def refusals(text: str, busy: dict[str, list[Holder]] | None = None) -> RenderRefused:
    with pytest.raises(RenderRefused) as info:
        render_core(parse(text), scenario_cards(), busy or {})
    return info.value


def check(text: str, busy: dict[str, list[Holder]] | None = None) -> Examination:
    return examine(parse(text), scenario_cards(), busy or {})


def errors_of(result: Examination) -> list[Problem]:
    return [p for p in result.problems if p.severity == "error"]


def expect(*uuids: str) -> str:
    bus = {c.uuid: str(c.bus_id) for c in scenario_cards()}
    return ",".join(f"{u}@{bus[u]}" for u in uuids)


def service(image: str = "img", **extra: str) -> str:
    lines = [f"    image: {image}"] + [f"    {k}: {v}" for k, v in extra.items()]
    return "\n".join(lines)


def deploy_ids(*ids: str, extra: str = "") -> str:
    quoted = ", ".join(f"'{i}'" for i in ids)
    return (
        f"    deploy: {{resources: {{reservations: {{devices: [{{driver: nvidia, device_ids: [{quoted}], "
        f"capabilities: [gpu]}}]}}}}}}\n{extra}"
    )


# --- loading: bytes -> text -> YAML, with limits -----------------------------------------------------------------


def load_error(tmp_path: Path, content: bytes | str, name: str = "f.yml") -> ServiceError:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(ServiceError) as info:
        load.load(str(path))
    assert info.value.service is None and info.value.exit_code == 64
    return info.value


@pytest.mark.parametrize(
    ("content", "says", "hint"),
    [
        (b"", "holds no YAML document (it is empty", "a compose file is a mapping"),
        (b"# nothing but a comment\n", "holds no YAML document", "`services:`"),
        (b"services:\n  a: {image: \xff}\n", "not UTF-8 text (byte 0xff at line 2, column 14)", "save it as UTF-8"),
        ("services: {}\n".encode("utf-16"), "UTF-16 text", "save it as UTF-8"),
        (b"services:\n\ta: {image: i}\n", "not valid YAML", "indent with spaces"),
        (b"services: [\n", "not valid YAML", "docker compose -f FILE config"),
        (
            b"services:\n  a: {image: i}\n  a: {image: j}\n",
            "the key 'a' is given twice in one mapping (at line 2, column 3 "
            "and line 3, column 3): compose v2 refuses that",
            "keep one of them",
        ),
        (
            b"x: &x {a: 1}\ny: &y {b: 2}\nservices:\n  s:\n    <<: *x\n    <<: *y\n",
            "the key '<<' is given twice",
            "`<<: [*a, *b]`",
        ),
        (ALIAS_BOMB.encode(), "aliases expand it to more than 4,000,000 nodes and characters", "one anchor"),
        (b"a: &a [1, *a]\n", "refers to a node that contains it", "cannot be used inside itself"),
        (b"[" * 100 + b"]" * 100, "nests deeper than 64 levels", "indentation"),
        (
            "".join(
                f"a{i}: &a{i} " + "[" * 40 + (f"*a{i - 1}" if i else "1") + "]" * 40 + "\n" for i in range(3)
            ).encode(),
            "its YAML aliases nest it deeper than 64 levels",
            "not aliases of aliases",
        ),
        (b"services: !!set {a, b}\n", "the YAML tag '!!set'", "remove it"),
        (b"services:\n  a:\n    ports: !custom []\n", "the YAML tag '!custom'", "compose v2 reads !reset"),
        (b"services: {a: {image: i}}\n---\nservices: {}\n", "more than one YAML document", "docker compose"),
    ],
)
def test_bad_files_are_one_problem_naming_the_place(tmp_path: Path, content: bytes, says: str, hint: str) -> None:
    err = load_error(tmp_path, content)
    assert says in err.message and err.hint is not None and hint in err.hint, (err.message, err.hint)
    assert "\n" not in err.message


def test_a_document_at_the_depth_limit_renders() -> None:
    deep = "{x: " * 58 + "1" + "}" * 58
    doc = render(f"x-deep: {deep}\nservices:\n  a:\n    image: i\n    x-gpupin: {{gpus: ['1']}}\n")
    assert parse(load.dump(doc))["x-deep"] == parse(f"x-deep: {deep}\n")["x-deep"]


def test_the_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    assert len(ALIAS_BOMB) < 461
    started = time.monotonic()
    load_error(tmp_path, ALIAS_BOMB)
    assert time.monotonic() - started < 10  # expanded, the bomb is billions of nodes: hours, not seconds


def test_a_huge_file_a_directory_and_a_missing_file_are_refused_before_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def parsed(text: str) -> None:
        raise AssertionError("parsed: the refusal came too late")

    monkeypatch.setattr(load, "parse", parsed)  # refused before the YAML parser is ever asked
    err = load_error(tmp_path, b"services:\n" + b"#" * (load.MAX_BYTES + 10))
    assert "larger than 1024 KiB" in err.message
    with pytest.raises(ServiceError, match="is a directory"):
        load.load(str(tmp_path))
    with pytest.raises(ServiceError, match="cannot read it: No such file or directory"):
        load.load(str(tmp_path / "missing.yml"))
    with pytest.raises(ServiceError, match="it is a character device, not a regular file"):
        load.load("/dev/zero")  # endless: refused before a byte is read (a read would hang to the test's timeout)


def test_yaml_1_1_base_60_numbers_that_compose_v2_reads_as_text_stay_text() -> None:
    doc = parse("a: [22:22, 86:00.0, 0:1, 2024-01-01, 12, 1.5, 0x1f, " + "9" * 5000 + "]\n")
    assert doc["a"][:3] == ["22:22", "86:00.0", "0:1"] and doc["a"][4:7] == [12, 1.5, 31]
    assert doc["a"][7] == "9" * 5000  # more digits than Python converts: kept as text, never a traceback
    assert "'22:22'" in load.dump(doc)
    assert "- 2024-01-01\n" in load.dump(doc)  # a date stays a date, as both compose versions read it


def test_anchors_and_merge_keys_work_and_aliases_become_copies() -> None:
    doc = parse(
        "x-env: &env {RUN: '1'}\nx-base: &base {image: i, environment: *env}\n"
        "services:\n  a:\n    <<: *base\n    x-gpupin: {gpus: ['1']}\n"
        "  b:\n    <<: [*base]\n    image: j\n    x-gpupin: {gpus: ['3']}\n"
    )
    a, b = doc["services"]["a"], doc["services"]["b"]
    assert a["environment"] == b["environment"] == {"RUN": "1"} and b["image"] == "j"
    assert a["environment"] is not b["environment"]
    out, _ = render_core(doc, scenario_cards(), {})
    # Each service gets its own pin, though both took their environment from one anchor.
    assert out["services"]["a"]["environment"]["NVIDIA_VISIBLE_DEVICES"] == RTX
    assert out["services"]["b"]["environment"]["NVIDIA_VISIBLE_DEVICES"] == A800C
    assert "&" not in load.dump(out) and "*" not in load.dump(out)


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
    assert svc["environment"] == {
        "NVIDIA_VISIBLE_DEVICES": f"{A800C},{RTX}",
        "GPUPIN_EXPECT": f"{A800C}@00000000:AF:00.0,{RTX}@00000000:3B:00.0",
        "GPUPIN_VERIFY": "nvml",
    }
    assert svc["labels"] == {"gpupin.devices": f"{A800C},{RTX}", "gpupin.shared": "false"}
    assert svc["command"] == ["python3", "train.py"] and svc["restart"] == "no"
    assert svc["volumes"] == ["./data:/data"]
    # YAML 1.1 would read 22:22 as the base-60 number 1342: it stays the text the user meant.
    assert svc["ports"] == ["5000:5000", "22:22"]
    assert doc["version"] == "3.8" and doc["services"]["web"] == {"image": "nginx"}
    assert "'22:22'" in load.dump(doc)


@pytest.mark.parametrize("form", ["list", "mapping"])
def test_environment_and_labels_keep_the_users_form(form: str) -> None:
    if form == "list":
        extra = "    environment: [RUN=1]\n    labels: [team=ml]"
    else:
        extra = "    environment: {RUN: '1'}\n    labels: {team: ml}"
    svc = render(f"services:\n  a:\n{service()}\n{extra}\n    x-gpupin: {{gpus: [GPU-95c6], share: true}}\n")[
        "services"
    ]["a"]
    if form == "list":
        assert svc["environment"] == ["RUN=1", f"NVIDIA_VISIBLE_DEVICES={RTX}", f"GPUPIN_EXPECT={expect(RTX)}"]
        assert svc["labels"] == ["team=ml", f"gpupin.devices={RTX}", "gpupin.shared=true"]
    else:
        assert svc["environment"] == {"RUN": "1", "NVIDIA_VISIBLE_DEVICES": RTX, "GPUPIN_EXPECT": expect(RTX)}
        assert svc["labels"] == {"team": "ml", "gpupin.devices": RTX, "gpupin.shared": "true"}


def test_a_quoted_bus_id_an_index_and_an_unquoted_bus_id_all_name_their_card() -> None:
    doc = render(
        "services:\n  a:\n    image: i\n    x-gpupin: {gpus: ['0000:3b:00.0']}\n"
        "  b:\n    image: i\n    x-gpupin: {gpus: [86:00.0]}\n"
        "  c:\n    image: i\n    x-gpupin: {gpus: [3]}\n"
    )
    assert [devices(doc["services"][s])[0]["device_ids"] for s in "abc"] == [[RTX], [A800B], [A800C]]


def test_count_takes_the_best_free_cards_after_the_named_ones() -> None:
    doc = render(
        "services:\n  a:\n    image: i\n    x-gpupin: {count: 2}\n"
        "  b:\n    image: i\n    x-gpupin: {gpus: [GPU-6cd4]}\n"
    )
    # b's named card is taken first; then the most free memory: the idle A800s, not the 24 GiB 4090.
    assert devices(doc["services"]["a"])[0]["device_ids"] == [A800, A800C]
    assert devices(doc["services"]["b"])[0]["device_ids"] == [A800B]


def test_count_skips_cards_held_by_running_containers() -> None:
    doc = render("services:\n  a:\n    image: i\n    x-gpupin: {count: 2}\n", holding(A800, A800C))
    assert devices(doc["services"]["a"])[0]["device_ids"] == [A800B, RTX]


def test_a_count_that_the_ledger_blocks_is_75_naming_the_holder() -> None:
    err = refusals("services:\n  a:\n    image: i\n    x-gpupin: {count: 3}\n", holding(A800, A800C, name="job7"))
    assert err.exit_code == 75
    assert "only 2 card(s) are left free" in err.problems[0].problem and "job7" in err.problems[0].problem


def test_a_file_that_asks_for_more_cards_than_the_host_has_is_64() -> None:
    err = refusals(
        "services:\n  a:\n    image: i\n    x-gpupin: {gpus: ['0', '1', '2']}\n"
        "  b:\n    image: i\n    x-gpupin: {count: 2}\n"
    )
    assert err.exit_code == 64 and err.problems[0].service == "b"
    err = refusals("services:\n  a:\n    image: i\n    x-gpupin: {count: 5}\n")
    assert err.exit_code == 64 and err.problems[0].problem == "count: 5: this host has only 4 whole card(s)"


def test_a_named_card_held_by_a_running_container_is_75_unless_both_share() -> None:
    text = "services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]%s}\n"
    err = refusals(text % "", holding(RTX, name="job7"))
    assert err.exit_code == 75 and "held by running container job7" in err.problems[0].problem
    # the ledger's rule: a sharing service joins a holder that shares, never one that keeps its card to itself
    assert refusals(text % ", share: true", holding(RTX, name="job7")).exit_code == 75
    assert refusals(text % "", holding(RTX, name="job7", shared=True)).exit_code == 75
    doc = render(text % ", share: true", holding(RTX, shared=True))
    assert doc["services"]["a"]["labels"]["gpupin.shared"] == "true"


def test_one_card_for_two_services_is_64_unless_both_share() -> None:
    text = (
        "services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]%s}\n"
        "  b:\n    image: i\n    x-gpupin: {gpus: ['1']%s}\n"
    )
    err = refusals(text % ("", ""))
    assert err.exit_code == 64 and err.problems[0].service == "b"
    assert "is also given to service a: both would run on one card" in err.problems[0].problem
    assert refusals(text % ("", ", share: true")).exit_code == 64
    doc = render(text % (", share: true", ", share: true"))
    assert devices(doc["services"]["b"])[0]["device_ids"] == [RTX]


def test_every_refusal_is_collected_and_any_usage_error_makes_it_64() -> None:
    err = refusals(
        "services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-0000]}\n"
        "  b:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]}\n",
        holding(RTX),
    )
    assert [p.service for p in err.problems] == ["a", "b"] and [p.exit_code for p in err.problems] == [64, 75]
    assert err.exit_code == 64


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("    x-gpupin: {gpus: [GPU-6c]}", "ambiguous"),
        ("    x-gpupin: {gpus: [GPU-0000]}", "no card's UUID starts with"),
        ("    x-gpupin: {gpus: ['7']}", "out of range"),
        ("    x-gpupin: {gpus: [GPU-95c6, '1']}", "already asked for"),
        ("    x-gpupin: {gpus: []}", "x-gpupin.gpus is empty"),
        ("    x-gpupin: {gpus: [GPU-95c6], count: 1}", "not both"),
        ("    x-gpupin: {}", "not both and not neither"),
        ("    x-gpupin: {gpu: [GPU-95c6]}", "unknown key(s) 'gpu'"),
        ("    x-gpupin: {count: 0}", "not a number of cards"),
        ("    x-gpupin: {count: 1, verify: full}", "unknown level 'full'"),
        ("    x-gpupin: [GPU-95c6]", "not a mapping"),
        ("    x-gpupin: {gpus: [GPU-95c6]}\n    deploy: {replicas: 2}", "2 replicas"),
        ("    x-gpupin: {gpus: [GPU-95c6]}\n    scale: -1", "`scale: -1` is not a number of containers"),
        ("    x-gpupin: {gpus: [GPU-95c6]}\n    environment: [GPUPIN_EXPECT=GPU-95c6]", "sets GPUPIN_EXPECT by hand"),
        (
            "    x-gpupin: {gpus: [GPU-95c6]}\n    environment: {NVIDIA_VISIBLE_DEVICES: all}",
            "sets NVIDIA_VISIBLE_DEVICES by hand",
        ),
        ("    x-gpupin: {gpus: [GPU-95c6]}\n    labels: [gpupin.devices=x]", "sets the label gpupin.devices"),
        ("    x-gpupin: {gpus: [GPU-95c6]}\n    labels: {gpupin.shared: 'true'}", "sets the label gpupin.shared"),
        (
            "    x-gpupin: {gpus: [GPU-95c6], verify: nvml}\n    environment: [GPUPIN_VERIFY=cuda]",
            "GPUPIN_VERIFY='cuda' but x-gpupin.verify is nvml",
        ),
        (
            "    x-gpupin: {gpus: [GPU-95c6]}\n"
            "    deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}",
            "asks for GPUs twice",
        ),
        (
            "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, device_ids: ['0'], "
            "capabilities: [gpu]}]}}}",
            "both `count` and `device_ids`",
        ),
        (
            "    deploy: {resources: {reservations: {devices: [{driver: nvidia, device_ids: ['1', GPU-95c6], "
            "capabilities: [gpu]}]}}}",
            "already asked for",
        ),  # the case: check passed it, render refused it
        (
            "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}\n"
            "    environment: [GPUPIN_EXPECT=x]",
            "sets GPUPIN_EXPECT by hand beside a count: 1, which names no card",
        ),
        (
            "    x-gpupin: {gpus: [GPU-95c6]}\n    environment: {DOCKER_RESOURCE_GPU: GPU-6cd4}",
            "environment sets DOCKER_RESOURCE_GPU='GPU-6cd4', which the NVIDIA toolkit reads to pick the devices it "
            "exposes, beside its pin",
        ),
        (
            "    environment: [NVIDIA_MIG_MONITOR_DEVICES=all]",  # no request: a GPU nothing names nor checks
            "sets NVIDIA_MIG_MONITOR_DEVICES='all', which the NVIDIA toolkit reads to pick the devices it exposes, so "
            "the NVIDIA runtime may give it devices that no request names",
        ),
        ("    environment: [DOCKER_RESOURCE_GPU]", "sets DOCKER_RESOURCE_GPU (from the shell)"),
        ("    environment: 7\n    x-gpupin: {count: 1}", "neither a list nor a mapping"),
        ("    labels: 7\n    x-gpupin: {count: 1}", "`labels` is neither a list nor a mapping"),
    ],
)
def test_refusals_are_64_and_name_the_service_and_check_says_the_same(body: str, says: str) -> None:
    text = f"services:\n  svc:\n    image: i\n{body}\n"
    err = refusals(text)
    assert err.exit_code == 64, err.problems
    assert err.problems[0].service == "svc" and says in err.problems[0].problem, err.problems
    found = check(text)
    assert not found.ok and [p.line("f") for p in found.refusals] == [p.line("f") for p in err.problems]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("services: [", "not valid YAML"),
        ("[1, 2]", "top level is not a mapping"),
        ("version: '3'\n", "it has no `services:`"),
        ("services: {}", "`services:` is empty"),
        ("services: [a, b]", "`services` is a list, not a mapping"),
        ("services:\n  123:\n    image: i\n", "the service name 123 is not a string (YAML reads it as a number)"),
        ("services:\n  'a b':\n    image: i\n", "the service name 'a b' has characters compose does not allow"),
        ('services:\n  "a\\nb":\n    image: i\n', "the service name 'a\\nb' has characters"),
        ("services:\n  ~:\n    image: i\n", "a service has no name"),
    ],
)
def test_a_malformed_file_is_64_naming_it(text: str, says: str) -> None:
    try:
        doc = parse(text)
    except ServiceError as err:
        assert says in err.message and err.exit_code == 64
        return
    with pytest.raises(RenderRefused) as info:
        render_core(doc, scenario_cards(), {})
    (p,) = info.value.problems
    assert info.value.exit_code == 64 and p.service is None and says in p.problem, p
    assert "\n" not in p.line("f.yml")


def test_every_bad_service_name_is_one_line() -> None:
    found = check("services:\n  'a b': {image: i}\n  123: {image: i}\n  ok: {image: i}\n")
    assert [p.problem.split(" ")[3] for p in found.problems] == ["'a", "123"] and not found.ok


def test_a_quoted_numeric_service_name_renders() -> None:
    doc = render("services:\n  '123':\n    image: i\n    x-gpupin: {gpus: ['1']}\n")
    assert devices(doc["services"]["123"])[0]["device_ids"] == [RTX]
    assert "'123':" in load.dump(doc)


def test_a_malformed_service_is_64_naming_it() -> None:
    err = refusals("services:\n  a: just-text\n  b:\n    image: i\n    deploy: [1]\n    x-gpupin: {count: 1}\n")
    assert err.exit_code == 64 and [(p.service, p.problem) for p in err.problems] == [
        ("a", "the service is not a mapping"),
        ("b", "`deploy` is not a mapping (it is [1])"),
    ]


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


def test_a_rendered_file_checks_clean_and_renders_to_itself() -> None:
    for example in ("two-services.yml", "two-cards-one-service.yml", "wrong-way-count.yml"):
        once = render((EXAMPLES / example).read_text())
        result = examine(once, scenario_cards(), {})
        assert result.ok and result.problems == [], (example, result.problems)
        twice, _ = render_core(once, scenario_cards(), {})
        assert twice == once, example


def test_a_hand_set_expectation_beside_device_ids_keeps_its_local_rank_order() -> None:
    env = f"    environment: ['GPUPIN_EXPECT={A800C},{RTX}']\n"
    svc = render(f"services:\n  a:\n    image: i\n{deploy_ids(RTX, A800C, extra=env)}")["services"]["a"]
    assert devices(svc)[0]["device_ids"] == [A800C, RTX]
    assert svc["environment"] == [f"GPUPIN_EXPECT={expect(A800C, RTX)}", f"NVIDIA_VISIBLE_DEVICES={A800C},{RTX}"]


# --- check: the file as written --------------------------------------------------------------------------------


def test_a_rendered_example_checks_clean() -> None:
    text = (EXAMPLES / "two-services.yml").read_text()
    result = check(load.dump(render(text)))
    assert result.ok and result.problems == []
    assert result.summary() == "ok: 2 service(s) with GPUs, 2 card(s) pinned"
    assert check(text).ok


def test_an_index_is_flagged_with_the_uuid_it_names_today_and_render_pins_it() -> None:
    text = f"services:\n  a:\n    image: i\n{deploy_ids('1')}"
    (p,) = errors_of(check(text))
    assert p.service == "a" and "device id 1 is an NVML index" in p.problem and RTX in p.problem
    assert p.hint is not None and f"device_ids: [{RTX}]" in p.hint
    assert p.render_fixes and devices(render(text)["services"]["a"])[0]["device_ids"] == [RTX]


@pytest.mark.parametrize(
    ("ids", "says", "fixed"),
    [
        (("GPU-95c6",), "is a UUID prefix", True),
        (("3b:00.0",), "without its PCI domain", True),
        (("GPU-00000000-0000-0000-0000-000000000000",), "no card with UUID", False),
        (("9",), "out of range", False),
    ],
)
def test_device_ids_the_runtime_would_not_take_are_errors(ids: tuple[str, ...], says: str, fixed: bool) -> None:
    text = f"services:\n  a:\n    image: i\n{deploy_ids(*ids)}"
    result = check(text)
    assert not result.ok and says in errors_of(result)[0].problem
    assert errors_of(result)[0].render_fixes is fixed
    if fixed:
        assert devices(render(text)["services"]["a"])[0]["device_ids"] == [RTX]
    else:
        assert [p.problem for p in refusals(text).problems] == [p.problem for p in errors_of(result)]


def test_full_bus_ids_and_uuids_are_fine() -> None:
    assert check(f"services:\n  a:\n    image: i\n{deploy_ids('0000:86:00.0', RTX)}").ok


def test_the_wrong_way_count_is_flagged_and_render_fixes_it() -> None:
    text = (EXAMPLES / "wrong-way-count.yml").read_text()
    result = check(text)
    assert not result.ok and result.refusals == []
    warnings = [p for p in result.problems if p.severity == "warning"]
    assert [p.service for p in warnings] == ["trainer", "evaluator"]
    assert all("count: 1 is not a pin" in p.problem and A800 in p.problem for p in warnings)
    (err,) = errors_of(result)
    assert err.service == "evaluator" and err.render_fixes
    assert (
        err.problem == f"as written, count: 1 gets {A800} (index 0, 00000000:1B:00.0, NVIDIA A800-SXM4-80GB), "
        "which is also given to service trainer: both would run on one card"
    )
    doc = render(text)
    assert [devices(doc["services"][s])[0]["device_ids"] for s in ("trainer", "evaluator")] == [[A800], [A800C]]


def test_double_booking_by_uuid_and_index_is_one_problem_per_extra_service() -> None:
    result = check(
        f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}  b:\n    image: i\n    x-gpupin: "
        f"{{gpus: [GPU-95c6]}}\n  c:\n    image: i\n{deploy_ids('00000000:3B:00.0')}"
    )
    errs = errors_of(result)
    assert [p.service for p in errs] == ["b", "c"]
    assert "also given to service a, b" in errs[1].problem


def test_sharing_is_allowed_when_every_service_says_so() -> None:
    shared = "    labels: {gpupin.shared: 'true'}\n"
    text = (
        f"services:\n  a:\n    image: i\n{deploy_ids(RTX, extra=shared)}"
        f"  b:\n    image: i\n    x-gpupin: {{gpus: [GPU-95c6], share: true}}\n"
    )
    assert check(text).ok
    assert not check(text.replace(shared, "")).ok


def test_a_card_held_by_a_running_container_is_flagged_unless_both_share() -> None:
    result = check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}", holding(RTX, name="job7"))
    assert "held by running container job7" in errors_of(result)[0].problem
    shares = "services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6], share: true}\n"
    assert check(shares, holding(RTX, shared=True)).ok
    assert not check(shares, holding(RTX)).ok  # an exclusive holder keeps its card


def test_a_count_as_written_on_a_held_card_is_flagged_and_render_places_it_elsewhere() -> None:
    text = (
        "services:\n  a:\n    image: i\n    deploy: {resources: {reservations: {devices: [{driver: nvidia, "
        "count: 1, capabilities: [gpu]}]}}}\n"
    )
    (err,) = errors_of(check(text, holding(A800, name="job7")))
    assert err.render_fixes and "as written, count: 1 gets" in err.problem and "job7" in err.problem
    assert devices(render(text, holding(A800))["services"]["a"])[0]["device_ids"] == [A800C]


def test_replicas_and_count_with_device_ids_are_errors() -> None:
    result = check(
        f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}    scale: 3\n"
        "  b:\n    image: i\n    deploy: {resources: {reservations: {devices: "
        "[{driver: nvidia, count: 1, device_ids: ['0'], capabilities: [gpu]}]}}}\n"
    )
    assert [(p.service, p.severity) for p in result.problems] == [("a", "error"), ("b", "error")]
    assert "3 replicas" in result.problems[0].problem and "both `count` and `device_ids`" in result.problems[1].problem


@pytest.mark.parametrize(
    ("value", "ok", "says"),
    [
        (f"{RTX}@3b:00.0,{A800C}", True, ""),
        (f"{A800C},GPU-95c6", True, ""),  # another order is another local-rank order, not a mismatch
        (RTX, False, f"names {RTX} but the service is given"),
        (f"{RTX}@af:00.0,{A800C}", False, "but it is at 00000000:3B:00.0"),
        ("GPU-6c", False, "ambiguous"),
        ("cuda:0", False, "is not a GPU UUID"),
    ],
)
def test_gpupin_expect_must_agree_with_the_device_ids(value: str, ok: bool, says: str) -> None:
    env = f"    environment: ['GPUPIN_EXPECT={value}']\n"
    text = f"services:\n  a:\n    image: i\n{deploy_ids(RTX, A800C, extra=env)}"
    result = check(text)
    assert result.ok is ok, result.problems
    if says:
        assert says in errors_of(result)[0].problem
        assert refusals(text).problems[0].problem == errors_of(result)[0].problem


def test_hand_set_visible_devices_that_disagree_with_the_device_request_are_an_error() -> None:
    env = "    environment: [NVIDIA_VISIBLE_DEVICES=0]\n"
    text = f"services:\n  a:\n    image: i\n{deploy_ids(RTX, extra=env)}"
    (p,) = errors_of(check(text))
    assert "NVIDIA_VISIBLE_DEVICES='0', which disagrees with the device request" in p.problem
    assert not p.render_fixes and refusals(text).exit_code == 64
    assert check(text.replace("=0]", f"={RTX}]")).ok


def test_the_legacy_runtime_form_is_read_as_device_ids() -> None:
    result = check("services:\n  a:\n    image: i\n    runtime: nvidia\n    environment: [NVIDIA_VISIBLE_DEVICES=2]\n")
    (p,) = errors_of(result)
    assert "NVIDIA_VISIBLE_DEVICES 2 is an NVML index" in p.problem
    assert p.hint is not None and f"NVIDIA_VISIBLE_DEVICES={A800B}" in p.hint and "device_ids" not in p.hint


def test_a_ledger_label_that_is_not_the_cards_is_an_error() -> None:
    labels = f"    labels: [gpupin.devices={A800}]\n"
    assert (
        "the ledger would be wrong"
        in errors_of(check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX, extra=labels)}"))[0].problem
    )
    assert check(f"services:\n  a:\n    image: i\n{deploy_ids(RTX, extra=labels.replace(A800, RTX))}").ok


def test_the_legacy_runtime_form_renders_to_a_device_request() -> None:
    svc = render(
        "services:\n  a:\n    image: i\n    runtime: nvidia\n    environment: [NVIDIA_VISIBLE_DEVICES=3, X=1]\n"
    )["services"]["a"]
    assert "runtime" not in svc and devices(svc)[0]["device_ids"] == [A800C]
    assert svc["environment"] == [f"NVIDIA_VISIBLE_DEVICES={A800C}", "X=1", f"GPUPIN_EXPECT={expect(A800C)}"]


def test_mig_devices_collide_with_their_parent_card() -> None:
    mig = scenario_cards("mig")
    parent = mig[0].uuid
    migs = [m.uuid for m in mig[0].mig_devices]
    doc = parse(
        f"services:\n  a:\n    image: i\n    x-gpupin: {{gpus: ['{migs[0]}']}}\n"
        f"  b:\n    image: i\n    x-gpupin: {{gpus: ['0:1']}}\n"
        f"  c:\n    image: i\n    x-gpupin: {{gpus: ['{parent}']}}\n"
    )
    found = examine(doc, mig, {})
    assert [p.service for p in found.refusals] == ["c"] and "is in MIG mode" in found.refusals[0].problem
    assert found.plan["b"][0].uuid == migs[1]


def test_problems_print_as_one_line_and_as_json() -> None:
    p = Problem("a", "something is wrong", "fix it")
    assert p.line("f.yml") == "f.yml: service a: something is wrong. HINT: fix it"
    assert Problem(None, "x", None, "warning").line("f.yml") == "f.yml: warning: x."
    assert Problem(None, "a\nb\ud800", None).line("f\n.yml") == "f\\n.yml: a\\nb\\ud800."
    assert p.to_dict() == {
        "service": "a",
        "problem": "something is wrong",
        "hint": "fix it",
        "severity": "error",
        "render_fixes": False,
    }


def test_the_projects_own_containers_are_not_counted_against_it(tmp_path: Path) -> None:
    doc = parse("name: Ml-Run\nservices: {a: {image: i}}\n")
    names = command.project_names(doc, [str(tmp_path / "My Dir" / "f.yml")], {"COMPOSE_PROJECT_NAME": "p1"})
    assert names == {"p1", "Ml-Run", "mydir"}
    summaries = [
        {"Id": "1", "Labels": {"com.docker.compose.project": "p1", "com.docker.compose.service": "a"}},
        {"Id": "2", "Labels": {"com.docker.compose.project": "p1", "com.docker.compose.service": "z"}},
        {"Id": "3", "Labels": {"com.docker.compose.project": "p2", "com.docker.compose.service": "a"}},
    ]
    assert command.own_container_ids(summaries, names, {"a"}) == {"1"}


# --- compose v2's GPU forms: `driver: cdi`, CDI names in `devices:`, service-level `gpus:` ----------------------

SERVED = cdi.Detection(True, "a test spec", [str(i) for i in range(4)] + [A800, RTX, A800B, A800C, "all"])


@pytest.mark.parametrize(
    ("body", "form", "specs", "count"),
    [
        ("    gpus: all", "service-level `gpus:`", [], -1),
        ("    gpus: [{driver: nvidia, device_ids: ['3', GPU-95c6]}]", "service-level `gpus:`", ["3", "GPU-95c6"], None),
        ("    gpus: [{count: 2, capabilities: [utility]}]", "service-level `gpus:`", [], 2),
        (
            CDI_DEPLOY % "'nvidia.com/gpu=3', 'nvidia.com/gpu=GPU-95c6'",
            "CDI device request (driver: cdi)",
            ["3", "GPU-95c6"],
            None,
        ),
        (CDI_DEPLOY % "nvidia.com/gpu=all", "CDI device request (driver: cdi)", [], -1),
        (
            "    devices: ['nvidia.com/gpu=gpu3', /dev/fuse, {source: 'nvidia.com/gpu=1'}]",
            "CDI names in `devices:`",
            ["3", "1"],
            None,
        ),
    ],
)
def test_every_compose_v2_gpu_form_is_read(body: str, form: str, specs: list[str], count: int | None) -> None:
    r = gpu_request("a", parse(f"image: i\n{body[4:]}\n"))
    assert r is not None and (r.form.name, r.specs, r.count) == (form, specs, count)
    result = check(f"services:\n  a:\n    image: i\n{body}\n")
    assert len(result.requests) == 1  # never "0 services with GPUs"


def test_compose_check_of_gpus_all_says_what_each_compose_does_with_it() -> None:
    result = check("services:\n  a:\n    image: i\n    gpus: all\n")
    assert result.ok and result.summary().startswith("ok: 1 service(s) with GPUs")
    notes = [p.problem for p in result.problems]
    assert [p.severity for p in result.problems] == ["warning", "warning"]
    assert any("every card is not a pin" in n for n in notes)
    assert any(
        "compose before v2.30 does not read it" in n and "v2.26 starts the service without any GPU" in n for n in notes
    )


def test_compose_v2_forms_render_to_a_device_entry_every_compose_reads() -> None:
    text = (
        "services:\n  a:\n    image: i\n    gpus: [{device_ids: ['1']}]\n"
        "  b:\n    image: i\n    devices: [/dev/fuse, 'nvidia.com/gpu=3']\n"
        f"  c:\n    image: i\n{CDI_DEPLOY % 'nvidia.com/gpu=0'}\n"
    )
    doc = render(text)  # no daemon asked: the nvidia driver's request
    a, b, c = (doc["services"][n] for n in "abc")
    assert "gpus" not in a and devices(a) == [{"driver": "nvidia", "device_ids": [RTX], "capabilities": ["gpu"]}]
    assert b["devices"] == ["/dev/fuse"] and devices(b)[0]["device_ids"] == [A800C]
    assert devices(c) == [{"driver": "nvidia", "device_ids": [A800], "capabilities": ["gpu"]}]
    assert all(s["environment"]["NVIDIA_VISIBLE_DEVICES"] == devices(s)[0]["device_ids"][0] for s in (a, b, c))
    assert render_core(doc, scenario_cards(), {})[0] == doc and check(load.dump(doc)).problems == []


def test_render_pins_through_cdi_where_the_daemon_serves_the_cards_and_drops_the_variable_cdi_voids() -> None:
    text = (
        "services:\n  a:\n    image: i\n    x-gpupin: {gpus: ['1', '3']}\n"
        "  b:\n    image: i\n    runtime: nvidia\n    environment: [NVIDIA_VISIBLE_DEVICES=0, X=1]\n"
        "  c:\n    image: i\n    deploy: {resources: {reservations: {devices: [{driver: nvidia, "
        "device_ids: ['2'], capabilities: [gpu, utility]}]}}}\n"
    )
    doc, _ = render_core(parse(text), scenario_cards(), {}, SERVED)
    a, b, c = (doc["services"][n] for n in "abc")
    assert devices(a) == [
        {"driver": "cdi", "device_ids": [f"nvidia.com/gpu={RTX}", f"nvidia.com/gpu={A800C}"], "capabilities": ["gpu"]}
    ]
    assert a["environment"] == {"GPUPIN_EXPECT": expect(RTX, A800C)}
    assert "runtime" not in b and b["environment"] == ["X=1", f"GPUPIN_EXPECT={expect(A800)}"]
    assert devices(b)[0]["device_ids"] == [f"nvidia.com/gpu={A800}"]
    # Driver capabilities beside `gpu` mean something to the nvidia driver only: that service keeps it.
    assert devices(c) == [{"driver": "nvidia", "device_ids": [A800B], "capabilities": ["gpu", "utility"]}]
    assert render_core(doc, scenario_cards(), {}, SERVED)[0] == doc and check(load.dump(doc)).problems == []
    # A spec without the UUID names (the `index` strategy alone) is no pin: the nvidia driver then.
    by_index = cdi.Detection(True, "an index-only spec", ["0", "1", "2", "3", "all"])
    rendered = render_core(parse(text), scenario_cards(), {}, by_index)[0]
    assert devices(rendered["services"]["a"])[0]["driver"] == "nvidia"
    # --via decides instead; capabilities cannot go through CDI.
    forced, _ = render_core(parse(text.split("  c:")[0]), scenario_cards(), {}, via="cdi")
    assert devices(forced["services"]["a"])[0]["driver"] == "cdi"
    with pytest.raises(RenderRefused) as info:
        render_core(parse(text), scenario_cards(), {}, via="cdi")
    assert [p.service for p in info.value.problems] == ["c"] and "utility" in info.value.problems[0].problem


def test_a_cdi_index_is_flagged_and_what_the_spec_does_not_name_is_an_error() -> None:
    (p,) = errors_of(check(f"services:\n  a:\n    image: i\n{CDI_DEPLOY % 'nvidia.com/gpu=1'}\n"))
    assert "CDI device 1 is an NVML index" in p.problem and p.render_fixes
    assert p.hint is not None and f"device_ids: [nvidia.com/gpu={RTX}]" in p.hint
    (p,) = errors_of(check("services:\n  a:\n    image: i\n    devices: ['nvidia.com/gpu=GPU-95c6']\n"))
    assert "is a UUID prefix, which NVIDIA's CDI spec does not name" in p.problem and p.render_fixes


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (CDI_DEPLOY.replace("device_ids: [%s]", "count: 1"), "a CDI device request has a `count`"),
        (CDI_DEPLOY % "'nvidia.com/gpu=1', 'vendor.com/fpga=0'", "mixes 'vendor.com/fpga=0' with nvidia.com/gpu"),
        (CDI_DEPLOY % "'nvidia.com/gpu=all', 'nvidia.com/gpu=1'", "names nvidia.com/gpu=all beside other cards"),
        ("    gpus: some", "`gpus: 'some'` is neither `all` nor a list"),
        ("    gpus: [{count: 1}, {count: 1}]", "`gpus:` has 2 requests"),
        ("    gpus: [{driver: amd, count: 1}]", "asks the driver 'amd'"),
        ("    gpus: all\n    x-gpupin: {gpus: ['1']}", "asks for GPUs twice: x-gpupin and service-level `gpus:`"),
        (
            f"{CDI_DEPLOY % 'nvidia.com/gpu=1'}\n    devices: ['nvidia.com/gpu=2']",
            "CDI device request (driver: cdi) and CDI names in `devices:`",
        ),
    ],
)
def test_malformed_compose_v2_gpu_requests_are_refused_by_both(body: str, says: str) -> None:
    text = f"services:\n  a:\n    image: i\n{body}\n"
    (p,) = errors_of(check(text))
    assert says in p.problem and not p.render_fixes, p
    assert refusals(text).problems[0].problem == p.problem


def test_other_cdi_kinds_are_no_gpu() -> None:
    text = f"services:\n  a:\n    image: i\n    devices: ['vendor.com/fpga=0']\n{CDI_DEPLOY % 'vendor.com/fpga=1'}\n"
    assert gpu_request("a", parse(text)["services"]["a"]) is None and check(text).problems == []


def test_gpu_request_reads_each_form() -> None:
    r = gpu_request("s", parse("image: i\nx-gpupin: {gpus: 'GPU-95c6, 3'}\n"))
    assert r is not None and r.specs == ["GPU-95c6", "3"] and r.form.name == "x-gpupin"
    r = gpu_request("s", parse("image: i\ndeploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}\n"))
    assert r is not None and r.count == -1  # no count and no ids: every card, as `--gpus all`
    r = gpu_request(
        "s",
        parse(
            "image: i\nruntime: nvidia\nenvironment: {NVIDIA_VISIBLE_DEVICES: '1'}\n"
            "deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, "
            "capabilities: [gpu]}]}}}\n"
        ),
    )
    assert r is not None and r.form.name == "deploy device request"  # the runtime form yields to a device request
    assert gpu_request("s", parse("image: i\n")) is None


# --- the CLI on the simulated host ----------------------------------------------------------------------------


def hostagent(
    *args: str, docker_host: str = "unix:///nonexistent/docker.sock", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = simhost_env(DOCKER_HOST=docker_host)
    return subprocess.run([HOSTAGENT, *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


def listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def one_error(r: subprocess.CompletedProcess[str]) -> str:
    """The one ERROR line of a refusal (the ledger warning aside); never a traceback."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(lines) == 1 and lines[0].startswith("hostagent: ERROR: ") and " HINT: " in lines[0], r.stderr
    return lines[0]


def test_cli_render_writes_the_pinned_file_and_says_docker_was_not_read(fakegpu: Path, tmp_path: Path) -> None:
    out = tmp_path / "pinned.yml"
    src = tmp_path / "two-services.yml"
    shutil.copy(EXAMPLES / "two-services.yml", src)
    r = hostagent("compose", "render", str(src), "-o", str(out))
    assert r.returncode == 0, r
    assert r.stdout == "" and "warning: the ledger was not read" in r.stderr
    text = out.read_text()
    assert text.startswith("# Rendered by `hostagent compose render two-services.yml`")
    assert f"#   trainer: cuda:0 = {RTX} at 00000000:3B:00.0 (NVIDIA GeForce RTX 4090)" in text
    doc = parse(text)
    assert devices(doc["services"]["evaluator"])[0]["device_ids"] == [A800C]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pinned.yml", "two-services.yml"]
    assert hostagent("compose", "check", str(out)).stdout.splitlines() == [
        "ok: 2 service(s) with GPUs, 2 card(s) pinned"
    ]


def test_cli_render_refusal_writes_nothing_and_prints_one_line_each(fakegpu: Path, tmp_path: Path) -> None:
    src = tmp_path / "bad.yml"
    src.write_text(
        "services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-6c]}\n"
        "  b:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]}\n    deploy: {replicas: 2}\n"
    )
    out = tmp_path / "out.yml"
    out.write_text("an older render\n")
    out.chmod(0o640)
    r = hostagent("compose", "render", str(src), "-o", str(out))
    assert r.returncode == 64, r
    lines = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(lines) == 2 and r.stdout == ""
    assert lines[0].startswith(f"hostagent: ERROR: {src}: service a: the UUID prefix 'GPU-6c' is ambiguous")
    assert "HINT:" in lines[0] and f"{src}: service b: asks for 2 replicas" in lines[1]
    assert listing(tmp_path) == {"bad.yml": src.read_bytes(), "out.yml": b"an older render\n"}
    # The check of the same file prints the same two problems.
    c = hostagent("compose", "check", str(src))
    assert c.returncode == 64 and c.stdout.splitlines() == [ln.removeprefix("hostagent: ERROR: ") for ln in lines]
    # A render that succeeds keeps the mode of the file it replaces.
    src.write_text("services:\n  a:\n    image: i\n    x-gpupin: {gpus: [GPU-95c6]}\n")
    assert hostagent("compose", "render", str(src), "-o", str(out)).returncode == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and RTX in out.read_text()


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ("/nonexistent/x.yml", "-o /nonexistent/x.yml: the directory /nonexistent does not exist"),
        ("/tmp", "-o /tmp is a directory"),
        ("{dir}", "is a directory"),
        ("{src}", "is the file being rendered"),
        ("{link}", "is the file being rendered"),
        ("/proc/gpupin-x.yml", "-o /proc/gpupin-x.yml: cannot write it"),
    ],
)
def test_cli_render_refuses_an_output_it_cannot_or_must_not_write(
    fakegpu: Path, tmp_path: Path, output: str, says: str
) -> None:
    src = tmp_path / "two-services.yml"
    shutil.copy(EXAMPLES / "two-services.yml", src)
    (tmp_path / "link.yml").symlink_to(src)
    before = listing(tmp_path)
    out = output.format(dir=tmp_path, src=src, link=tmp_path / "link.yml")
    r = hostagent("compose", "render", str(src), "-o", out)
    assert r.returncode == 64 and r.stdout == "", r
    assert says in one_error(r)
    assert listing(tmp_path) == before and not os.path.exists("/nonexistent")


def test_cli_render_elsewhere_notes_the_relative_paths_compose_would_resolve_there(
    fakegpu: Path, tmp_path: Path
) -> None:
    src = tmp_path / "app" / "train.yml"
    src.parent.mkdir()
    src.write_text(
        "services:\n"
        "  trainer:\n"
        "    build: ./trainer\n"
        "    env_file: ./trainer.env\n"
        '    volumes: ["named:/cache", "./data:/data"]\n'
        "    x-gpupin: {gpus: ['1']}\n"
        "  evaluator:\n"
        "    image: gpupin:test\n"
        '    volumes: [{type: bind, source: ../datasets, target: /datasets}, "/abs:/abs"]\n'
        "    x-gpupin: {gpus: ['3']}\n"
    )
    (src.parent / "trainer.env").write_text("EPOCHS=3\n")  # compose refuses a missing env file; so does render
    r = hostagent("compose", "render", str(src), "-o", str(tmp_path / "pinned.yml"))
    assert r.returncode == 0, r
    notes = [ln for ln in r.stderr.splitlines() if "relative paths" in ln]
    assert len(notes) == 1 and notes[0].startswith(
        "hostagent: note: trainer's build, trainer's env_file, trainer's volumes, evaluator's volumes: relative "
        "paths, which compose resolves against"
    ), r.stderr
    shutil.copy(EXAMPLES / "two-services.yml", src)  # no relative path in it: nothing to say
    r = hostagent("compose", "render", str(src), "-o", str(tmp_path / "pinned.yml"))
    assert r.returncode == 0 and "relative paths" not in r.stderr, r


def test_cli_render_to_a_bare_name_writes_its_temporary_file_in_the_cwd(fakegpu: Path, tmp_path: Path) -> None:
    src = tmp_path / "two-services.yml"
    shutil.copy(EXAMPLES / "two-services.yml", src)
    r = hostagent("compose", "render", "two-services.yml", "-o", "pinned.yml", cwd=tmp_path)
    assert r.returncode == 0, r
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pinned.yml", "two-services.yml"]
    assert "relative paths" not in r.stderr  # beside the source: no note
    r = hostagent("compose", "render", "two-services.yml", "-o", "/dev/null", cwd=tmp_path)
    assert r.returncode == 0 and stat.S_ISCHR(os.stat("/dev/null").st_mode), r
    r = hostagent("compose", "render", "two-services.yml", "-o", "-", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("# Rendered by"), r


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "is a directory, not a compose file"),
        (b"", "holds no YAML document"),
        (b"services:\n  a: {image: \xe9t\xe9}\n", "not UTF-8 text (byte 0xe9 at line 2, column 14)"),
        (b"services:\n\ta: {image: i}\n", "not valid YAML"),
        (b"services:\n  123:\n    image: i\n", "the service name 123 is not a string"),
        (ALIAS_BOMB.encode(), "alias bomb"),
    ],
)
def test_cli_bad_files_are_one_line_64_for_render_and_check(
    fakegpu: Path, tmp_path: Path, content: bytes | None, says: str
) -> None:
    src = tmp_path / "in.yml"
    if content is None:
        src.mkdir()
    else:
        src.write_bytes(content)
    out = tmp_path / "out.yml"
    r = hostagent("compose", "render", str(src), "-o", str(out))
    assert r.returncode == 64 and says in one_error(r) and not out.exists(), r
    assert one_error(r).startswith(f"hostagent: ERROR: {src}: ")
    c = hostagent("compose", "check", str(src))
    assert c.returncode == 64 and "Traceback" not in c.stderr, c
    (line,) = c.stdout.splitlines()
    assert line.startswith(f"{src}: ") and says in line
    c = hostagent("compose", "check", str(src), "--json")
    assert c.returncode == 64 and json.loads(c.stdout)[0]["service"] is None, c


def test_cli_check_refuses_a_double_booked_file_one_line_per_problem(fakegpu: Path, tmp_path: Path) -> None:
    src = tmp_path / "double.yml"
    src.write_text(
        f"services:\n  a:\n    image: i\n{deploy_ids(RTX)}  b:\n    image: i\n{deploy_ids(RTX)}"
        f"  c:\n    image: i\n{deploy_ids('1')}"
    )
    r = hostagent("compose", "check", str(src))
    assert r.returncode == 64, r
    share = (
        "give each service its own card (name another, or ask for a `count` and let render place it), or mark "
        "every service that shares it `x-gpupin: {share: true}` (or, in the standard forms, label "
        "gpupin.shared=true)"
    )
    assert r.stdout.splitlines() == [
        f"{src}: service b: {RTX} (index 1, 00000000:3B:00.0, NVIDIA GeForce RTX 4090) is also given to "
        f"service a: both would run on one card. HINT: {share}",
        f"{src}: service c: device id 1 is an NVML index: today it is {RTX} (index 1, 00000000:3B:00.0, NVIDIA "
        "GeForce RTX 4090), but indices follow PCI bus order and name another card after a card is added, removed "
        f"or lost. HINT: pin it by UUID: device_ids: [{RTX}] (or `x-gpupin: {{gpus: [{RTX}]}}` and render)",
        f"{src}: service c: {RTX} (index 1, 00000000:3B:00.0, NVIDIA GeForce RTX 4090) is also given to service "
        f"a, b: both would run on one card. HINT: {share}",
    ]
    r = hostagent("compose", "check", str(src), "--json")
    problems = json.loads(r.stdout)
    assert r.returncode == 64 and [(p["service"], p["severity"], p["render_fixes"]) for p in problems] == [
        ("b", "error", False),
        ("c", "error", True),
        ("c", "error", False),
    ]
    assert set(problems[0]) == {"service", "problem", "hint", "severity", "render_fixes"}


def test_every_package_folder_is_in_the_distribution() -> None:
    """setuptools installs only the packages listed: a subpackage left out (hostagent/compose/) would be missing
    from `pip install gpupin[host]`, though the editable install finds it."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        f"gpupin.{p.parent.relative_to(REPO).as_posix().replace('/', '.')}"
        for top in ("core", "entrypoint", "hostagent")
        for p in (REPO / top).rglob("__init__.py")
    }
    assert folders == set(config["packages"])
    roots = config["package-dir"]  # a subpackage lies under its top package's folder, as setuptools finds it
    for p in config["packages"]:
        top = ".".join(p.split(".")[:2])
        assert (REPO / roots[top] / "/".join(p.split(".")[2:])).is_dir(), p

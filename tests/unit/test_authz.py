"""The authorization plugin's rules (gpupin.hostagent.authz): what Docker sends it, read; what it decides alone and
what the agent decides with the ledger; grants; the plugin's own server on a unix socket, without a daemon."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.hostagent import http1
from gpupin.hostagent.authz import judge, plugin, request
from gpupin.hostagent.authz.grant import ANY_NAME, LABEL, GrantRefused, Grants
from gpupin.hostagent.ledger.holding_forms import HostCards, grants
from gpupin.hostagent.policy import EnforceRule, PolicyError, parse_policy
from tests.support.hypo import examples
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")
ON = EnforceRule(mode="on")
NO_GRANTS = EnforceRule(mode="on", grants=False)
WARN = EnforceRule(mode="warn")


def host() -> HostCards:
    cards = scenario_cards()
    for i, c in enumerate(cards):
        c.minor_number = i
    return HostCards(cards)


def msg(body: Any = None, uri: str = "/v1.41/containers/create?name=job", method: str = "POST") -> dict[str, Any]:
    m: dict[str, Any] = {"RequestMethod": method, "RequestUri": uri, "RequestHeaders": {}}
    if body is not None:
        m["RequestBody"] = base64.b64encode(json.dumps(body).encode()).decode()
    return m


def create(
    gpus: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None, **host_config: Any
) -> dict[str, Any]:
    """A create's body as the docker CLI sends it."""
    return {"Image": "img", "Env": [], "Labels": labels or {}, "HostConfig": {"DeviceRequests": gpus, **host_config}}


def gpus(ids: list[str] | None = None, count: int = 0) -> list[dict[str, Any]]:
    return [{"Driver": "", "Count": count, "DeviceIDs": ids, "Capabilities": [["gpu"]], "Options": {}}]


def free(_uuid: str) -> str | None:
    return None


def decide(
    m: dict[str, Any], rule: EnforceRule, held_by: Any = free, g: Grants | None = None, over: Any = None
) -> judge.Verdict:
    """The plugin's first look, then the agent's judgement where the plugin leaves it to the agent."""
    asked = request.read(m)
    first, cards, c = judge.first_look(asked, host(), rule)
    if first is not None:
        return first
    return judge.warned(rule, judge.judge(asked, cards, c, host(), rule, held_by, g or Grants(), over))


# --- what Docker sends ------------------------------------------------------------------------------------------


def test_the_request_is_read_without_its_api_version_and_with_its_name() -> None:
    asked = request.read(msg(create(), uri="/v1.47/containers/create?name=%2Ftrain-a&platform=x"))
    assert (asked.method, asked.path, asked.name, asked.kind) == ("POST", "/containers/create", "train-a", "create")
    assert request.read(msg(uri="/containers/create")).kind == "create"  # unversioned
    assert request.read(msg({"Memory": 1}, uri="/v1.41/containers/abc/update")).kind == "update"
    assert request.read(msg({}, uri="/v1.41/services/create")).kind == "service"
    for uri, method in (("/v1.41/containers/json", "GET"), ("/v1.41/containers/abc/start", "POST"), ("/_ping", "HEAD")):
        assert request.read(msg(uri=uri, method=method)).kind is None


def test_a_create_reads_as_its_inspect_with_binds_in_mounts() -> None:
    c = request.container(
        request.read(
            msg(
                create(Binds=["/dev:/dev:ro", "vol:/data"], Mounts=[{"Type": "bind", "Source": "/etc", "Target": "/e"}])
            )
        ).body
    )
    assert c["Mounts"] == [
        {"Type": "bind", "Source": "/dev", "Destination": "/dev"},
        {"Type": "bind", "Source": "/etc", "Destination": "/e"},
    ]
    assert c["Config"]["Image"] == "img" and "HostConfig" not in c["Config"]


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.text(max_size=20), st.one_of(st.text(max_size=40), st.integers(), st.none()), max_size=6))
def test_any_message_is_read_and_judged_without_an_exception(m: dict[str, Any]) -> None:
    asked = request.read(m)
    judge.first_look(asked, host(), ON)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.integers(), st.text(max_size=8)),
        lambda x: (
            st.dictionaries(
                st.sampled_from(
                    ["HostConfig", "DeviceRequests", "Devices", "Binds", "Mounts", "Env", "Privileged", "Count"]
                ),
                x,
                max_size=4,
            )
            | st.lists(x, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_any_create_body_is_judged_without_an_exception(body: Any) -> None:
    v = decide(msg(body if isinstance(body, dict) else {"x": body}), ON)
    assert isinstance(v.allow, bool)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.integers(-2, 5), st.text(max_size=8), st.just("GPU"), st.just("trainer")),
        lambda x: (
            st.dictionaries(
                st.sampled_from(
                    ["Name", "Labels", "Mode", "Replicated", "Global", "Replicas", "TaskTemplate", "ContainerSpec",
                     "Env", "Mounts", "CapabilityAdd", "Resources", "Reservations", "GenericResources",
                     "DiscreteResourceSpec", "NamedResourceSpec", "Kind", "Value", LABEL]
                ),
                x,
                max_size=4,
            )
            | st.lists(x, max_size=3)
        ),
        max_leaves=16,
    )
)  # fmt: skip
def test_any_service_body_is_judged_without_an_exception(body: Any) -> None:
    for uri in ("/v1.41/services/create", "/v1.41/services/abc/update?version=3"):
        v = decide(msg(body if isinstance(body, dict) else {"x": body}, uri=uri), ON)
        assert isinstance(v.allow, bool)


# --- what the plugin decides alone --------------------------------------------------------------------------------


def test_requests_that_reach_no_card_are_allowed_without_the_agent() -> None:
    for m in (
        msg(create()),
        msg(create(Binds=["/data:/data"], Memory=1 << 30)),
        msg(uri="/v1.41/containers/json", method="GET"),
        msg(uri="/v1.41/containers/x/start"),
        msg({"Memory": 5}, uri="/v1.41/containers/x/update"),
    ):
        v, cards, _ = judge.first_look(request.read(m), host(), ON)
        assert v is not None and v.allow and not v.msg and cards == []


def test_mode_off_allows_everything_unread() -> None:
    v, _, _ = judge.first_look(request.read(msg(create(gpus(count=-1), Privileged=True))), host(), EnforceRule())
    assert v is not None and v.allow


def test_a_create_without_a_body_is_refused() -> None:
    v, _, _ = judge.first_look(request.read(msg(uri="/v1.41/containers/create")), host(), ON)
    assert v is not None and not v.allow and "without a body" in v.msg


@pytest.mark.parametrize(
    ("host_config", "said"),
    [
        ({"Privileged": True}, "--privileged"),
        ({"PidMode": "host"}, "--pid host"),
        ({"Binds": ["/:/host"]}, "a bind mount of /"),
        ({"Binds": ["/var/run/docker.sock:/s"]}, "a bind mount of /var/run/docker.sock"),
        ({"Mounts": [{"Type": "bind", "Source": "/etc/", "Target": "/x"}]}, "a bind mount of /etc"),
        ({"CapAdd": ["CAP_SYS_ADMIN"]}, "--cap-add SYS_ADMIN"),
        ({"CapAdd": ["all"]}, "--cap-add ALL"),
    ],
)
def test_the_escape_baseline_is_refused_unless_the_policy_allows_it(host_config: dict[str, Any], said: str) -> None:
    v = decide(msg(create(**host_config)), ON)
    assert not v.allow and said in v.msg and v.msg.startswith("gpupin: ")
    part = judge.escapes(request.container(request.read(msg(create(**host_config))).body))[0][0]
    allowed = decide(msg(create(**host_config)), EnforceRule(mode="on", allow=(part,)))
    assert allowed.allow


# --- what the agent decides ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (create(gpus(count=-1)), "--gpus all pins no card"),
        (create(gpus(count=2)), "--gpus 2 pins no card"),
        (create(gpus(["all"])), "pins no card"),
        ({"Image": "i", "Env": ["NVIDIA_VISIBLE_DEVICES=all"], "HostConfig": {"Runtime": "nvidia"}}, "pins no card"),
        (
            create(Devices=[{"PathOnHost": "nvidia.com/gpu=all", "PathInContainer": "", "CgroupPermissions": ""}]),
            "pins",
        ),
    ],
)
def test_a_request_that_pins_nothing_is_refused_with_the_run_that_would_pin_it(body: dict[str, Any], said: str) -> None:
    v = decide(msg(body), NO_GRANTS)
    assert not v.allow and said in v.msg and "hostagent run --count" in v.msg
    count = 2 if said.startswith("--gpus 2") else 4  # the count asked, or every card of the host
    assert f"hostagent run --count {count} IMAGE" in v.msg


def test_a_held_card_is_refused_with_its_holder_whatever_the_form() -> None:
    def held_by(uuid: str) -> str | None:
        return "held by train-a (alice) until 14:05" if uuid == RTX else None

    forms = [
        create(gpus([RTX])),
        create(gpus(["1"])),
        create(Devices=[{"PathOnHost": f"nvidia.com/gpu={RTX}", "PathInContainer": "", "CgroupPermissions": ""}]),
        {"Image": "i", "Env": [f"NVIDIA_VISIBLE_DEVICES={RTX}"], "HostConfig": {"Runtime": "nvidia"}},
        {"Image": "i", "Env": [f"DOCKER_RESOURCE_GPU={RTX}"], "HostConfig": {}},
        create(Annotations={"cdi.k8s.io/x": "nvidia.com/gpu=1"}),
    ]
    for body in forms:
        v = decide(msg(body), NO_GRANTS, held_by)
        assert not v.allow, body
        assert v.msg == (
            f"gpupin: card 1 ({RTX}) is held by train-a (alice) until 14:05: hostagent run --wait waits for it, "
            "hostagent ls shows the free ones"
        )
        assert decide(msg(body), NO_GRANTS).allow  # the same on a free card, grants off


def test_a_card_this_host_lacks_is_refused() -> None:
    v = decide(msg(create(gpus(["GPU-00000000-0000-0000-0000-00000000dead"]))), NO_GRANTS)
    assert not v.allow and "names no card of this host" in v.msg


def test_warn_allows_and_says_what_it_would_refuse() -> None:
    v = decide(msg(create(gpus(count=-1))), WARN)
    assert v.allow and v.msg.startswith("WARN gpupin: --gpus all pins no card")
    assert (
        decide(msg(create(gpus([RTX]))), WARN).msg == "WARN gpupin: only the agent's containers may take cards "
        f"on this host (--gpus device={RTX}): {judge.RUN_HINT}"
    )


def test_updates_that_reach_cards_are_refused() -> None:
    v = decide(msg({"DeviceRequests": gpus([RTX])}, uri="/v1.41/containers/x/update"), NO_GRANTS)
    assert not v.allow and "an update that gives a container cards" in v.msg


# --- grants -----------------------------------------------------------------------------------------------------


def test_under_on_only_a_grant_of_the_agents_admits_a_create_and_only_once() -> None:
    g = Grants()
    body = create(gpus([RTX]))
    refused = decide(msg(body), ON, g=g)
    assert not refused.allow and "only the agent's containers may take cards" in refused.msg
    body["Labels"] = {LABEL: g.issue("job", [RTX], 1001)}
    ok = decide(msg(body), ON, g=g)
    assert ok.allow and ok.uid == 1001
    again = decide(msg(body), ON, g=g)
    assert not again.allow and "used already" in again.msg


def test_a_forged_copied_or_stale_grant_is_refused() -> None:
    g = Grants()
    value = g.issue("job", [RTX], 1001)
    nonce, expiry, uid, mac = value.split(".")[1:]
    cases = {
        "forged uid": ".".join(("1", nonce, expiry, "0", mac)),
        "forged mac": ".".join(("1", nonce, expiry, uid, "0" * 32)),
        "another agent's": Grants().issue("job", [RTX], 1001),
        "garbage": "let me in",
    }
    for why, forged in cases.items():
        v = decide(msg(create(gpus([RTX]), {LABEL: forged})), ON, g=g)
        assert not v.allow, why
    # bound to the name and the cards
    assert (
        "not signed by this agent"
        in decide(msg(create(gpus([RTX]), {LABEL: value}), uri="/v1.41/containers/create?name=other"), ON, g=g).msg
    )
    assert not decide(msg(create(gpus([A800B]), {LABEL: value})), ON, g=g).allow
    stale = Grants(ttl=-1)
    with pytest.raises(GrantRefused, match="expired"):
        stale.admit(stale.issue("job", [RTX], 7), "job", [RTX])


def test_a_grant_on_a_held_card_is_still_refused() -> None:
    g = Grants()
    body = create(gpus([RTX]), {LABEL: g.issue("job", [RTX], 1001)})
    v = decide(msg(body), ON, lambda u: "held by other" if u == RTX else None, g)
    assert not v.allow and "held by other" in v.msg


# --- Swarm services -----------------------------------------------------------------------------------------------

# What the docker CLI sends a Swarm manager, captured at its plugin (tests/data/authz-service-bodies.json says how).
SENT = json.loads((Path(__file__).parent.parent / "data" / "authz-service-bodies.json").read_text())
STACK, REDEPLOY, SCALE = "stack deploy (create)", "stack deploy again (update)", "service scale ml_trainer=2 (update)"
SERVICE, SERVICE_UPDATE = "service create --generic-resource GPU=2", "service update --force"
GLOBAL = "service create --mode global"
TRAINER = request.Reserved({"GPU": 1}, 4)  # what compose/swarm-replicas.yml renders to: 4 replicas x 1 GPU


def sent(what: str, grant: str | None = None, **spec: Any) -> dict[str, Any]:
    """The CLI's request `what`, its gpupin.grant label set to `grant` (None: none), its spec's fields to `spec`."""
    body = json.loads(json.dumps(SENT[what]["body"]))
    body["Labels"].pop(LABEL, None)
    if grant is not None:
        body["Labels"][LABEL] = grant
    body.update(spec)
    return msg(body, uri=SENT[what]["uri"])


def test_a_service_reads_as_the_cli_sends_it() -> None:
    def read(what: str) -> tuple[str, str, request.Reserved | None]:
        spec = request.service(request.read(sent(what)).body)
        return str(spec["Name"]), request.service_key(spec), request.reserved(spec)

    assert request.read(sent(REDEPLOY)).kind == request.read(sent(STACK)).kind == request.SERVICE
    assert read(STACK) == read(REDEPLOY) == ("ml_trainer", "trainer", TRAINER)  # the stack's name is not the key's
    assert read(SCALE)[2] == request.Reserved({"GPU": 1}, 2)
    assert read(SERVICE) == read(SERVICE_UPDATE) == ("svc", "svc", request.Reserved({"GPU": 2}, 1))
    assert read(GLOBAL)[2] == request.Reserved({"GPU": 1}, "global")
    # scaled to 0 (`docker service scale S=0`, the agent at a booking's end): no card, nothing to judge, no grant
    assert decide(sent(SCALE, Mode={"Replicated": {"Replicas": 0}}), ON).allow
    # what no GPU kind is reserved by is no service of the judge's
    assert decide(sent(STACK, TaskTemplate={"ContainerSpec": {"Image": "x"}}), ON).allow
    other = {"Resources": {"Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "fpga"}}]}}}
    assert decide(sent(STACK, TaskTemplate=other), ON).allow
    # the daemon's decoding: case folded, null ignored, a replica count that is no count refused
    folded = sent(STACK, mode={"replicated": {"replicas": 9}}, Mode=None)
    assert request.reserved(request.service(request.read(folded).body)) == request.Reserved({"GPU": 1}, 9)
    v = decide(sent(STACK, Mode={"Replicated": {"Replicas": "4"}}), ON)
    assert not v.allow and "Replicas is not a number" in v.msg


@settings(max_examples=examples(200), deadline=None)
@given(
    st.dictionaries(st.text(min_size=1, max_size=12), st.integers(1, 16), min_size=1, max_size=3),
    st.one_of(st.integers(0, 64), st.sampled_from(["global", "replicated-job"])),
)
def test_a_reservations_text_reads_back_as_itself(kinds: dict[str, int], tasks: int | str) -> None:
    r = request.Reserved(kinds, tasks)
    assert request.Reserved.parse(r.text()) == r


def test_under_on_a_stack_needs_the_agents_grant_for_its_reservation() -> None:
    g = Grants()
    refused = decide(sent(STACK), ON, g=g)
    assert refused.msg == (
        "gpupin: only the agent's stacks may reserve GPUs on this swarm (--generic-resource GPU=1): " + judge.STACK_HINT
    )
    value = g.issue_service("trainer", TRAINER.text(), 1001)
    ok = decide(sent(STACK, value), ON, g=g)
    assert ok.allow and ok.uid == 1001
    # `docker stack deploy` again sends the same spec as an update: the same grant admits it, and a scale down.
    assert decide(sent(REDEPLOY, value), ON, g=g).allow and decide(sent(SCALE, value), ON, g=g).allow
    # `docker service create` of a service by that name: the key is the name
    svc = g.issue_service("svc", request.Reserved({"GPU": 2}, 1).text(), 1002)
    assert decide(sent(SERVICE, svc), ON, g=g).uid == 1002 and decide(sent(SERVICE_UPDATE, svc), ON, g=g).allow
    glob = g.issue_service("glob", request.Reserved({"GPU": 1}, "global").text(), 1003)
    assert decide(sent(GLOBAL, glob, Name="glob"), ON, g=g).allow


def test_a_service_grant_admits_no_more_than_it_was_for() -> None:
    g = Grants()
    two = g.issue_service("trainer", request.Reserved({"GPU": 1}, 2).text(), 1001)
    v = decide(sent(STACK, two), ON, g=g)
    assert v.msg == (
        "gpupin: service ml_trainer asks for 4 task(s) x 1 GPU, its grant is for 2 task(s) x 1 GPU: refused; "
        + judge.STACK_HINT
    )
    per_task = {
        "Resources": {"Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "GPU", "Value": 2}}]}}
    }
    v = decide(sent(STACK, g.issue_service("trainer", TRAINER.text(), 1001), TaskTemplate=per_task), ON, g=g)
    assert "asks for 4 task(s) x 2 GPU, its grant is for 4 task(s) x 1 GPU" in v.msg
    # a replicated grant admits no global service (a task on every node)
    v = decide(sent(GLOBAL, g.issue_service("glob", request.Reserved({"GPU": 1}, 4).text(), 1), Name="glob"), ON, g=g)
    assert "asks for global tasks x 1 GPU, its grant is for 4 task(s) x 1 GPU" in v.msg


def test_a_forged_copied_or_stale_service_grant_is_refused() -> None:
    g = Grants()
    value = g.issue_service("trainer", TRAINER.text(), 1001)
    fmt, nonce, expiry, uid, reserved, mac = value.split(".")
    cases = {
        "more tasks written in": ".".join((fmt, nonce, expiry, uid, "8*GPU=1", mac)),
        "another uid": ".".join((fmt, nonce, expiry, "0", reserved, mac)),
        "a later expiry": ".".join((fmt, nonce, str(int(expiry) + 3600), uid, reserved, mac)),
        "another agent's": Grants().issue_service("trainer", TRAINER.text(), 1001),
        "another service's": g.issue_service("evaluator", TRAINER.text(), 1001),
    }
    for why, forged in cases.items():
        v = decide(sent(STACK, forged), ON, g=g)
        assert "was not signed by this agent for a service trainer" in v.msg, why
    assert "not a service grant" in decide(sent(STACK, g.issue("ml_trainer", [], 1001)), ON, g=g).msg
    assert "not a service grant" in decide(sent(STACK, "let me in"), ON, g=g).msg
    # a container's grant is not a service's, nor the other way round
    assert "not a grant of this agent's" in decide(msg(create(gpus([RTX]), {LABEL: value})), ON, g=g).msg
    # Alice's grant, read off her service (docker service inspect), on Bob's stack of the same file: refused.
    assert decide(sent(STACK, value), ON, g=g).allow
    bob = sent(STACK, value, Name="bob_trainer", Labels={"com.docker.stack.namespace": "bob", LABEL: value})
    v = decide(bob, ON, g=g)
    assert "its grant admitted service ml_trainer already (a service grant admits one service)" in v.msg
    stale = Grants(ttl=-1)
    with pytest.raises(GrantRefused, match="expired"):
        stale.open_service(stale.issue_service("trainer", TRAINER.text(), 7), "trainer")


def test_a_services_own_device_variables_and_escapes_are_refused() -> None:
    """Each node's daemon creates a service's tasks without asking its plugin: what the spec gives each task is
    judged at the manager, the escape baseline and the variables that make a node's runtime pick cards."""

    def task(reserve: bool = False, **container: Any) -> dict[str, Any]:
        """The stack's task template, reserving no card unless `reserve`, with `container` in its ContainerSpec."""
        body: dict[str, Any] = json.loads(json.dumps(SENT[STACK]["body"]["TaskTemplate"]))
        body["ContainerSpec"].update(container)
        if not reserve:
            body["Resources"] = {}
        return body

    every = task(Env=["NVIDIA_VISIBLE_DEVICES=all"])
    for rule in (ON, NO_GRANTS):
        v = decide(sent(STACK, TaskTemplate=every), rule)
        assert not v.allow and v.msg.startswith(
            "gpupin: -e NVIDIA_VISIBLE_DEVICES=all: a service's own device variable picks cards on its nodes past "
            "Swarm's reservation: refused"
        ), v.msg
    assert decide(sent(STACK, TaskTemplate=every), WARN).msg.startswith("WARN gpupin: -e NVIDIA_VISIBLE_DEVICES=all")
    assert decide(sent(STACK, TaskTemplate=task(Env=["NVIDIA_VISIBLE_DEVICES=void"])), ON).allow
    # beside a granted reservation too: the variable picks cards the reservation does not
    g = Grants()
    granted = g.issue_service("trainer", TRAINER.text(), 1001)
    by_hand = task(True, Env=["DOCKER_RESOURCE_GPU=GPU-0"])
    assert (
        "-e DOCKER_RESOURCE_GPU=GPU-0: a service's own"
        in decide(sent(STACK, granted, TaskTemplate=by_hand), ON, g=g).msg
    )
    assert decide(sent(STACK, granted), ON, g=g).allow
    # the escape baseline: a task that binds the host's root or its docker socket, or adds SYS_ADMIN
    root = task(Mounts=[{"Type": "bind", "Source": "/", "Target": "/host"}])
    assert "a bind mount of /: refused on this host" in decide(sent(STACK, TaskTemplate=root), ON).msg
    caps = task(CapabilityAdd=["CAP_SYS_ADMIN"])
    assert "--cap-add SYS_ADMIN: refused on this host" in decide(sent(STACK, TaskTemplate=caps), ON).msg
    assert decide(sent(STACK, TaskTemplate=caps), EnforceRule(mode="on", allow=("capabilities",))).allow
    v = decide(sent(STACK, TaskTemplate=task(Env="NVIDIA_VISIBLE_DEVICES=all")), ON)
    assert not v.allow and "ContainerSpec.Env is not a list of strings" in v.msg


def test_a_service_under_warn_and_without_grants() -> None:
    # grants = false: a reservation is a task's pin (Swarm never gives a reserved card to two tasks), as a create
    # that pins free cards is allowed
    assert decide(sent(STACK), NO_GRANTS) == judge.ALLOW
    v = decide(sent(STACK), WARN)
    assert v.allow and v.msg.startswith("WARN gpupin: only the agent's stacks may reserve GPUs")
    assert decide(sent(STACK), EnforceRule()).allow and not decide(sent(STACK), EnforceRule()).msg


def test_render_swarm_writes_a_grant_the_agents_judge_admits(tmp_path: Path) -> None:
    """`hostagent compose render --swarm` through an agent whose policy enforces: each GPU service's deploy.labels
    (the service's own labels) gets a grant for its key and its reservation; the agent admits the service `docker
    stack deploy` then sends, and its redeploy, and refuses it on another reservation."""
    import yaml

    from tests.support.host import HOSTAGENT, simhost_env
    from tests.support.resident import Resident

    policy = tmp_path / "policy.toml"
    policy.write_text('[enforce]\nmode = "on"\n')
    env = simhost_env(DOCKER_HOST="unix:///nonexistent/docker.sock", GPUPIN_POLICY=str(policy))
    agent = Resident(env)
    try:
        stack = tmp_path / "stack.yml"
        source = Path(__file__).parent.parent.parent / "compose" / "swarm-replicas.yml"
        r = subprocess_run(
            [HOSTAGENT, "compose", "render", "--swarm", str(source), "-o", str(stack)],
            {**env, "GPUPIN_AGENT_SOCKET": agent.socket},
        )
        assert r.returncode == 0 and "`docker stack deploy` within 15 minutes" in r.stderr, r.stderr
        value = yaml.safe_load(stack.read_text())["services"]["trainer"]["deploy"]["labels"][LABEL]
        assert value.startswith("s1.") and value.split(".")[3] == str(os.getuid()) and "4*GPU=1" in value
        assert stack.stat().st_mode & 0o077 == 0  # a grant admits whoever presents it: the file is its user's alone
        # deploy.labels written as a list keeps its form (and the file is private all the same)
        listed = tmp_path / "listed.yml"
        listed.write_text(
            "services:\n  train:\n    image: img\n    deploy: {replicas: 2, labels: [team=a], mode: replicated}\n"
            "    x-gpupin: {count: 2}\n"
        )
        r = subprocess_run(
            [HOSTAGENT, "compose", "render", "--swarm", str(listed), "-o", str(tmp_path / "listed.stack.yml")],
            {**env, "GPUPIN_AGENT_SOCKET": agent.socket},
        )
        assert r.returncode == 0, r.stderr
        labels = yaml.safe_load((tmp_path / "listed.stack.yml").read_text())["services"]["train"]["deploy"]["labels"]
        assert labels[0] == "team=a" and labels[1].startswith(f"{LABEL}=s1.") and ".2*GPU=2." in labels[1]
        assert (tmp_path / "listed.stack.yml").stat().st_mode & 0o077 == 0
        # a global service's grant is for a task on every node it may run on
        (tmp_path / "global.yml").write_text(
            "services:\n  probe:\n    image: img\n    deploy: {mode: global}\n    x-gpupin: {count: 1}\n"
        )
        r = subprocess_run(
            [HOSTAGENT, "compose", "render", "--swarm", str(tmp_path / "global.yml")],
            {**env, "GPUPIN_AGENT_SOCKET": agent.socket},
        )
        assert r.returncode == 0 and ".global*GPU=1." in r.stdout, r.stderr

        def verdict(what: str, **spec: Any) -> dict[str, Any]:
            m = sent(what, value, **spec)
            answer = http1_post(agent.socket, "/api/authz", {"request": m})
            return dict(answer)

        assert verdict(STACK) == {"Allow": True, "Msg": ""}
        assert verdict(REDEPLOY) == {"Allow": True, "Msg": ""}
        more = verdict(STACK, Mode={"Replicated": {"Replicas": 8}})
        assert not more["Allow"] and "asks for 8 task(s) x 1 GPU, its grant is for 4 task(s) x 1 GPU" in more["Msg"]
        # The agent gives service grants for GPU kinds and whole counts only, one line and 64 otherwise.
        for bad in (
            {"service": "t", "kinds": {"fpga": 1}, "tasks": 1},
            {"service": "t", "kinds": {"GPU": 0}, "tasks": 1},
            {"service": "t", "kinds": {"GPU": 1}, "tasks": -1},
            {"service": "", "kinds": {"GPU": 1}, "tasks": "global"},
        ):
            status, answer = _post(agent.socket, "/api/grant", {"services": [bad]})
            assert status != 200 and answer["exit"] == 64 and "`services` must be 1 to 64" in answer["error"], bad
        # Without the agent, render writes no grant (and says nothing of one)
        r = subprocess_run([HOSTAGENT, "compose", "render", "--swarm", str(source)], {**env, "GPUPIN_AGENT": "0"})
        assert r.returncode == 0 and LABEL not in r.stdout and "grants" not in r.stderr, r.stderr
    finally:
        agent.close()


def subprocess_run(argv: list[str], env: dict[str, str]) -> Any:
    import subprocess

    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def http1_post(path: str, call: str, body: Any) -> Any:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    try:
        answer = http1.exchange(sock, "POST", call, body, host="localhost")
        assert answer.status == 200, answer.json()
        return answer.json()
    finally:
        sock.close()


# --- the table's `named` -----------------------------------------------------------------------------------------


def test_the_holding_forms_say_whether_cards_were_named() -> None:
    def read(body: dict[str, Any]) -> dict[str, Any]:
        return request.container(request.read(msg(body)).body)

    named = {g.how: g.named for g in grants(read(create(gpus(count=2))), host())}
    assert named == {"--gpus 2": False}
    assert all(g.named for g in grants(read(create(gpus([RTX, "2"]))), host()))


# --- the policy -------------------------------------------------------------------------------------------------


def test_the_enforce_table_is_read_and_its_mistakes_named() -> None:
    p = parse_policy('[enforce]\nmode = "on"\ngrants = false\nallow = ["privileged"]\n')
    assert (p.enforce.mode, p.enforce.grants, p.enforce.allow) == ("on", False, ("privileged",))
    assert "enforce on (no grants)" in p.summary()
    assert parse_policy("").enforce == EnforceRule()
    with pytest.raises(PolicyError) as err:
        parse_policy('[enforce]\nmode = "strict"\nallow = ["root"]\ncolour = 1\n')
    text = "\n".join(err.value.mistakes)
    assert "enforce.mode" in text and "enforce.allow" in text and "colour" in text


# --- the plugin's own server --------------------------------------------------------------------------------------


def _post(path: str, call: str, body: Any) -> tuple[int, Any]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    answer = http1.exchange(sock, "POST", call, body, host="plugin")
    return answer.status, answer.json()


@pytest.fixture
def served(tmp_path: Path) -> Any:
    policy = tmp_path / "policy.toml"
    policy.write_text('[enforce]\nmode = "on"\n')
    sock = str(tmp_path / "plugins" / "gpupin.sock")
    ready = threading.Event()
    t = threading.Thread(
        target=lambda: plugin.serve(sock, str(tmp_path / "no-agent.sock"), str(policy), ready), daemon=True
    )
    t.start()
    assert ready.wait(20)
    yield sock, policy


def test_the_plugin_activates_judges_alone_and_refuses_cards_while_the_agent_is_away(served: Any) -> None:
    sock, policy = served
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
    assert _post(sock, "/Plugin.Activate", {}) == (200, {"Implements": ["authz"]})
    t0 = time.monotonic()
    status, v = _post(sock, "/AuthZPlugin.AuthZReq", msg(create()))
    assert (status, v) == (200, {"Allow": True})
    assert time.monotonic() - t0 < 5
    status, v = _post(sock, "/AuthZPlugin.AuthZReq", msg(create(gpus([RTX]))))
    assert status == 200 and v["Allow"] is False
    assert "the agent does not answer" in v["Msg"] and "other containers are not affected" in v["Msg"]
    assert _post(sock, "/AuthZPlugin.AuthZRes", msg(create())) == (200, {"Allow": True})
    # a granted create's answer is told to the agent; with the agent away it is still let through, at once
    made = {**msg(create(gpus([RTX]), {LABEL: Grants().issue("job", [RTX], 7)})), "ResponseStatusCode": 201,
            "ResponseBody": base64.b64encode(json.dumps({"Id": "ab" * 32}).encode()).decode()}  # fmt: skip
    t0 = time.monotonic()
    assert _post(sock, "/AuthZPlugin.AuthZRes", made) == (200, {"Allow": True})
    assert _post(sock, "/AuthZPlugin.AuthZRes", {**made, "ResponseBody": "%%"}) == (200, {"Allow": True})
    assert time.monotonic() - t0 < 5
    # the policy is read again when it changes: off opens the door
    time.sleep(0.01)
    policy.write_text('[enforce]\nmode = "off"\n')
    assert _post(sock, "/AuthZPlugin.AuthZReq", msg(create(gpus([RTX]))))[1]["Allow"] is True
    # a broken policy keeps the last good table
    policy.write_text('[enforce]\nmode = "strict"\n')
    assert _post(sock, "/AuthZPlugin.AuthZReq", msg(create(gpus([RTX]))))[1]["Allow"] is True
    # bad messages get an error, never a hang
    assert _post(sock, "/AuthZPlugin.AuthZReq", [1, 2])[0] == 400


def raw(text: str) -> dict[str, Any]:
    """An AuthZReq whose create body is this JSON text, as sent (repeated keys and all)."""
    return {
        "RequestMethod": "POST",
        "RequestUri": "/v1.41/containers/create",
        "RequestBody": base64.b64encode(text.encode()).decode(),
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # The daemon's decoder matches keys ignoring case (the long s and the Kelvin sign fold too) ...
        ('{"hostconfig": {"devicerequests": [{"count": -1, "capabilities": [["gpu"]]}]}}', "pins no card"),
        ('{"HostConfig": {"DeviceReque\u017fts": [{"Count": 2, "Capabilities": [["gpu"]]}]}}', "pins no card"),
        ('{"HOSTCONFIG": {"PRIVILEGED": true}}', "--privileged"),
        # ... and decodes a repeated key again into the same struct: the first value's fields stay.
        ('{"HostConfig": {"Privileged": true}, "HostConfig": {"Memory": 1}}', "--privileged"),
        ('{"HostConfig": {"Privileged": true}, "hostConfig": {"Privileged": null}}', "--privileged"),
        ('{"HostConfig": {"Binds": ["/:/h"]}, "HostConfig": {"CpuShares": 2}}', "a bind mount of /"),
    ],
)
def test_a_body_the_daemon_reads_otherwise_than_python_cannot_slip_past(text: str, said: str) -> None:
    v = decide(raw(text), NO_GRANTS)
    assert not v.allow and said in v.msg


def test_a_body_of_the_wrong_types_is_refused_as_the_daemon_would() -> None:
    for text in (
        '{"HostConfig": {"DeviceRequests": 1}}',
        '{"HostConfig": {"DeviceRequests": [{"Count": "all"}]}}',
        '{"HostConfig": {"Privileged": "yes"}}',
        '{"Env": "NVIDIA_VISIBLE_DEVICES=all"}',
        '{"HostConfig": []}',
    ):
        v = decide(raw(text), ON)
        assert not v.allow and "the daemon would not read it either" in v.msg, text


def test_a_grant_for_any_name_admits_whatever_name_compose_gives_once() -> None:
    g = Grants()
    value = g.issue(ANY_NAME, [RTX], 1001, ttl=900)
    assert g.admit(value, "proj-train-1", [RTX]) == (
        1001,
        True,
    )  # a rendered file's: its quotas are judged at the create
    with pytest.raises(GrantRefused, match="used already"):
        g.admit(value, "proj_train_1", [RTX])
    with pytest.raises(GrantRefused, match="not signed"):
        g.admit(g.issue(ANY_NAME, [RTX], 1001), "x", [A800B])  # still bound to its cards


def test_a_rendered_files_grant_is_judged_against_its_users_quotas_at_the_create() -> None:
    """A run's grant was given under its quotas (the ledger lock); a rendered compose file's is for any name and
    may be used long after: the agent's quotas judge its create, and name the uid it was granted to."""
    g = Grants()
    asked: list[tuple[int, int]] = []

    def over(uid: int, cards: int, labels: Any) -> str | None:
        assert LABEL in labels  # the create's labels: the booking render wrote is judged too
        asked.append((uid, cards))
        return "quota cards: uid 1001 holds 1 of 1 card(s) at once, and asks 1 more"

    v = decide(msg(create(gpus([RTX]), {LABEL: g.issue(ANY_NAME, [RTX], 1001, ttl=900)})), ON, g=g, over=over)
    assert not v.allow and v.msg == "gpupin: quota cards: uid 1001 holds 1 of 1 card(s) at once, and asks 1 more"
    assert asked == [(1001, 1)] and v.uid == 1001
    ran = decide(msg(create(gpus([RTX]), {LABEL: g.issue("job", [RTX], 1001)})), ON, g=g, over=over)
    assert ran.allow and ran.uid == 1001 and asked == [(1001, 1)]  # a run's: not judged again
    warn = decide(msg(create(gpus([RTX]), {LABEL: g.issue(ANY_NAME, [RTX], 1001)})), EnforceRule(mode="warn"), g=g,
                  over=over)  # fmt: skip
    assert warn.allow and warn.msg.startswith(judge.WARN + "gpupin: quota cards") and warn.uid == 1001


def test_the_created_containers_id_is_read_from_the_daemons_answer_alone() -> None:
    cid = "ab" * 32

    def answer(status: Any, body: Any) -> dict[str, Any]:
        raw = body if isinstance(body, str) else base64.b64encode(json.dumps(body).encode()).decode()
        return {"ResponseStatusCode": status, "ResponseBody": raw}

    assert request.created_id(answer(201, {"Id": cid, "Warnings": []})) == cid
    for bad in (
        answer(409, {"message": "Conflict"}),
        answer(201, {"Id": "../../etc"}),
        answer(201, {"Id": cid.upper()}),
        answer(201, ["Id", cid]),
        answer(201, "not base64!"),
        answer("201", {"Id": cid}),
        {"ResponseStatusCode": 201},
    ):
        assert request.created_id(bad) is None, bad

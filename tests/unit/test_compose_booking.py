"""A compose or swarm service's booking, `x-gpupin: {for: DURATION}` (docs/policy.md, "Compose and Swarm"): render
writes it as the label gpupin.booking.for, judged by run's rule for everyone's table; the ledger books a container
from its own start by that label, the agent cuts it to the policy's maximum, and the agent of a manager ends a
swarm service from its creation. The agent in a real daemon: tests/docker/test_policy_agent.py; on a swarm:
tests/cluster/test_swarm.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.core.errors import UsageError
from gpupin.hostagent.compose import load
from gpupin.hostagent.compose.booking import problems
from gpupin.hostagent.ledger import booking
from gpupin.hostagent.ls.listing import booking_shown
from gpupin.hostagent.ls.model import Listing
from gpupin.hostagent.policy import Policy, parse_policy
from gpupin.hostagent.serve import queue, services
from tests.support.host import hostagent

NOWHERE = "unix:///nonexistent/docker.sock"


def policy(text: str) -> Policy:
    return parse_policy(text, "policy.toml")


LAB = policy('[booking]\ndefault = "1h"\nmax = "4h"\n[booking.user.root]\nmax = "7d"\n')


def compose(x: str, labels: str = "", ask: str = "gpus: ['1']") -> str:
    """A service on card 1 (a count for a swarm: Swarm places it), with `x` more in its x-gpupin."""
    return f"services:\n  train:\n    image: img\n    x-gpupin: {{{ask}{x}}}\n" + (
        f"    labels: {labels}\n" if labels else ""
    )


def render(tmp_path: Path, text: str, *args: str, policy: str = "/nonexistent/policy.toml") -> tuple[Any, Path]:
    src, out = tmp_path / "train.yml", tmp_path / "out.yml"
    src.write_text(text)
    r = hostagent("compose", "render", *args, str(src), "-o", str(out), DOCKER_HOST=NOWHERE, GPUPIN_POLICY=policy)
    return r, out


def test_render_writes_the_length_as_a_label_for_compose_and_for_swarm(tmp_path: Path) -> None:
    r, out = render(tmp_path, compose(", for: 90m"))
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(out.read_text())["services"]["train"]
    assert "x-gpupin" not in svc and svc["labels"]["gpupin.booking.for"] == "90m"
    # the rendered file renders to itself: the label is read back as the same booking
    again, twice = render(tmp_path, out.read_text())
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(twice.read_text())["services"]["train"]["labels"]["gpupin.booking.for"] == "90m"
    # the list spelling of labels is kept; swarm: the tasks' container labels (`labels:`, not deploy.labels)
    r, out = render(tmp_path, compose(", for: 2h", "[team=ml]", "count: 1"), "--swarm")
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(out.read_text())["services"]["train"]
    assert svc["labels"] == ["team=ml", "gpupin.booking.for=2h"] and "x-gpupin" not in svc


@pytest.mark.parametrize(
    ("x", "labels", "says"),
    [
        (", for: 90", "", "x-gpupin.for: a duration is text such as 90m, 4h or 2d, not int"),
        (", for: '4 hours'", "", "x-gpupin.for: '4 hours' is not a duration"),
        (", for: 0s", "", "is no time at all"),
        (", for: 2h", "{gpupin.booking.for: 3h}", "x-gpupin.for is '2h' but the label gpupin.booking.for says '3h'"),
        ("", "{gpupin.booking.for: soon}", "the label gpupin.booking.for: 'soon' is not a duration"),
        ("", "['gpupin.booking=uid=0 since=0 until=9999999999']", "sets the label gpupin.booking by hand"),
    ],
)
def test_a_bad_booking_is_one_line_64_and_nothing_written(tmp_path: Path, x: str, labels: str, says: str) -> None:
    for swarm, ask in (((), "gpus: ['1']"), (("--swarm",), "count: 1")):
        r, out = render(tmp_path, compose(x, labels, ask), *swarm)
        assert r.returncode == 64, r.stderr
        errors = [ln for ln in r.stderr.splitlines() if "ERROR" in ln]
        assert len(errors) == 1 and says in errors[0] and " HINT: " in errors[0], r.stderr
        assert "Traceback" not in r.stderr and not out.exists()


def test_past_the_policys_maximum_is_refused_for_everyone(tmp_path: Path) -> None:
    """The agent cannot know who starts the file: everyone's maximum applies, even to a user the policy gives more
    (root here, whose own table says 7d)."""
    f = tmp_path / "policy.toml"
    f.write_text('[booking]\nmax = "4h"\n[booking.user.root]\nmax = "7d"\n')
    r, out = render(tmp_path, compose(", for: 5h"), policy=str(f))
    assert r.returncode == 64 and not out.exists()
    assert [ln for ln in r.stderr.splitlines() if "ERROR" in ln] == [
        f"hostagent: ERROR: {tmp_path}/train.yml: service train: x-gpupin.for 5h is longer than the longest booking "
        "the policy gives everyone (a service's own label names no one), 4h (booking.max). HINT: ask for at most "
        "x-gpupin.for 4h"
    ]
    ok, _ = render(tmp_path, compose(", for: 4h"), policy=str(f))
    assert ok.returncode == 0, ok.stderr
    check = hostagent("compose", "check", str(tmp_path / "train.yml"), DOCKER_HOST=NOWHERE, GPUPIN_POLICY=str(f))
    assert check.returncode == 0, check.stdout
    (tmp_path / "train.yml").write_text(compose(", for: 5h"))
    check = hostagent("compose", "check", str(tmp_path / "train.yml"), DOCKER_HOST=NOWHERE, GPUPIN_POLICY=str(f))
    assert check.returncode == 64 and "x-gpupin.for 5h is longer" in check.stdout


def test_the_same_rule_judges_a_run_and_a_label() -> None:
    assert problems(load.parse(compose(", for: 4h")), LAB) == []
    (p,) = problems(load.parse(compose(", for: 5h")), LAB)
    with pytest.raises(UsageError) as run:
        booking.length(LAB, booking.NO_ONE, 5 * 3600, "x-gpupin.for")
    assert p.problem == run.value.message
    # a running container's label cannot be refused: cut to the maximum; no duration: the default (else the max)
    assert booking.label_length(LAB, 5 * 3600.0) == 4 * 3600
    assert booking.label_length(LAB, 600.0) == 600
    assert booking.label_length(LAB, None) == 3600
    assert booking.label_length(policy('[booking]\nmax = "4h"\n'), None) == 4 * 3600  # no default: the maximum
    assert booking.label_length(Policy.empty(), None) is None


def test_the_ledger_books_a_container_from_its_own_start() -> None:
    labels = {booking.FOR_LABEL: "90m"}
    b = booking.of(labels, 1000.4)
    assert b is not None and (b.uid, b.since, b.until) == (None, 1000, 1000 + 5400)
    assert booking_shown(b, now=2000).left_s == 4400
    assert booking.of(labels) is None  # not started: no start to count from
    odd = booking.of({booking.FOR_LABEL: "soon"}, 1000)
    assert odd is not None and odd.until is None  # the agent gives it the default (label_length)
    # a swarm task's booking is its service's, kept on a manager: none here
    assert booking.of({**labels, booking.SWARM_SERVICE_LABEL: "x"}, 1000) is None
    # hostagent's own label wins, and its uid is the only one a booking names
    made = booking.of({booking.LABEL: "uid=1001 since=5 until=9", booking.FOR_LABEL: "7d"}, 1000)
    assert made is not None and (made.uid, made.since, made.until) == (1001, 5, 9)
    # a label's booking is no one's: it counts for no quota
    view = Listing.from_json({"gpus": [{"holders": [{"id": "a", "name": "c", "holds": True}]}]})
    view.gpus[0].holders[0].booking = booking_shown(b, now=2000)
    assert queue.view_holdings(view) == []


def test_a_swarm_services_end_counts_from_its_creation() -> None:
    service: dict[str, Any] = {
        "ID": "svc1",
        "CreatedAt": "2026-12-02T10:00:00.123456789Z",
        "Spec": {"TaskTemplate": {"ContainerSpec": {"Labels": {booking.FOR_LABEL: "8h"}}}},
    }
    created = services.created(service)
    assert services.end_of(service, LAB) == created + 4 * 3600  # cut to the maximum
    assert services.end_of(service, Policy.empty()) == created + 8 * 3600
    service["Spec"]["TaskTemplate"]["ContainerSpec"]["Labels"] = {}
    assert services.end_of(service, LAB) is None

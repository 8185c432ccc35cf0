"""Property-based tests of `hostagent compose` over generated compose documents and raw bytes.

For every input: never a traceback, always a documented exit code, one line per problem; `render` refuses on
exactly the errors `check` reports that the rendered file would still have, with the same lines; a rendered file
checks clean and renders to itself, and the text render writes (the source edited in place, or a merged file)
reads back as the rendered document; and a refused render writes nothing (the `-o` target and its directory stay
as they were).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupin.hostagent.compose import load, roundtrip
from gpupin.hostagent.compose.problems import RenderRefused, ServiceError
from gpupin.hostagent.compose.render import render
from gpupin.hostagent.compose.rules import examine
from gpupin.hostagent.ledger.holders import Holder, held
from tests.support.host import simhost_env
from tests.support.hypo import examples
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import mig_devices

MIXED4 = scenario_cards("mixed-4")
MIG = scenario_cards("mig")
UUIDS = [c.uuid for c in MIXED4 if c.uuid]
BUS = {c.uuid: str(c.bus_id) for c in MIXED4}

# --- documents ----------------------------------------------------------------------------------------------------


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], percent_bad: int = 15) -> st.SearchStrategy[Any]:
    """`good`, and now and then (percent_bad in 100) `bad`."""
    return st.integers(0, 99).flatmap(lambda n: bad if n >= 100 - percent_bad else good)  # 0 is drawn most


junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 9)
    | st.floats(allow_nan=False, width=16)
    | st.text("ab:,=\t\n-x", max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("abx-", max_size=3), inner, max_size=3),
    max_leaves=6,
)
good_spec = st.sampled_from(
    [
        *UUIDS,
        "GPU-95c6",
        "GPU-e218",
        "0",
        "1",
        "3",
        "3b:00.0",
        "0000:86:00.0",
        "00000000:AF:00.0",
        mig_devices("mig")[0],
        "0:1",
    ]
) | st.integers(0, 3)
bad_spec = st.sampled_from(["GPU-6c", "7", "cuda:0", "GPU-zz", "", " 1 ", "all", "none"]) | st.integers(-1, 5) | junk
spec = mostly(good_spec, bad_spec)
specs = mostly(st.lists(spec, min_size=1, max_size=3), spec | st.just("1,3") | st.lists(spec, max_size=0) | junk, 25)
count = mostly(st.integers(1, 3), st.integers(-2, 6) | st.sampled_from(["all", "2"]) | junk, 25)
expect_value = st.lists(st.sampled_from(UUIDS), min_size=1, max_size=2, unique=True).map(
    lambda us: ",".join(f"{u}@{BUS[u]}" for u in us)
) | st.sampled_from(["GPU-6c", "cuda:0", "", UUIDS[1]])
owned = st.sampled_from(["GPUPIN_EXPECT", "NVIDIA_VISIBLE_DEVICES", "GPUPIN_VERIFY", "RUN", "RUN", "RUN"])
env_value = expect_value | spec.map(str) | st.sampled_from(["nvml", "cuda", "all", "void"])
environment = mostly(
    st.dictionaries(owned, env_value | st.none(), max_size=2)
    | st.lists(st.tuples(owned, env_value).map("=".join), max_size=2),
    junk,
)
label_key = st.sampled_from(["gpupin.devices", "gpupin.shared", "team", "team"])
labels = mostly(
    st.dictionaries(label_key, st.sampled_from(["true", "x", *UUIDS, ",".join(UUIDS[:2])]), max_size=2)
    | st.lists(st.tuples(label_key, st.sampled_from(["true", UUIDS[0]])).map("=".join), max_size=2),
    junk,
)


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


share = mostly(st.booleans(), junk)
verify = st.sampled_from(["nvml", "cuda", "torch", "full"])
x_gpupin = mostly(
    st.fixed_dictionaries({"gpus": specs}, optional={"share": share, "verify": verify})
    | st.fixed_dictionaries({"count": count}, optional={"share": share, "verify": verify}),
    optional(gpus=specs, count=count, share=share, verify=verify, other=junk) | junk,
)
device = mostly(
    st.fixed_dictionaries({"driver": st.just("nvidia")}, optional={"device_ids": specs, "count": count})
    | st.fixed_dictionaries(
        {"capabilities": st.sampled_from([["gpu"], ["gpu", "utility"]])},
        optional={"device_ids": specs, "count": count, "options": st.just({"a": "b"})},
    ),
    optional(
        driver=st.sampled_from(["nvidia", "other"]) | junk,
        device_ids=specs,
        count=count,
        capabilities=st.sampled_from([["fpga"]]) | junk,
    ),
    25,
)
deploy = mostly(
    st.fixed_dictionaries(
        {
            "resources": st.fixed_dictionaries(
                {
                    "reservations": st.fixed_dictionaries(
                        {"devices": mostly(st.lists(device, min_size=1, max_size=2), junk)}
                    )
                }
            )
        },
        optional={"replicas": mostly(st.integers(0, 1), st.integers(2, 3) | junk)},
    ),
    junk,
    10,
)
gpu_form = st.one_of(
    st.fixed_dictionaries({"x-gpupin": x_gpupin}),
    st.fixed_dictionaries({"deploy": deploy}),
    st.fixed_dictionaries(
        {
            "runtime": st.just("nvidia"),
            "environment": st.fixed_dictionaries({"NVIDIA_VISIBLE_DEVICES": spec.map(str) | st.just("all")}),
        }
    ),
    st.just({}),
)
rest = optional(
    environment=environment,
    labels=labels,
    scale=mostly(st.just(1), junk),
    runtime=st.sampled_from(["nvidia", "runc"]),
    **{"x-gpupin": x_gpupin, "deploy": deploy},
)
svc = mostly(st.builds(lambda f, r: {"image": "img", **r, **f}, gpu_form, rest), junk, 10)
name = mostly(
    st.sampled_from(["a", "b", "c", "svc-1", "123"]), st.sampled_from(["a b", "x\ny"]) | st.integers(0, 9), 10
)
services = st.dictionaries(name, svc, min_size=1, max_size=4)
document = mostly(
    optional(version=st.just("3.8"), name=st.just("proj")).flatmap(
        lambda top: st.builds(lambda s: {**top, "services": s}, services)
    ),
    junk | st.just({"services": {}}),
    10,
)


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """A compose document; sometimes two services share one object, which the YAML dump writes as an anchor
    and its aliases."""
    doc = draw(document)
    svcs = doc.get("services") if isinstance(doc, dict) else None
    if isinstance(svcs, dict) and len(svcs) > 1 and draw(st.booleans()):
        src, dst = draw(st.permutations(list(svcs)))[:2]
        shareable = [
            k for k in ("environment", "labels", "x-gpupin", "deploy") if isinstance(svcs[src], dict) and k in svcs[src]
        ]
        if shareable and isinstance(svcs[dst], dict):
            key = draw(st.sampled_from(shareable))
            svcs[dst][key] = svcs[src][key]
    return doc


# Files that mostly render: the forms written right, a little of everything else, so that multi-service renders,
# shared anchors and re-renders are exercised often, not only refusals.
plain_env = st.dictionaries(st.sampled_from(["RUN", "LR"]), st.sampled_from(["1", "x"]), max_size=2)
plausible_svc = st.builds(
    lambda form, env, as_list, labels, share: {
        "image": "img",
        **form,
        **({"environment": [f"{k}={v}" for k, v in env.items()] if as_list else env} if env else {}),
        **(
            {"labels": {"team": "ml", **({"gpupin.shared": "true"} if share and "x-gpupin" not in form else {})}}
            if labels
            else {}
        ),
    },
    st.one_of(
        st.builds(
            lambda n, v, sh: {
                "x-gpupin": {"count": n, **({"verify": v} if v else {}), **({"share": True} if sh else {})}
            },
            st.integers(1, 2),
            st.none() | verify.filter(lambda v: v != "full"),
            st.booleans(),
        ),
        st.builds(lambda g: {"x-gpupin": {"gpus": [g]}}, good_spec),
        st.builds(
            lambda n: {
                "deploy": {
                    "resources": {
                        "reservations": {"devices": [{"driver": "nvidia", "count": n, "capabilities": ["gpu"]}]}
                    }
                }
            },
            st.integers(1, 2),
        ),
        st.builds(
            lambda u: {
                "deploy": {
                    "resources": {
                        "reservations": {
                            "devices": [{"driver": "nvidia", "device_ids": [u], "capabilities": ["gpu", "utility"]}]
                        }
                    }
                }
            },
            st.sampled_from(UUIDS),
        ),
        st.builds(
            lambda i: {"runtime": "nvidia", "environment": {"NVIDIA_VISIBLE_DEVICES": str(i)}}, st.integers(0, 3)
        ),
        st.just({}),
    ),
    plain_env,
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


@st.composite
def plausible(draw: st.DrawFn) -> Any:
    svcs = draw(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "123"]), plausible_svc, min_size=1, max_size=4))
    if len(svcs) > 1 and draw(st.booleans()):  # one environment for two services: an anchor and an alias
        src, dst = draw(st.permutations(list(svcs)))[:2]
        if "environment" in svcs[src] and "runtime" not in svcs[src] and "runtime" not in svcs[dst]:
            svcs[dst]["environment"] = svcs[src]["environment"]
    return {"services": svcs}


busy = st.lists(st.tuples(st.sampled_from(UUIDS), st.booleans()), max_size=3).map(
    lambda hs: held(Holder(f"{i:064x}", f"job{i}", "running", [u], True, "gpupin", sh) for i, (u, sh) in enumerate(hs))
)


def text_of(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


# --- the pure core: check and render agree, and a rendered file is clean -----------------------------------------


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(documents(), plausible()), busy, st.sampled_from([MIXED4, MIXED4, MIG]))
def test_render_refuses_exactly_what_check_calls_an_error_the_render_would_keep(
    doc: Any, ledger: dict[str, list[Holder]], cards: list[Any]
) -> None:
    try:
        tree = load.parse(text_of(doc))
    except ServiceError as err:  # e.g. a document that is not a mapping once dumped
        assert err.exit_code == 64 and "\n" not in err.message
        return
    found = examine(tree, cards, ledger)
    assert all("\n" not in p.line("f.yml") for p in found.problems)
    try:
        rendered, _ = render(tree, cards, ledger)
    except RenderRefused as refused:
        assert [p.line("f") for p in refused.problems] == [p.line("f") for p in found.refusals]
        assert refused.exit_code in (64, 69, 75) and not found.ok
        return
    assert found.refusals == []
    again = examine(rendered, cards, ledger)
    assert again.ok and again.problems == [], again.problems
    assert render(rendered, cards, ledger)[0] == rendered  # idempotent: a rendered file renders to itself
    assert load.parse(load.dump(rendered)) == rendered  # a merged file reads back as rendered
    assert load.parse(roundtrip.edit(text_of(doc), tree, rendered)) == rendered  # and so does an edited one


# --- the loader over raw input ----------------------------------------------------------------------------------

yamlish = st.lists(
    st.sampled_from(
        [
            *"ab1:-[]{},&*!<>|'\"#\t\n ?%@`\\",
            "\ud800",
            "é",
            "\x00",
            "<<: ",
            "&a ",
            "*a",
            "!!set ",
            "---\n",
            "\n  ",
            ": ",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(yamlish.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=40)))
def test_any_bytes_load_as_a_tree_or_one_refusal(data: bytes) -> None:
    try:
        doc = load.parse(load.decode(data))
    except ServiceError as err:
        assert err.exit_code == 64 and err.service is None and err.hint
        return
    assert doc is not None
    load.dump(doc)  # whatever loads can be written back


@settings(max_examples=examples(200), deadline=None)
@given(
    documents(),
    st.integers(0, 40),
    st.lists(st.sampled_from([*"\t&*[]{}:-!'\"\n ", "<<: ", "\udcff"]), min_size=1, max_size=4).map("".join),
)
def test_damaged_documents_load_or_are_refused_never_a_traceback(doc: Any, at: int, insert: str) -> None:
    text = text_of(doc)
    at = min(at, len(text))
    damaged = (text[:at] + insert + text[at:]).encode("utf-8", "surrogateescape")
    try:
        tree = load.parse(load.decode(damaged))
    except ServiceError as err:
        assert err.exit_code == 64
        return
    found = examine(tree, MIXED4, {})
    try:
        render(tree, MIXED4, {})
    except RenderRefused:
        assert not found.ok


# --- the CLI: exit codes, one line per problem, nothing written on a refusal -------------------------------------

DRIVER = """
import contextlib, io, json, sys, traceback
from gpupin.hostagent import cli
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    except BaseException:
        rc = "raised: " + traceback.format_exc()
    results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
json.dump(results, sys.stdout)
"""


def run_batch(argvs: list[list[str]], cwd: Path) -> list[dict[str, Any]]:
    """Many hostagent invocations in one process on the simulated host (NVML through the fake library)."""
    r = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        env=simhost_env(DOCKER_HOST="unix:///nonexistent/docker.sock"),
        cwd=cwd,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    results: list[dict[str, Any]] = json.loads(r.stdout)
    return results


raw_files = st.sampled_from(
    [
        b"",
        b"services:\n\ta: {}\n",
        b"services: {a: {image: \xff}}\n",
        b"[" * 100,
        b"a: &a [1, *a]\n",
        b"services: {123: {image: i}}\n",
    ]
)


@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(documents().map(text_of).map(str.encode) | raw_files, min_size=1, max_size=8))
# Issue 23, trap 2, every run: a count with no daemon, which render refuses (the ledger is unread) and check passed.
@example(files=[b"services: {a: {image: i, x-gpupin: {count: 1}}}\n"])
def test_cli_never_tracebacks_and_a_refusal_writes_nothing(
    fakegpu: Path, tmp_path_factory: Any, files: list[bytes]
) -> None:
    tmp = tmp_path_factory.mktemp("cli")
    argvs: list[list[str]] = []
    for i, data in enumerate(files):
        (tmp / f"in{i}.yml").write_bytes(data)
        (tmp / f"out{i}.yml").write_bytes(b"before\n")
        argvs += [
            ["compose", "render", f"in{i}.yml", "-o", f"out{i}.yml"],
            ["compose", "check", f"in{i}.yml"],
            ["compose", "check", f"in{i}.yml", "--json"],
        ]
    results = run_batch(argvs, tmp)
    for i in range(len(files)):
        rendered, checked, as_json = results[3 * i : 3 * i + 3]
        for r in (rendered, checked, as_json):
            assert r["rc"] in (0, 64, 69, 75), r
            assert all(ln.startswith("hostagent: ") for ln in r["stderr"].splitlines()), r
        errors = [ln for ln in rendered["stderr"].splitlines() if ln.startswith("hostagent: ERROR: ")]
        out = (tmp / f"out{i}.yml").read_bytes()
        if rendered["rc"] == 0:
            assert not errors and out.startswith(b"# Rendered by"), rendered
            assert load.parse(out.decode()) is not None
        else:
            assert errors and out == b"before\n", rendered  # a refused render leaves the target as it was
            # and check reports it: 69 where the ledger could not be read (render's code for it), 64 where the file
            # has another mistake too
            assert checked["rc"] in ((64, 69) if rendered["rc"] == 69 else (64,)), (rendered, checked)
            assert all(ln.removeprefix("hostagent: ERROR: ") in checked["stdout"].splitlines() for ln in errors)
        # --json lists the same problems, one object each; the text ends in a summary when there is no error.
        lines = checked["stdout"].splitlines()
        assert checked["rc"] == as_json["rc"] and len(json.loads(as_json["stdout"])) == len(lines) - (
            checked["rc"] == 0
        ), (checked, as_json)
    names = {p.name for p in tmp.iterdir()}
    assert names == {f"{k}{i}.yml" for i in range(len(files)) for k in ("in", "out")}, names  # no temporary left

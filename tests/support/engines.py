"""The docker tier's engines, and which of them runs which test. A test marked `per_engine` runs on every engine: its
outcome depends on the engine (how the card reaches the container, the created container, compose's model, the
daemon's words). Every other one runs once, on one of the sharing engines chosen by its name, so that the engines'
runs side by side split them (docs/testing.md, The engines): a second engine running the agent's own logic again
costs CI minutes and finds nothing. Podman (where named) runs the `per_engine` tests only, and a test marked
`needs(CAPABILITY)` is skipped on a runtime that lacks it, with the reason tests/support/sandbox.py's LACKS gives.

Loaded as a plugin (`-p tests.support.engines`), it prints the split instead of running anything (one JSON line per
test: tests/unit/test_engines_split.py)."""

from __future__ import annotations

import json
import os
import zlib

import pytest

from tests.support.sandbox import ENGINES, PODMAN, engines_under_test, lacks


def sharing_engines() -> list[str]:
    """The engines that share the docker-tier tests the engine does not matter to (those not marked `per_engine`):
    each runs once, on one of them (engine_for). GPUPIN_TEST_SHARING_ENGINES names them where the make targets run
    one pytest per engine; else they are the engines under test (docs/testing.md, The engines)."""
    named = os.environ.get("GPUPIN_TEST_SHARING_ENGINES", "").replace(",", " ").split() or engines_under_test()
    return [e for e in ENGINES if e in named]  # Docker's engines: podman takes no shared test


# Each sharing engine's part of the shared tests, by weight: Engine 28.5 runs the same tests more slowly (its run
# took 3 minutes more than 20.10's with an even split, on the 2-core CI machine), so it takes fewer of them and the
# engines' runs side by side end closer together (docs/testing.md, The engines).
SHARE = {"20.10": 4, "26": 4, "28.5": 3}


def engine_for(name: str) -> str | None:
    """The sharing engine that runs the engine-independent test `name` (its node id without the engine): the same in
    every process, so that the engines' runs side by side split these tests between them, each exactly once. None
    where no Docker engine shares them (a run on podman alone)."""
    engines = sharing_engines()
    if not engines:
        return None
    slot = zlib.crc32(name.encode()) % sum(SHARE[e] for e in engines)
    for engine in engines:
        if slot < SHARE[engine]:
            return engine
        slot -= SHARE[engine]
    raise AssertionError("unreachable: the slots cover the sum of the shares")


ENGINE_FIXTURES = ("sandbox", "ep", "on_mig", "on_shared_prefix")  # the fixtures parametrized by engine


def engine_of(item: pytest.Item) -> str | None:
    """The engine a test is parametrized with, if it is."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return next((str(params[f]) for f in ENGINE_FIXTURES if f in params), None)


def engine_free_name(item: pytest.Item) -> str:
    """The test's node id without its engine: the same in every engine's run."""
    engine, callspec = engine_of(item), getattr(item, "callspec", None)
    if engine is None or callspec is None:
        return item.nodeid
    ids = [i for i in callspec.id.split("-") if i != engine]  # every engine fixture's id (ep and sandbox, say)
    return f"{item.nodeid.partition('[')[0]}[{'-'.join(ids)}]"


def on_every_engine(item: pytest.Item) -> bool:
    """Marked `per_engine` (itself or its module), and not an `agent_any` test: that fixture's tests are decided
    before the daemon is asked anything, the same whatever the engine."""
    return item.get_closest_marker("per_engine") is not None and "agent_any" not in getattr(item, "fixturenames", ())


def on_this_engine(item: pytest.Item) -> bool:
    """Whether this run keeps the test: not of the docker tier, on every engine, or on the engine that takes it (a
    test with no engine of its own runs in the run of the engine that takes it). A test marked `podman` (podman's
    own: tests/docker/test_podman*.py) runs in the run on podman, and only there."""
    if item.get_closest_marker("docker") is None:
        return True
    if item.get_closest_marker("podman") is not None:
        return PODMAN in engines_under_test()
    if on_every_engine(item):
        return True
    engine, chosen = engine_of(item), engine_for(engine_free_name(item))
    return engine == chosen if engine is not None else chosen in engines_under_test()


def skip_what_the_engine_lacks(item: pytest.Item) -> None:
    """A test marked `needs(CAPABILITY, ...)` on an engine that lacks one of them (a test with no engine of its own:
    on any engine of this run) is skipped, saying why (LACKS)."""
    engine = engine_of(item)
    for mark in item.iter_markers("needs"):
        for e in [engine] if engine is not None else engines_under_test():
            why = next((w for c in mark.args if (w := lacks(e, str(c))) is not None), None)
            if why is not None:
                item.add_marker(pytest.mark.skip(reason=f"{e}: {why}"))
                return


def pytest_collection_finish(session: pytest.Session) -> None:
    """As a plugin: each collected test, its engine-free name and whether it runs on every engine."""
    for item in session.items:
        print(json.dumps({"id": item.nodeid, "name": engine_free_name(item), "per_engine": on_every_engine(item)}))

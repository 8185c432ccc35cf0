"""The docker tier's split between engines (tests/support/engines.py): the engines' runs side by side, as the make
targets start them, take every docker-tier test exactly once, and each `per_engine` one on every engine."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

from tests.support.host import REPO
from tests.support.sandbox import ENGINES


def split(engine: str) -> list[dict[str, object]]:
    """What the run of `engine` side by side with the others would run (collected, not run)."""
    env = dict(os.environ, GPUPIN_TEST_ENGINES=engine, GPUPIN_TEST_SHARING_ENGINES=" ".join(ENGINES))
    collect = ("--collect-only", "-q", "-m", "docker", "-p", "tests.support.engines", "-p", "no:cacheprovider")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", *collect, "-p", "no:xdist", "tests/docker"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def test_side_by_side_runs_take_each_test_once_and_per_engine_ones_on_every_engine() -> None:
    runs = {engine: split(engine) for engine in ENGINES}
    runs_of = collections.Counter(t["name"] for tests in runs.values() for t in tests)
    per_engine = {t["name"] for tests in runs.values() for t in tests if t["per_engine"]}
    shared = set(runs_of) - per_engine
    assert shared and per_engine
    assert {n: c for n, c in runs_of.items() if n in shared and c != 1} == {}
    assert {n: c for n, c in runs_of.items() if n in per_engine and c != len(ENGINES)} == {}
    # The shared tests are split, not all left to one engine, and by the engines' shares: the slowest engine takes
    # the fewest (tests/support/engines.py, SHARE).
    shared_of = {engine: sum(not t["per_engine"] for t in tests) for engine, tests in runs.items()}
    assert all(shared_of.values()), shared_of
    assert shared_of["28.5"] < min(shared_of["20.10"], shared_of["26"]), shared_of

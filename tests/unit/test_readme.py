"""README.md's examples are what the commands print: the unit tier's examples (no daemon) are run again here and
compared with README.md's regions; the sandbox's are compared in tests/docker/test_readme.py. `make readme`
rewrites them all (tests/support/readme.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.readme import BY_NAME, EXAMPLES, NO_DAEMON, README, UNIT, normalised, regions, rewrite, run

UNIT_EXAMPLES = [e for e in EXAMPLES if e.tier == UNIT]


@pytest.mark.parametrize("name", [e.name for e in UNIT_EXAMPLES])
def test_the_readme_example_is_what_the_command_prints_now(fakegpu: Path, name: str) -> None:
    shown = regions(README.read_text())[name]
    now = run(BY_NAME[name], NO_DAEMON)
    assert normalised(now) == normalised(shown), f"README.md's example {name} has drifted: run `make readme`"


def test_every_region_is_an_example_and_every_example_a_region() -> None:
    assert set(regions(README.read_text())) == set(BY_NAME)


def test_rewriting_the_regions_with_their_own_text_changes_nothing() -> None:
    text = README.read_text()
    assert rewrite(text, regions(text)) == text


def test_normalised_masks_container_ids_and_never_a_uuid() -> None:
    uuid = "GPU-95c6a38a-fc69-47e6-82a4-2cdea89770cb"
    line = f"held by train-a (631d4e727bba, running) {uuid} cgroup v2 with"
    assert normalised(line) == f"held by train-a (<id>, running) {uuid} cgroup v<N> with"


def test_the_readme_is_a_front_door() -> None:
    """At most 200 lines (reference lives in docs/), and nothing outside the project."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "../" + "shared" not in text and "/work/" not in text

"""README.md's examples that need a daemon are what the commands print on the sandbox: run again here on Docker
20.10 (the engine README.md names) and compared with README.md's regions. The unit tier's: tests/unit/test_readme.py.
"""

from __future__ import annotations

import pytest

from tests.support.readme import BY_NAME, DOCKER, EXAMPLES, README, normalised, regions, run
from tests.support.sandbox import Sandbox


@pytest.mark.parametrize("name", [e.name for e in EXAMPLES if e.tier == DOCKER])
def test_the_readme_example_is_what_the_command_prints_on_the_sandbox(mixed4_sandbox: Sandbox, name: str) -> None:
    if mixed4_sandbox.engine != "20.10":
        pytest.skip("README.md's examples are Docker 20.10's")
    shown = regions(README.read_text())[name]
    now = run(BY_NAME[name], mixed4_sandbox.host)
    assert normalised(now) == normalised(shown), f"README.md's example {name} has drifted: run `make readme`"

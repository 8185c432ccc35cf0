"""compose projects rendered against the sandbox's ledger: a count is placed only where the ledger can be read
(unknown is not free), so the renders of projects with counts run here; the model without a daemon is
tests/unit/test_compose_project.py. The CLI reads the idle mixed-4 (no process on card 2): what places the counts is
the ledger and free memory alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.hostagent.compose.project import ProjectOptions
from tests.support.compose import V2, strip_gpu, tool
from tests.support.host import idle_topology
from tests.support.sandbox import Sandbox
from tests.support.scenarios import uuids
from tests.unit.test_compose_project import IDS, PROJECTS, PROJECTS_DIR, hostagent

# Every engine runs these (each engine brings its own compose (1.29, v2) and its model): docs/testing.md, The engines.
pytestmark = [pytest.mark.per_engine, pytest.mark.needs("compose")]

A800, RTX, A800B, A800C = uuids("mixed-4")


def render(cwd: Path, sandbox: Sandbox, *args: str, compose_v2: bool = False) -> subprocess.CompletedProcess[str]:
    return hostagent(cwd, *args, compose_v2=compose_v2, docker_host=sandbox.host, topology=idle_topology())


@pytest.mark.parametrize("compose_v2", [False, True], ids=["own-model", "compose-v2-model"])
def test_render_of_several_files_is_one_file_compose_runs_with_every_gpu_pinned(
    compose_v2: bool, tmp_path: Path, mixed4_sandbox: Sandbox
) -> None:
    folder = PROJECTS_DIR / "multi-file"
    out = tmp_path / "pinned.yml"
    r = render(
        folder,
        mixed4_sandbox,
        "compose",
        "render",
        "-f",
        "base.yml",
        "-f",
        "gpu.yml",
        "--via",
        "nvidia",
        "-o",
        str(out),
        compose_v2=compose_v2,
    )
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "# Merged from base.yml, gpu.yml" in text
    ran = subprocess.run(
        [*tool(V2), "-p", "x", "-f", str(out), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "COMPOSE_FILE"},
    )
    assert ran.returncode == 0, ran.stderr
    svcs = yaml.safe_load(ran.stdout)["services"]
    ids = {n: [d["device_ids"] for d in s["deploy"]["resources"]["reservations"]["devices"]] for n, s in svcs.items()}
    # The idle topology's cards read idle: the two A800s left, 80 GiB free each, by index.
    assert ids == {"eval": [[A800]], "serve": [[A800B, A800C]]}
    assert all("x-gpupin" not in s for s in svcs.values())
    assert svcs["serve"]["environment"]["HF_HOME"] == "/cache"
    again = render(tmp_path, mixed4_sandbox, "compose", "check", str(out))
    assert again.returncode == 0 and again.stdout.startswith("ok:"), again.stdout


@pytest.mark.parametrize("compose_v2", [False, True], ids=["own-model", "compose-v2-model"])
@pytest.mark.parametrize(("name", "options"), [(n, o) for n, o, _ in PROJECTS], ids=IDS)
def test_compose_reads_the_merged_render_as_the_project_outside_the_gpu_parts(
    name: str, options: ProjectOptions, compose_v2: bool, tmp_path: Path, mixed4_sandbox: Sandbox
) -> None:
    """The differential of test_compose_render.py for projects: compose v2's `config` of the project (its -f
    files, override file, include, extends, profiles, .env) and of the one file render wrote."""
    folder = tmp_path / name
    shutil.copytree(PROJECTS_DIR / name, folder)  # the rendered file beside the sources, as docs/compose.md asks
    out = folder / "pinned.yml"
    profiles = [a for p in options.profiles for a in ("--profile", p)]
    args = [a for f in options.files for a in ("-f", f)] + profiles
    r = render(
        folder, mixed4_sandbox, "compose", "render", *args, "--via", "nvidia", "-o", str(out), compose_v2=compose_v2
    )
    if name == "extends-same":
        assert r.returncode == 64 and "is also given to service base" in r.stderr  # a card booked twice
        return
    assert r.returncode == 0, r.stderr

    def config(cwd: Path, *argv: str) -> Any:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
        ran = subprocess.run(
            [*tool(V2), "-p", "x", *argv, "config", "--format", "json"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert ran.returncode == 0, ran.stderr
        return strip_gpu(json.loads(ran.stdout))

    assert config(folder, "-f", out.name, *profiles) == config(folder, *args)

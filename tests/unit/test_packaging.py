"""gpupin as users install it: `python -m build` makes the sdist and the wheel (the wheel from the sdist, as
`make dist` does), and each installs into a clean venv (no system site packages, not the checkout) whose console
scripts and modules work. The image-side install (no extra) must not pull the docker SDK.

No daemon (the make test-unit tier); pip fetches the dependencies from the package index this machine's pip is
configured with, as CI's does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpupin.core import __version__
from tests.support.host import REPO

MODULES = "gpupin.core, gpupin.entrypoint, gpupin.hostagent.run.launch"
# What the host extra brings and the image must not carry (the docker SDK and what only it needs).
HOST_ONLY = ("docker", "yaml", "requests", "prometheus_client")


def run(argv: Sequence[str | Path], cwd: Path, timeout: float = 300) -> str:
    """argv's stdout; its whole output in the failure when it fails. No PYTHONPATH, no virtual env of the
    caller's: what runs sees only the venv it is given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


class Venv:
    """A venv without pip of its own: the dev venv's pip installs into it (`pip --python`), which saves the
    ensurepip step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = path / "bin"
        run([sys.executable, "-m", "venv", "--without-pip", path], cwd=path.parent)

    def install(self, requirement: str) -> None:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                self.bin / "python",
                "install",
                "-q",
                "--disable-pip-version-check",
                requirement,
            ],
            cwd=self.path,
        )

    def python(self, code: str) -> str:
        return run([self.bin / "python", "-c", code], cwd=self.path).strip()

    def check_installed(self) -> None:
        """Both console scripts print gpupin.core's version, and the modules import from the venv's copy."""
        for script in ("hostagent", "gpupin-entrypoint"):
            assert run([self.bin / script, "--version"], cwd=self.path).strip() == f"{script} {__version__}"
        where = self.python(f"import {MODULES}; print(gpupin.core.__file__, gpupin.hostagent.run.launch.__file__)")
        for path in where.split():
            assert Path(path).is_relative_to(self.path), f"{path} is not the venv's installed copy"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel and the sdist of the checkout, the wheel built from the sdist."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "-q", "-o", out, REPO], cwd=out)
    wheel, sdist = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert [p.name for p in wheel + sdist] == [f"gpupin-{__version__}-py3-none-any.whl", f"gpupin-{__version__}.tar.gz"]
    return wheel[0], sdist[0]


def test_wheel_carries_every_module_the_license_and_the_typing_markers(dists: tuple[Path, Path]) -> None:
    wheel, _ = dists
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"gpupin-{__version__}.dist-info/METADATA").decode()
        license_text = z.read(f"gpupin-{__version__}.dist-info/licenses/LICENSE").decode()
    assert license_text == (REPO / "LICENSE").read_text()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert {f"gpupin/{p}/py.typed" for p in ("core", "entrypoint", "hostagent")} <= names
    assert "gpupin/hostagent/serve/dashboard.html" in names  # `hostagent serve` answers GET / from it
    # Every module of the checkout, under its import name (a subpackage missing from pyproject's list would be
    # absent here, though the editable install finds it).
    modules = {
        f"gpupin/{p.relative_to(REPO).as_posix()}"
        for top in ("core", "entrypoint", "hostagent")
        for p in (REPO / top).rglob("*.py")
    }
    assert {n for n in names if n.endswith(".py")} == modules
    assert not any(n.startswith("tests/") for n in names)


def test_sdist_carries_what_the_build_and_a_reader_need(dists: tuple[Path, Path]) -> None:
    _, sdist = dists
    root = f"gpupin-{__version__}"
    with tarfile.open(sdist) as t:
        names = {n.removeprefix(f"{root}/") for n in t.getnames()}
    assert {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "core/__init__.py",
        "hostagent/run/launch.py",
        "entrypoint/cli.py",
        "docs/slurm.md",
        "hostagent/serve/dashboard.html",
        "contrib/systemd/gpupin-hostagent.service",
        "CHANGELOG.md",
        "CONTRIBUTING.md",
    } <= names
    # Every page README.md links to travels with it.
    readme = (REPO / "README.md").read_text()
    for doc in (REPO / "docs").glob("*.md"):
        if f"](docs/{doc.name})" in readme:
            assert f"docs/{doc.name}" in names
    assert not any(n.startswith("tests/") for n in names), "a partial test suite (no fakes, no sandbox) in the sdist"


def test_wheel_installs_image_side_without_docker_then_with_host(dists: tuple[Path, Path], tmp_path: Path) -> None:
    wheel, _ = dists
    venv = Venv(tmp_path / "venv")
    venv.install(str(wheel))
    # The image's install: the entrypoint works, and nothing of the host side's dependencies came along.
    assert (
        run([venv.bin / "gpupin-entrypoint", "--version"], cwd=tmp_path).strip() == f"gpupin-entrypoint {__version__}"
    )
    found = venv.python(f"import importlib.util as u; print(*[m for m in {HOST_ONLY!r} if u.find_spec(m)])")
    assert found == "", f"the bare install pulled {found}"
    venv.install(f"{wheel}[host]")
    venv.check_installed()


def test_sdist_installs_with_host(dists: tuple[Path, Path], tmp_path: Path) -> None:
    _, sdist = dists
    venv = Venv(tmp_path / "venv")
    venv.install(f"{sdist}[host]")
    venv.check_installed()

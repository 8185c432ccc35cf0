"""Other users on the simulated host: what a test runs as another uid (under setpriv) runs from a copy of the CLI
that any user can reach.

The checkout may sit where no other user can go (a clone in root's 0700 home, a CI workspace): then uid 5001 can
neither start `.venv/bin/hostagent` nor load the fake NVML from `build/fakegpu/lib`. So the first test that acts as
another user makes, under the temporary folder, a world-readable venv of the same Python (the system's of the same
version where the venv's own interpreter is out of reach, as pyenv's under /root is) holding a copy of gpupin and
of what its `host` extra needs; `reach` swaps the checkout's CLIs, interpreter and files in an argv or an
environment for that copy's. It is made once per pytest process and removed when it exits. Where no such copy can
be made, the test fails with one line that says why."""

from __future__ import annotations

import atexit
import functools
import importlib.metadata as md
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from tests.support.host import BIN, REPO

NOBODY = 65534  # the uid that stands for "any other user" when checking what the copy can reach
PACKAGES = ("core", "entrypoint", "hostagent")  # gpupin's subpackages: gpupin.core is the folder core/, ...


def setpriv(uid: int, *groups: int, gid: int | None = None) -> list[str]:
    """The prefix that runs a command as `uid` (group `gid`, its uid's number unless given), with those
    supplementary groups and no other."""
    keep = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return ["setpriv", f"--reuid={uid}", f"--regid={uid if gid is None else gid}", keep]


def _runs_as_nobody(argv: list[str]) -> str:
    """'' where argv runs as nobody, else the first line of what went wrong."""
    r = subprocess.run([*setpriv(NOBODY), *argv], capture_output=True, text=True, timeout=60, cwd="/")
    return "" if r.returncode == 0 else ((r.stderr or r.stdout).strip().splitlines() or [f"exit {r.returncode}"])[0]


def _interpreter() -> str:
    """A CPython of this run's version that any user can start: the venv's base, else the system's."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [os.path.realpath(getattr(sys, "_base_executable", sys.executable))]
    candidates += [f"{d}/{version}" for d in ("/usr/local/bin", "/usr/bin")]
    why = ""
    for c in dict.fromkeys(candidates):
        if os.path.exists(c):
            why = _runs_as_nobody([c, "-c", "pass"])
            if not why:
                return c
    raise RuntimeError(f"no {version} that other users can start ({candidates[0]}: {why or 'not found'})")


def _requirements(dist: md.Distribution, extras: Iterable[str] = ()) -> list[str]:
    """The names of the distributions `dist` needs on this Python, with those extras."""
    from packaging.requirements import Requirement

    names = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            names.append(req.name)
    return names


def _copy_dist(dist: md.Distribution, site: Path) -> None:
    root = Path(str(dist.locate_file("")))
    for f in dist.files or []:
        src = root / f
        if f.suffix == ".pyc" or not src.is_file() or ".." in f.parts:
            continue  # the console scripts (bin/) are written anew; bytecode is made again
        dst = site / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def _make(folder: Path) -> Path:
    venv = folder / "venv"
    subprocess.run([_interpreter(), "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    gpupin = md.distribution("gpupin")
    todo, seen = _requirements(gpupin, ["host"]), {"gpupin"}
    while todo:  # the host extra's distributions and theirs, as installed in this venv
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        dist = md.distribution(name)
        _copy_dist(dist, site)
        todo += _requirements(dist)
    # gpupin itself is an editable install here: its folders, as the wheel lays them out, and its metadata.
    for name in PACKAGES:
        spec = importlib.util.find_spec(f"gpupin.{name}")
        assert spec is not None and spec.submodule_search_locations, name
        shutil.copytree(
            next(iter(spec.submodule_search_locations)),
            site / "gpupin" / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    info = site / f"gpupin-{gpupin.version}.dist-info"
    info.mkdir()
    for meta in ("METADATA", "entry_points.txt"):
        text = gpupin.read_text(meta)
        if text is not None:
            (info / meta).write_text(text)
    for ep in gpupin.entry_points:
        if ep.group == "console_scripts":
            module, func = ep.value.split(":")
            script = venv / "bin" / ep.name
            script.write_text(f"#!{venv}/bin/python\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    # Its bytecode, made here: another user may not write __pycache__ there, and would compile each module at each
    # start (half a second a command, which a test that times a command would count).
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", str(site)], capture_output=True)
    for d, _, files in os.walk(folder):
        os.chmod(d, 0o755)
        for f in files:
            p = Path(d) / f
            if not p.is_symlink():
                os.chmod(p, 0o755 if p.parent.name == "bin" else 0o644)
    why = _runs_as_nobody([str(venv / "bin" / "hostagent"), "--version"])
    if why:
        raise RuntimeError(f"its hostagent does not run as uid {NOBODY}: {why}")
    return venv


@functools.cache
def copy() -> Path:
    """The copy's folder (its venv is venv/, the checkout's files the tests name go under checkout/)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupin-cli-"))
    atexit.register(shutil.rmtree, folder, True)
    try:
        _make(folder)
    except (RuntimeError, OSError, subprocess.CalledProcessError, md.PackageNotFoundError) as e:
        pytest.fail(f"no copy of the CLI that other users can reach, under {folder}: {e}", pytrace=False)
    return folder


def python() -> str:
    """An interpreter other users can start, with gpupin and its host extra installed."""
    return str(copy() / "venv" / "bin" / "python")


def _reach_path(value: str) -> str:
    if value == sys.executable or value.startswith(f"{BIN}/"):
        return str(copy() / "venv" / "bin" / Path(value).name)
    if not value.startswith(f"{REPO}/"):
        return value
    path = Path(value)
    if not path.exists():
        return value
    dst = copy() / "checkout" / path.relative_to(REPO)
    if path.is_dir():
        if not dst.exists():
            shutil.copytree(path, dst, symlinks=True)
    else:  # a file is copied each time: it may have been written again (an idle topology)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dst)
    for p in [dst, *dst.parents]:
        if p == copy():
            break
        os.chmod(p, (p.stat().st_mode & 0o777) | 0o555 if p.is_dir() else 0o644 | (p.stat().st_mode & 0o111))
    return str(dst)


def reach(argv: Sequence[str]) -> list[str]:
    """argv with the checkout's CLIs, this interpreter and the checkout's files replaced by the copy's."""
    return [_reach_path(a) for a in argv]


def reach_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with each path (or `:`-separated list of paths) into the checkout replaced by the copy's:
    the fake libraries (LD_LIBRARY_PATH), the topology (FAKEGPU_TOPOLOGY)."""
    return {k: ":".join(_reach_path(p) for p in v.split(":")) if str(REPO) in v else v for k, v in env.items()}


def as_other(prefix: Sequence[str], argv: Sequence[str]) -> list[str]:
    """A setpriv prefix and a command of the checkout's, as that user can run it."""
    return [*prefix, *reach(argv)]

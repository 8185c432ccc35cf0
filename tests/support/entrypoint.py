"""gpupin-entrypoint as its contract tests run it: on the simulated host (the installed console script; NVML sees
every card of the scenario) or in a container (`gpupin:test` on a sandboxed daemon, started with `docker run --gpus
...`: the fake runtime hook exposes just the asked cards, as the real one does). The unit tier's `ep` is the first,
the docker tier's the second (their conftest.py), and the same tests run on both.

The workload `{py} -m gpupin.entrypoint` prints what cuda:k is from inside the process (the CUDA driver's answer under
the environment the entrypoint set), so the tests check what a job would really get, not what was printed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.host import ENTRYPOINT, simhost_env
from tests.support.sandbox import TEST_IMAGE, Sandbox, Sandboxes, lacks
from tests.support.scenarios import topology

STARTED = ["sh", "-c", "echo WORKLOAD-STARTED"]  # a workload that says it ran


def launch(script: str) -> list[str]:
    """A console script of the venv as a command. Where the venv's path has a space, pip writes the script as a
    /bin/sh launcher, and sh drops the variables whose names it cannot hold (DOCKER_RESOURCE_NVIDIA-GPU, as Swarm
    names it): the venv's interpreter runs the script itself then, as that launcher would."""
    with open(script, "rb") as f:
        first = f.readline()
    return [sys.executable, script] if first.startswith(b"#!/bin/sh") else [script]


class Result:
    def __init__(self, rc: int, out: str, err: str) -> None:
        self.rc, self.out, self.err = rc, out, err

    def __repr__(self) -> str:
        return f"Result(rc={self.rc}, out={self.out!r}, err={self.err!r})"


class Entrypoint:
    """Runs gpupin-entrypoint with arguments, extra environment and (in containers) a `--gpus` request."""

    def __init__(self, mode: str, sandbox: Sandbox | None) -> None:
        self.mode = mode
        self.sandbox = sandbox
        self.py = sys.executable if mode == "host" else "python3"

    def argv(
        self,
        args: list[str],
        env: dict[str, str],
        gpus: str | None,
        init: bool = False,
        detach: bool = False,
        scenario_name: str = "mixed-4",
        docker_args: tuple[str, ...] = (),
    ) -> tuple[list[str], dict[str, str]]:
        # {py} as a word of its own is the interpreter; inside a shell command, quoted (the checkout's path may hold
        # spaces).
        args = [self.py if a == "{py}" else a.replace("{py}", shlex.quote(self.py)) for a in args]
        if self.mode == "host":
            return [*launch(ENTRYPOINT), *args], simhost_env(scenario_name, **env)
        assert self.sandbox is not None
        # Podman takes no --gpus (tests/support/sandbox.py LACKS): its own CLI gives the same cards by CDI names.
        cdi = lacks(self.sandbox.engine, "gpus") is not None
        cmd = [*(self.sandbox.podman_cli if cdi else [self.sandbox.docker_cli]), "run", "-d" if detach else "--rm"]
        cmd += docker_args
        if init:
            cmd.append("--init")
        if gpus is not None:
            cmd += [a for g in cdi_names(gpus) for a in ("--device", g)] if cdi else ["--gpus", gpus]
        for k, v in env.items():
            cmd += ["-e", f"{k}={v}"]
        return [*cmd, TEST_IMAGE, *args], self.sandbox.env

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        gpus: str | None = "all",
        init: bool = False,
        scenario_name: str = "mixed-4",
        docker_args: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> Result:
        """`docker_args` go to `docker run` (container mode); `cwd` is the host process's directory (host mode)."""
        argv, penv = self.argv(list(args), env or {}, gpus, init, scenario_name=scenario_name, docker_args=docker_args)
        p = subprocess.run(
            argv, env=penv, capture_output=True, text=True, timeout=120, cwd=cwd if self.mode == "host" else None
        )
        return Result(p.returncode, p.stdout, p.stderr)


def on_host() -> Entrypoint:
    """The entrypoint on the simulated host (bare metal)."""
    return Entrypoint("host", None)


def in_container(sandboxes: Sandboxes, engine: str, scenario_name: str = "mixed-4") -> Entrypoint:
    """The entrypoint in a container on that engine's sandbox, which serves that scenario's cards."""
    return Entrypoint("container", sandboxes.get(engine).use(scenario_name))


def cdi_names(gpus: str) -> list[str]:
    """The CDI names of what a --gpus value asks for ("all", or device(...)'s list of ids)."""
    ids = gpus.strip('"').removeprefix("device=").split(",")
    return [f"nvidia.com/gpu={i}" for i in ids]


def device(*uuids: str) -> str:
    # The docker CLI reads --gpus as CSV: a list of ids must be quoted inside the value.
    return '"device=' + ",".join(uuids) + '"'


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if "ERROR:" in ln]
    assert len(lines) == 1, err
    return lines[0]


def only_error_line(err: str) -> str:
    """A refusal without --debug: exactly one line on stderr, the ERROR line, and no traceback."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpupin-entrypoint: ERROR: "), err
    return lines[0]


HOSTILE = "import sys\nsys.stderr.write('HOSTILE {name} imported\\n')\nraise ImportError('hostile {name}')\n"


def plant(root: Path, gpupin_folder: bool = True) -> Path:
    """Modules a workload may well have on its paths, named as what the entrypoint imports, each one failing
    loudly when imported: a script called entrypoint.py, a vendored or PyPI `pynvml`, stdlib shadows, a package
    folder, and a `gpupin/` folder without __init__.py holding modules named as gpupin's.

    The `gpupin/` folder only where gpupin is installed from its wheel (the image): an editable install (this
    checkout's .venv, host mode) maps gpupin.entrypoint through a finder that Python asks after sys.path, so there
    such a folder joins the package before any gpupin code runs (gpupin.entrypoint.isolation says so)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("entrypoint", "pynvml", "json", "subprocess", "signal", "traceback", "selectors"):
        (root / f"{name}.py").write_text(HOSTILE.format(name=name))
    (root / "ctypes").mkdir(exist_ok=True)
    (root / "ctypes" / "__init__.py").write_text(HOSTILE.format(name="ctypes"))
    if not gpupin_folder:
        return root
    (root / "gpupin" / "entrypoint").mkdir(parents=True, exist_ok=True)
    for name in ("verify", "nvml", "isolation"):
        (root / "gpupin" / "entrypoint" / f"{name}.py").write_text(HOSTILE.format(name=f"gpupin.entrypoint.{name}"))
    return root


def hung_driver(tmp_path: Path, scenario_name: str = "mixed-4", keep: str | None = None) -> Path:
    """A topology whose cuInit takes a minute (a card in a bad state), optionally with one card only."""
    topo = topology(scenario_name)
    if keep is not None:
        topo["gpus"] = [g for g in topo["gpus"] if g["uuid"] == keep]
    topo["faults"] = {"cuda_init_delay_ms": 60000}
    path = tmp_path / "hung" / "topology.json"
    path.parent.mkdir()
    path.write_text(json.dumps(topo))
    path.parent.chmod(0o755)
    return path

"""The sandboxed Docker daemons, one per engine (tests/sandbox/sandbox.sh), as the docker-path tests drive them: by
each engine's own docker CLI and compose, and through hostagent on the simulated host (Agent). conftest.py hands
them out as fixtures (`sandbox`, `sandboxes`, `agent`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support.host import HOSTAGENT, REPO, required, simhost_env
from tests.support.scenarios import scenario

SANDBOX_SCRIPT = REPO / "tests" / "sandbox" / "sandbox.sh"
PODMAN_SCRIPT = REPO / "tests" / "sandbox" / "podman.sh"
TEST_IMAGE = "gpupin:test"
# The engines' ids, as GPUPIN_SANDBOX_ENGINE names them; the first is the default engine. The others serve
# nvidia.com/gpu by CDI (26 with CDI turned on, 28.5 by default) and read compose files with compose v2.
ENGINES = ("20.10", "26", "28.5")
# Podman (the sandboxed podman 4.3 service, tests/sandbox/podman.sh) is one more runtime of the docker tier's
# fixtures, only where named (GPUPIN_TEST_ENGINES=podman, `make test-docker ENGINES=podman`): it runs the `per_engine`
# tests and never takes a shared one (tests/support/engines.py). hostagent pins there through podman's own CDI.
PODMAN = "podman"
RUNTIMES = (*ENGINES, PODMAN)
CDI_ENGINES = ("26", "28.5", PODMAN)

# What a runtime lacks that some tests drive, and why: `@pytest.mark.needs("CAP", ...)` skips such a test there
# with this reason (tests/support/engines.py). Every runtime not named here has every capability. Podman 4.3's
# Docker-compatible API, measured (docs/podman.md):
LACKS: dict[str, dict[str, str]] = {
    PODMAN: {
        "gpus": "podman drops the nvidia driver's device request (the docker CLI's --gpus; podman 4.3's own CLI has "
        "no --gpus): no card reaches the container that way, and hostagent refuses --via nvidia there (64)",
        "nvidia-runtime": "podman has no nvidia runtime (--runtime nvidia) and reaches cards by CDI, whose spec "
        "sets NVIDIA_VISIBLE_DEVICES=void: the variable is no request there",
        "cdi-inspect": "podman 4.3's inspect shows neither a CDI device nor a device request: the ledger names "
        "such a holder by the card nodes of its OCI spec (tests/docker/test_podman.py), not by the way it asked",
        "run-options": "hostagent's create on podman carries the options docs/podman.md lists; any other is "
        "refused there (64), never dropped",
        "compose": "compose's own tests drive Docker's compose (1.29, v2), whose device requests podman drops: "
        "compose on podman is podman-compose's (tests/docker/test_podman_compose.py)",
        "bind-create": "podman does not create a missing host folder of `-v` (Docker's daemon does): the create "
        "is refused (125)",
        "lock-spares": "the resident agent takes the ledger lock by a create on podman, as a run without it does: "
        "its spares (a rename, an imported empty image) are measured on Docker's engines only (docs/design.md, "
        "The lock)",
        "stop-reason": "podman sends no `kill` event and not always a `stop` for a `docker stop` (4.3, measured): "
        "the agent's record counts it as an exit (docs/podman.md, Not done yet)",
        "authz": "podman has no authorization plugins: nothing stands at its door (docs/authz.md, Podman)",
    },
}


def lacks(engine: str, capability: str) -> str | None:
    """Why `engine` lacks `capability` (LACKS), or None when it has it."""
    return LACKS.get(engine, {}).get(capability)


def has(sandbox: Sandbox, capability: str) -> bool:
    """Whether the sandbox's runtime has it (LACKS), for the part of a test that checks it there."""
    return lacks(sandbox.engine, capability) is None


def engines_under_test() -> list[str]:
    """The engines this run tests: GPUPIN_TEST_ENGINES (space- or comma-separated), else every Docker engine (podman
    only where named)."""
    wanted = os.environ.get("GPUPIN_TEST_ENGINES", "").replace(",", " ").split()
    unknown = sorted(set(wanted) - set(RUNTIMES))
    if unknown:
        raise pytest.UsageError(
            f"GPUPIN_TEST_ENGINES: unknown engine {' '.join(unknown)}; the engines are {' '.join(RUNTIMES)}"
        )
    return [e for e in RUNTIMES if e in wanted] if wanted else list(ENGINES)


def sandbox_env(engine: str) -> dict[str, str]:
    """What sandbox.sh says a client of this engine's sandbox needs (DOCKER_HOST, its docker CLI, its run folder;
    DOCKER_CONFIG for Engines 26 and 28.5, whose CLI finds the compose plugin through it). GPUPIN_SANDBOX_NAME
    selects one more sandbox beside the default one, as in sandbox.sh and the Makefile."""
    out = subprocess.run(
        [str(PODMAN_SCRIPT if engine == PODMAN else SANDBOX_SCRIPT), "env"],
        env=dict(os.environ, GPUPIN_SANDBOX_ENGINE=engine),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


class Sandbox:
    """One engine's sandboxed daemon, driven by that engine's own docker CLI and compose; records what tests
    create, removes it after."""

    def __init__(self, engine: str) -> None:
        info = sandbox_env(engine)
        self.engine = engine
        self.host = info["DOCKER_HOST"]
        self.run_dir = Path(info["GPUPIN_SANDBOX_RUN"])
        # On podman: the default engine's docker CLI against podman's compatible socket (what a Docker user points
        # there), and podman's own CLI (--remote, to the same service) for what only it does.
        self.docker_cli = info.get("GPUPIN_SANDBOX_DOCKER") or sandbox_env(ENGINES[0])["GPUPIN_SANDBOX_DOCKER"]
        self.podman_cli: list[str] = info.get("GPUPIN_SANDBOX_PODMAN", "").split()
        self.env = dict(os.environ, DOCKER_HOST=self.host)
        if "DOCKER_CONFIG" in info:
            self.env["DOCKER_CONFIG"] = info["DOCKER_CONFIG"]
        # docker-compose 1.29 (Debian 12) beside 20.10; the compose v2 CLI plugin beside Engines 26 (2.26) and 28.5
        # (2.40).
        self.compose_cli: Sequence[str] = (
            [shutil.which("docker-compose") or "/usr/bin/docker-compose"]
            if engine == "20.10"
            else [self.docker_cli, "compose"]
        )

    def docker(
        self, *args: str, check: bool = False, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """This engine's docker CLI; on podman, `run` and `create` go through podman's own CLI, as a podman user
        runs them: the docker CLI's `--device` fails against podman ("unknown server OS"), its `run --rm` reports
        exit 0 whatever the exit (podman's wait for "removed"), and podman's CLI resolves CDI names itself."""
        cli = self.podman_cli if self.podman_cli and args[:1] in (("run",), ("create",)) else [self.docker_cli]
        return subprocess.run(
            [*cli, *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            input=input,
        )

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Podman's own CLI against the sandboxed service (podman only)."""
        assert self.podman_cli, f"Engine {self.engine} is not podman"
        return subprocess.run([*self.podman_cli, *args], capture_output=True, text=True, timeout=timeout)

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """This engine's compose, with the flags both generations read (`--ansi never`, not 1.x's `--no-ansi`)."""
        return subprocess.run(
            [*self.compose_cli, "--ansi", "never", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def exposed(self, cid: str) -> list[str]:
        """The cards the fake hook (or CDI's) exposed to this container, from its log in the sandbox's run folder."""
        return exposed_in(self.run_dir, cid)

    def restart(self, scenario_name: str) -> None:
        """Run the sandbox with another topology (the hook reads it from dockerd's environment; Engine 26 also
        and 28.5 also get the CDI spec of the new topology)."""
        env = dict(os.environ, FAKEGPU_TOPOLOGY=str(scenario(scenario_name)), GPUPIN_SANDBOX_ENGINE=self.engine)
        script = PODMAN_SCRIPT if self.engine == PODMAN else SANDBOX_SCRIPT
        subprocess.run([str(script), "up"], env=env, check=True, capture_output=True, timeout=600)

    def topology_name(self) -> str:
        config = (self.run_dir / "config").read_text().split()
        return Path(config[1]).stem

    def use(self, scenario_name: str) -> Sandbox:
        """This sandbox on that topology (restarted only when it runs another)."""
        if self.topology_name() != scenario_name:
            self.restart(scenario_name)
        return self


def fail_or_skip(why: str) -> NoReturn:
    if required():
        pytest.fail(f"the sandboxed Docker daemon is required here (CI): {why}", pytrace=False)
    pytest.skip(f"no sandboxed Docker daemon: {why} (`make image-test` starts every engine's)")


def exposed_in(run_dir: Path, cid: str) -> list[str]:
    """The cards the fake hook (or CDI's) last exposed to container `cid`, from `run_dir`'s hook.log."""
    found: list[str] = []
    for line in (run_dir / "hook.log").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("container_id") == cid and rec.get("command") == "fakegpu-expose":
            found = list(rec.get("exposed") or [])
    return found


class Sandboxes:
    """Every engine's sandbox, checked once per session. Tests take one through the `sandbox` fixture (one run
    per engine); a fixture that decides at run time whether it needs a daemon asks here by engine (pytest cannot
    hand it a parametrized fixture then)."""

    def __init__(self) -> None:
        self._checked: dict[str, Sandbox | str] = {}

    def get(self, engine: str) -> Sandbox:
        if engine not in self._checked:
            try:
                self._checked[engine] = self._check(Sandbox(engine))
            except subprocess.CalledProcessError as err:  # sandbox.sh refused the name or the engine
                self._checked[engine] = str(err.stderr).strip() or str(err)
        got = self._checked[engine]
        if isinstance(got, str):
            fail_or_skip(got)
        return got

    @staticmethod
    def _check(sb: Sandbox) -> Sandbox | str:
        """The sandbox, or why it cannot serve."""
        try:
            ping = sb.docker("version", "--format", "{{.Server.Version}}", timeout=20)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"Engine {sb.engine} at {sb.host}: {err}"
        if ping.returncode != 0:
            why = ping.stderr.strip().splitlines()[-1] if ping.stderr.strip() else "no answer"
            return f"Engine {sb.engine} at {sb.host}: {why}"
        if sb.docker("image", "inspect", TEST_IMAGE).returncode != 0:
            return f"the image {TEST_IMAGE} is missing on Engine {sb.engine} (`make image-test` builds it)"
        return sb

    def restore(self) -> None:
        """Whatever a test changed, leave each sandbox on the default topology for the next run."""
        for sb in self._checked.values():
            if isinstance(sb, Sandbox) and (sb.run_dir / "config").exists():
                sb.use("mixed-4")


class Agent:
    """Runs the hostagent CLI on the simulated host, against the sandbox; tags what it creates."""

    def __init__(self, sandbox: Sandbox, tag: str) -> None:
        self.sandbox = sandbox
        self.tag = tag
        self.env = simhost_env("mixed-4", DOCKER_HOST=sandbox.host)

    def argv(self, *args: str) -> list[str]:
        if args and args[0] == "run":
            return [HOSTAGENT, "run", "--label", f"gpupin.test={self.tag}", *args[1:]]
        return [HOSTAGENT, *args]

    def __call__(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), env={**self.env, **env}, capture_output=True, text=True, timeout=timeout
        )

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args), env={**self.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def containers(self, state: str | None = None) -> list[dict[str, str]]:
        args = ["ps", "-a", "--no-trunc", "--filter", f"label=gpupin.test={self.tag}", "--format", "{{json .}}"]
        if state:
            args[2:2] = ["--filter", f"status={state}"]
        out = self.sandbox.docker(*args, check=True).stdout
        return [json.loads(line) for line in out.splitlines()]


def agent_on(sandbox: Sandbox) -> Iterator[Agent]:
    """An Agent on this sandbox (mixed-4), and the removal of what it tagged."""
    sandbox.use("mixed-4")
    busy = sandbox.docker("ps", "-q", "--filter", "label=gpupin.devices", check=True).stdout.split()
    assert not busy, f"pinned containers left running by an earlier test: {busy}"
    a = Agent(sandbox, uuid.uuid4().hex[:12])
    yield a
    ids = sandbox.docker("ps", "-aq", "--filter", f"label=gpupin.test={a.tag}").stdout.split()
    if ids:
        # Killed first: podman's `rm -f` (its compatible API) stops with the 10 s timeout a `sleep` as PID 1 outlasts.
        sandbox.docker("kill", *ids)
        sandbox.docker("rm", "-f", *ids)


def serves_cdi(sandbox: Sandbox) -> bool:
    """Whether the sandbox's daemon serves nvidia.com/gpu by CDI (Engines 26 and 28.5 run with CDI on and the fake
    `nvidia-ctk cdi generate` spec), so that hostagent pins through CDI there (the assertion; hostagent asks the
    daemon itself)."""
    return sandbox.engine in CDI_ENGINES


def intervals(outputs: list[str]) -> dict[str, list[tuple[float, float]]]:
    """When each run held its card, by card, from what WORK printed."""
    by_card: dict[str, list[tuple[float, float]]] = {}
    for out in outputs:
        m = re.search(r"^(\S+)@\S+ (\d+\.\d+) (\d+\.\d+)$", out, re.M)
        assert m, out
        by_card.setdefault(m.group(1), []).append((float(m.group(2)), float(m.group(3))))
    return by_card


def never_two_at_once(by_card: dict[str, list[tuple[float, float]]]) -> None:
    for card, spans in by_card.items():
        spans.sort()
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            assert e1 <= s2, f"{card} held twice at once: {s1}-{e1} and {s2}-{e2}"


# A workload that prints its card and when it held it (sleeping {} seconds in between).
WORK = 'echo "$GPUPIN_EXPECT $(date +%s.%N) $(sleep {}; date +%s.%N)"'

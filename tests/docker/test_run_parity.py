"""`hostagent run` parses its command line as `docker run` does, shown differentially: every line of
tests/data/run-corpus.txt runs through the engine's own docker CLI and through `hostagent run`, on each engine's
sandbox, and the two containers' `docker inspect` (Config and HostConfig) must be equal, or both must be refused.

What may differ, and why (nothing else is left out):
- Config.Hostname, when neither side set one: the daemon makes it from the container's ID.
- The lease labels (gpupin.owner, gpupin.lease): hostagent's claim on its cards while it starts the container;
  and the booking label (gpupin.booking: whose, since when, docs/policy.md), each run's own.
- In HostConfig.DeviceRequests, all but the cards (DeviceIDs, Count): hostagent names the driver ("nvidia") where
  `--gpus` leaves it empty (the same driver), and gives CDI's request empty capabilities and options, not none.
- A list or map left out (null) and an empty one: the same to the daemon. Docker 20.10's CLI leaves out some
  that Engine 26's sends empty (BlkioDevice*, Ulimits).
- The spelling of a capability in HostConfig.CapAdd and CapDrop: docker CLI 28 sends `CAP_SYS_ADMIN` for
  `--cap-add SYS_ADMIN`, earlier CLIs and hostagent the name as given; the daemon reads both as one capability.
- The order of Config.Env and HostConfig.Binds: the docker CLI itself gives them in a different order from run to
  run (it keeps -e and -v in Go maps); they are compared as sorted lists (duplicates kept).
The pin itself is the same on both sides: the docker side gets hostagent's own pin arguments (--gpus or CDI
--device, GPUPIN_EXPECT/NVIDIA_VISIBLE_DEVICES, the gpupin.devices label), as `hostagent run --dry-run` prints them,
so the cards, the pin's variables and labels are compared too.

Both sides run with the same environment (the pass-through variables of the corpus) and in the same folder
(relative paths), detached (`-d`, so that both containers exist when the command returns), with the command
`sleep`; one side's container is removed before the other side runs.

What is compared is what each side asked the daemon to create, so neither container is started: both sides talk
to the daemon through tests/support/daemon_proxy.py, which answers their `POST /containers/ID/start` with the
daemon's 204 itself. Each side runs its whole path (create, start, the ID printed) and leaves a created container;
a limit this sandbox could not give at start (more CPUs than it has, `--ulimit memlock=-1` in a nested container)
is compared as any other. Starting a container is the other docker tests' business.

hostagent follows the current docker CLI: where Docker 20.10's CLI refuses a line that later CLIs take (a relative
bind source, `-v ./data:/data`, made absolute since CLI 23), the line runs through the newest CLI unpacked here
(Engine 26's in CI) against the 20.10 daemon too, and hostagent must equal that.

Each line runs on one engine where the make targets run the engines side by side (docs/testing.md, The engines:
what hostagent parses is the same whatever the engine, and the options landing in each engine's container are
test_hostagent_run.py's, on every engine); a run on one engine (`make test-docker ENGINES=26
PYTEST_ARGS=tests/docker/test_run_parity.py`) takes every line. The counts (lines, equal, both refused) of each
engine, and what both sides said where both refused, are written to build/run-parity-ENGINE.txt for docs/run.md.
"""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.ledger import booking
from gpupin.hostagent.ledger.lease import LEASE_LABEL, OWNER_LABEL
from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.sandbox import ENGINES, TEST_IMAGE, Sandbox

CORPUS = REPO / "tests" / "data" / "run-corpus.txt"
COMMAND = ("sleep", "600")
LEFT_OUT_LABELS = (OWNER_LABEL, LEASE_LABEL, booking.LABEL)
PASS_THROUGH = {"HF_TOKEN": "hf_corpus_token", "WANDB_API_KEY": "wandb-corpus-key"}
PROXY = REPO / "tests" / "support" / "daemon_proxy.py"


def corpus() -> list[tuple[int, str]]:
    """(line number, options) of every case."""
    rows = []
    for n, line in enumerate(CORPUS.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            rows.append((n, line.strip()))
    return rows


ROWS = corpus()
COUNTS: dict[str, dict[str, int]] = {}
REFUSED: dict[str, list[str]] = {}  # what each side said, for the record


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder both sides run in: what the corpus's relative paths name."""
    root = tmp_path_factory.mktemp("parity") / "work"
    for d in ("data", "models", "ckpt", "notebooks"):
        (root / d).mkdir(parents=True)
    (root / "train.env").write_text(
        '# training settings\nLR=1e-4\n\n  BATCH=64\nMSG="quoted as is" \nHF_TOKEN\nNOT_SET\nEMPTY=\n'
    )
    (root / "secrets.env").write_text("WANDB_API_KEY=from-the-file\nLR=5e-5\n")
    (root / "seccomp.json").write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}, indent=2))
    return root


@pytest.fixture(scope="module")
def unstarted(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DOCKER_HOST for this engine's daemon where a container's start is answered, never done."""
    sock = tmp_path_factory.mktemp(f"unstarted-{sandbox.engine}") / "docker.sock"
    proxy = subprocess.Popen(
        [
            sys.executable,
            str(PROXY),
            "--listen",
            f"unix://{sock}",
            "--to",
            str(sandbox.run_dir / "docker.sock"),
            "--fail",
            "POST /containers/[^/]+/start$=204",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None and proxy.stdout.readline() == "ready\n", proxy.stderr
        yield f"unix://{sock}"
    finally:
        proxy.kill()
        proxy.wait()


@pytest.fixture(scope="module")
def counted(sandbox: Sandbox) -> Iterator[dict[str, int]]:
    """This engine's counts, written out when the module's cases have run; volumes the lines made are removed."""
    before = set(sandbox.docker("volume", "ls", "-q", check=True).stdout.split())
    counts = COUNTS.setdefault(
        sandbox.engine,
        {"lines": 0, "equal": 0, "both refused": 0, "as the newer CLI": 0},
    )
    yield counts
    made = set(sandbox.docker("volume", "ls", "-q", check=True).stdout.split()) - before
    if made:
        sandbox.docker("volume", "rm", "-f", *sorted(made))
    out = REPO / "build" / f"run-parity-{sandbox.engine}.txt"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        " ".join(f"{k}={v}" for k, v in counts.items())
        + "\n"
        + "".join(f"{r}\n" for r in REFUSED.get(sandbox.engine, []))
    )


PINS: dict[str, list[str]] = {}


@functools.cache
def newest_cli() -> str:
    """The docker CLI of the newest engine unpacked here (the make targets fetch those of the engines they run)."""
    return next(c for c in (Sandbox(e).docker_cli for e in reversed(ENGINES)) if Path(c).exists())


def pin_args(sandbox: Sandbox, env: dict[str, str]) -> list[str]:
    """The pin's `docker run` arguments as hostagent gives them on this engine (--gpu 0)."""
    if sandbox.engine in PINS:
        return PINS[sandbox.engine]
    out = subprocess.run(
        [HOSTAGENT, "run", "--dry-run", "--gpu", "0", TEST_IMAGE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    argv = shlex.split(out)
    assert argv[:2] == ["docker", "run"] and argv[-1] == TEST_IMAGE, out
    PINS[sandbox.engine] = argv[2:-1]
    return PINS[sandbox.engine]


def _empty_is_none(value: Any) -> Any:
    return None if value in ([], {}) else value


def comparable(info: dict[str, Any]) -> dict[str, Any]:
    config = {k: _empty_is_none(v) for k, v in info["Config"].items()}
    host = {k: _empty_is_none(v) for k, v in info["HostConfig"].items()}
    if config.get("Hostname") == info["Id"][:12]:
        config["Hostname"] = "<from the ID>"
    config["Labels"] = {k: v for k, v in (config.get("Labels") or {}).items() if k not in LEFT_OUT_LABELS}
    config["Env"] = sorted(config.get("Env") or [])
    host["Binds"] = sorted(host.get("Binds") or [])
    host["DeviceRequests"] = [(r["DeviceIDs"], r["Count"]) for r in host.get("DeviceRequests") or []]
    for key in ("CapAdd", "CapDrop"):  # CLI 28 sends CAP_SYS_ADMIN where earlier CLIs send SYS_ADMIN: one capability
        if host.get(key):
            host[key] = [c if c.upper() == "ALL" or c.upper().startswith("CAP_") else f"CAP_{c}" for c in host[key]]
    return {"Config": config, "HostConfig": host}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [f"{path}: docker {a!r}, hostagent {b!r}"]


@pytest.fixture(scope="module")
def api(sandbox: Sandbox) -> Any:
    """The daemon's own API (the docker SDK), for what the test reads and removes: the same inspect for both sides,
    without a CLI process for each look."""
    import docker

    return docker.APIClient(base_url=sandbox.host, version="auto", timeout=120)


def created(
    api: Any, argv: list[str], env: dict[str, str], cwd: Path, tag: str
) -> tuple[bool, dict[str, Any] | None, str]:
    """(whether `argv` succeeded, the comparable inspect of the container it left, if any; what it said), removing
    the container."""
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    ids = [c["Id"] for c in api.containers(all=True, filters={"label": f"gpupin.test={tag}"})]
    try:
        assert len(ids) <= 1, (ids, proc.stdout, proc.stderr)
        info = api.inspect_container(ids[0]) if ids else None
        return proc.returncode == 0, None if info is None else comparable(info), proc.stderr.strip()
    finally:
        for cid in ids:
            api.remove_container(cid, v=True, force=True)


@pytest.mark.parametrize(("lineno", "line"), ROWS, ids=[f"line{n}" for n, _ in ROWS])
def test_docker_run_line(
    sandbox: Sandbox, api: Any, unstarted: str, counted: dict[str, int], workdir: Path, lineno: int, line: str
) -> None:
    sandbox.use("mixed-4")
    env = {**simhost_env("mixed-4"), **sandbox.env, **PASS_THROUGH, "DOCKER_HOST": unstarted}
    env.pop("NOT_SET", None)
    options = shlex.split(line.replace("{pwd}", str(workdir)))
    tag = uuid.uuid4().hex[:12]
    pin = pin_args(sandbox, env)

    mine = [HOSTAGENT, "run", "-d", "--gpu", "0", "--label", f"gpupin.test={tag}", *options, TEST_IMAGE, *COMMAND]

    def theirs(cli: str) -> list[str]:
        return [cli, "run", "-d", "--label", f"gpupin.test={tag}", *options, *pin, TEST_IMAGE, *COMMAND]

    ok, got, said = created(api, mine, env, workdir, tag)
    cli = sandbox.docker_cli
    docker_ok, want, docker_said = created(api, theirs(cli), env, workdir, tag)
    newer = newest_cli()
    if want is None and ok and newer != cli:  # hostagent created, docker's CLI refused: the newest CLI here decides
        cli = newer
        docker_ok, want, docker_said = created(api, theirs(cli), env, workdir, tag)
        counted["as the newer CLI"] += 1
    counted["lines"] += 1
    if not (docker_ok and ok):
        assert not docker_ok and not ok, (
            f"line {lineno} ({line}): docker {'refused: ' + docker_said if not docker_ok else 'accepted'}; "
            f"hostagent {'refused: ' + said if not ok else 'accepted'}"
        )
        last = [
            ([t for t in text.splitlines() if t.strip() and not t.startswith("See '")] or [""])[-1]
            for text in (docker_said, said)
        ]
        REFUSED.setdefault(sandbox.engine, []).append(
            f"line {lineno} ({line})\n  docker: {last[0]}\n  hostagent: {last[1]}"
        )
        # Refused before anything was created, as docker's must be.
        assert want is None and got is None, f"line {lineno} ({line}): docker {docker_said}; hostagent {said}"
        counted["both refused"] += 1
        return
    assert want is not None and got is not None, f"line {lineno} ({line}): {docker_said}; {said}"
    diff = differences(want, got)
    assert not diff, f"line {lineno} ({line}):\n  " + "\n  ".join(diff)
    counted["equal"] += 1

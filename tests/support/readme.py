"""README.md's examples, produced by running them on the simulated host, so that they cannot drift.

Each example is a region of README.md between `<!-- example: NAME -->` and `<!-- /example -->`: the commands
shown (`$ ...`), each followed by what it printed (stdout and stderr, in order). `make readme` rewrites every
region from real runs (`python -m tests.support.readme`); tests/unit/test_readme.py runs the unit tier's examples
again and compares, tests/docker/test_readme.py the sandbox's (Docker 20.10). Only what varies from run to run is
normalised in the comparison: container ids, and the host's cgroup version in doctor's summary.

An example runs exactly the commands it shows, through bash, in a scratch directory where `compose/` is the
checkout's; `before` and `after` (not shown) set up and remove the holders it needs. Unit examples run with no
daemon; docker examples against the sandbox that DOCKER_HOST names (the Makefile's, or the test's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.host import BIN, FAKEGPU, REPO, lock_dir
from tests.support.scenarios import scenario, topology, uuids

README = REPO / "README.md"
UNIT, DOCKER = "unit", "docker"
NO_DAEMON = "unix:///nonexistent/docker.sock"  # the unit tier's examples: no daemon anywhere
LABEL = "gpupin.readme.example=1"  # on every container an example's set-up makes (removed after it)
A800, RTX, A800B, A800C = uuids("mixed-4")
BUS = {g["uuid"]: g["bus_id"] for g in topology("mixed-4")["gpus"]}

BEGIN = re.compile(r"^<!-- example: ([a-z0-9-]+) -->\n", re.M)
END = "<!-- /example -->\n"


@dataclass(frozen=True)
class Example:
    """One README example: `commands` are shown and run in order; `exits` are what each must return (the README's
    captions say so; 0 where not given); `stdout_only` leaves stderr out (a unit example whose stderr says only
    that no daemon was asked); `host` writes the topology the host side reads instead of mixed-4 (not shown: the
    caption says it)."""

    name: str
    tier: str
    commands: tuple[str, ...]
    exits: tuple[int, ...] = ()
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    stdout_only: bool = False
    host: Callable[[], str] | None = None


def _holder(name: str, gpu: str) -> str:
    """A container that holds a card until removed, started as the README says (hostagent run)."""
    return f"hostagent run -d --name {name} --label {LABEL} --gpu {gpu} gpupin:test sleep 600 >/dev/null"


_REMOVE = f"docker rm -f $(docker ps -aq --filter label={LABEL}) >/dev/null 2>&1 || true"


def _no_persistence_on_card_2() -> str:
    """mixed-4 with persistence mode off on card 2 (written under build/): the trap doctor's example finds."""
    topo = topology("mixed-4")
    topo["gpus"][2]["persistence_mode"] = 0
    path = REPO / "build" / "readme" / "mixed-4-no-persistence.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(topo))
    return str(path)


EXAMPLES: tuple[Example, ...] = (
    Example(
        "wrong-card",
        DOCKER,
        ("docker run --rm --gpus all -e CUDA_VISIBLE_DEVICES=1 --entrypoint python3 gpupin:test -m gpupin.entrypoint",),
    ),
    Example(
        "ls",
        DOCKER,
        ("hostagent ls",),
        before=(
            _holder("eval-b", "0"),
            _holder("train-a", "1"),
            f"docker run -d --name naive --label {LABEL} --gpus device=2 gpupin:test sleep 600 >/dev/null",
        ),
        after=(_REMOVE,),
    ),
    Example(
        "run", DOCKER, ("hostagent run --gpu 3b:00.0 --rm gpupin:test python3 -c 'print(\"training on cuda:0\")'",)
    ),
    Example(
        "refused",
        DOCKER,
        ("hostagent run --rm --gpu 1 gpupin:test",),
        exits=(75,),
        before=(_holder("train-a", "1"),),
        after=(_REMOVE,),
    ),
    Example(
        "wait",
        DOCKER,
        ("hostagent run --rm --gpu 1 --wait 30 gpupin:test --quiet python3 -m gpupin.entrypoint",),
        before=(f"hostagent run -d --rm --name holder --label {LABEL} --gpu 1 gpupin:test sleep 8 >/dev/null",),
        after=(_REMOVE,),
    ),
    Example(
        "dry-run",
        UNIT,
        ("hostagent run --dry-run --gpu 3b:00.0 --gpu 0 gpupin:test python3 train.py",),
        stdout_only=True,
    ),
    Example(
        "entrypoint-refuses",
        UNIT,
        (f"GPUPIN_EXPECT={A800}@{BUS[RTX]} gpupin-entrypoint python3 train.py",),
        exits=(78,),
    ),
    Example(
        "compose",
        DOCKER,
        (
            "hostagent compose check compose/wrong-way-count.yml",
            "hostagent compose render compose/two-services.yml -o pinned.yml && hostagent compose check pinned.yml",
        ),
        exits=(64, 0),
    ),
    Example("doctor", DOCKER, ("hostagent doctor",), exits=(1,), host=_no_persistence_on_card_2),
)
BY_NAME = {e.name: e for e in EXAMPLES}


def environment(docker_host: str, topology_file: str | None = None) -> dict[str, str]:
    """What the examples run under: the simulated mixed-4 host, the checkout's CLIs first on PATH, that daemon."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPUPIN_", "NVIDIA_", "DOCKER_"))}
    env.update(
        LD_LIBRARY_PATH=str(FAKEGPU / "lib"),
        FAKEGPU_TOPOLOGY=topology_file or str(scenario("mixed-4")),
        PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
        DOCKER_HOST=docker_host,
        GPUPIN_LOCK_DIR=lock_dir(),  # the run's own: root's default, /run/gpupin, is the host's
        PYTHONUNBUFFERED="1",  # stdout and stderr interleaved as a terminal shows them
        COLUMNS="120",
    )
    return env


def _bash(command: str, env: Mapping[str, str], cwd: Path, stdout_only: bool = False) -> tuple[int, str]:
    r = subprocess.run(
        ["bash", "-c", command],
        env=dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if stdout_only else subprocess.STDOUT,
        text=True,
        timeout=180,
    )
    return r.returncode, r.stdout


def run(example: Example, docker_host: str) -> str:
    """The example's text as README.md shows it (indented four spaces), from a real run of its commands."""
    env = environment(docker_host if example.tier == DOCKER else NO_DAEMON, example.host() if example.host else None)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpupin-readme-") as tmp:
        cwd = Path(tmp)
        (cwd / "compose").symlink_to(REPO / "compose")
        try:
            for step in example.before:
                rc, out = _bash(step, env, cwd)
                if rc != 0:
                    raise RuntimeError(f"example {example.name}: set-up `{step}` exited {rc}: {out}")
            for i, command in enumerate(example.commands):
                rc, out = _bash(command, env, cwd, example.stdout_only)
                want = example.exits[i] if i < len(example.exits) else 0
                if rc != want:
                    raise RuntimeError(f"example {example.name}: `{command}` exited {rc}, not {want}:\n{out}")
                lines.append(f"$ {command}")
                lines.extend(out.rstrip("\n").splitlines())
        finally:
            for step in example.after:
                _bash(step, env, cwd)
    return "".join(f"    {line}\n" if line else "\n" for line in lines)


def regions(text: str) -> dict[str, str]:
    """README.md's example regions: name -> the text between the markers (without the blank lines around it)."""
    out: dict[str, str] = {}
    for m in BEGIN.finditer(text):
        end = text.index(END, m.end())
        if m.group(1) in out:
            raise ValueError(f"README.md: example {m.group(1)} marked twice")
        out[m.group(1)] = text[m.end() : end].strip("\n") + "\n"
    return out


def rewrite(text: str, produced: Mapping[str, str]) -> str:
    """README.md with those regions replaced by what the runs produced."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        return m.group(0) if name not in produced else f"<!-- example: {name} -->\n\n{produced[name]}\n{END}"

    return re.sub(r"^<!-- example: ([a-z0-9-]+) -->\n.*?^<!-- /example -->\n", one, text, flags=re.M | re.S)


# Container ids differ from run to run (never a UUID's last group: that follows a `-`), and so does the cgroup
# version of the machine the sandbox runs on (doctor's summary).
_ID = re.compile(r"(?<![-\w])[0-9a-f]{12}(?![-\w])")
_CGROUP = re.compile(r"cgroup v[12]\b")


def normalised(text: str) -> str:
    return _CGROUP.sub("cgroup v<N>", _ID.sub("<id>", text))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.readme", description=__doc__.split("\n\n")[0])
    p.add_argument("--tier", choices=(UNIT, DOCKER, "all"), default="all", help="which examples to run")
    p.add_argument("--check", action="store_true", help="compare with README.md (normalised) instead of writing")
    p.add_argument("names", nargs="*", help="only these examples")
    args = p.parse_args(argv)
    unknown = set(args.names) - set(BY_NAME)
    if unknown:
        p.error(f"no example {' '.join(sorted(unknown))}; the examples are {' '.join(BY_NAME)}")
    chosen = [e for e in EXAMPLES if (not args.names or e.name in args.names) and args.tier in ("all", e.tier)]
    docker_host = os.environ.get("DOCKER_HOST", "")
    if any(e.tier == DOCKER for e in chosen) and not docker_host.startswith("unix://"):
        p.error("the docker examples need the sandbox: DOCKER_HOST=unix://... (make readme sets it)")
    text = README.read_text()
    have = regions(text)
    produced = {e.name: run(e, docker_host) for e in chosen}
    if args.check:
        stale = [n for n, t in produced.items() if normalised(t) != normalised(have.get(n, ""))]
        for n in stale:
            print(f"README.md: example {n} differs from a run now:\n{produced[n]}", file=sys.stderr)
        return 1 if stale else 0
    missing = sorted(set(produced) - set(have))
    if missing:
        p.error(f"README.md has no region for {' '.join(missing)}: add <!-- example: NAME --> ... {END.strip()}")
    # A region that differs only in what varies (container ids) is kept as it is: no churn in `git diff README.md`.
    changed = [n for n, t in produced.items() if normalised(t) != normalised(have.get(n, ""))]
    new = rewrite(text, {n: produced[n] for n in changed})
    if new != text:
        README.write_text(new)
    print(f"README.md: {len(produced)} example(s) run, {len(changed)} rewritten {' '.join(changed)}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

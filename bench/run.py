"""`make bench`: gpupin's costs as ratios against their floors, each pair measured side by side in one run.

  entrypoint  gpupin-entrypoint exec'ing `true`, against the least any such check costs: the same Python start-up
              plus `nvmlInit` (level nvml), plus a bare CUDA-driver probe in a child process under the same
              CUDA_VISIBLE_DEVICES (level cuda).
              Targets: at most 1.3x at nvml, at most 1.2x at cuda.
  watch       `gpupin-entrypoint --watch 5` over a sleeping workload: the watcher's CPU (at most 0.1% of a core)
              and, on the simulated host, how long a planted fault takes to be reported (at most the interval + 1 s)
              (bench/watch_bench.py).
  run         `hostagent run --rm --uuid U IMG true` against `docker run` of the same pin on the same engine: `docker
              run --rm --device nvidia.com/gpu=U IMG true` where hostagent pins through CDI (as its --dry-run line
              says), else `--gpus device=U`. Through the resident agent (a `hostagent serve` of the bench's own:
              the client parses, the agent books and creates; the client imports no docker SDK and opens no NVML),
              target: at most 1.10x; without it (GPUPIN_AGENT=0), at most 1.25x. And what asking the daemon
              whether it serves CDI costs (its /info, its spec files): `hostagent run` against `hostagent run --via`
              the same way.
              Target: at most 1.05x.
  processes   what the cards' processes cost `hostagent run --count 1` (NVML's process lists, each process a
              holder: the phase from `looked` to `attributed`; /proc is read only for what a refusal says), with 64
              real host processes that the fake NVML reports on three of the four cards, against none. Target: at
              most 5 ms more.
  ls          `hostagent ls --json` with 500 pinned containers (created, not started) against
              `docker ps -a --filter label=gpupin.devices`. Target: at most 1.5x.
  agent       the resident agent's memory, at rest and after 100 containers churned, and its answers' times (no
              floor: figures; bench/agent_bench.py).
  swarm       `hostagent ls --swarm --json` on a swarm manager (DOCKER_HOST; `make bench-swarm` starts the
              three-node swarm) running one task per card plus one pending, against the docker CLI commands that
              give the same facts: `docker node ls` then `docker service ps SERVICE`. Target: at most 1.0x.
              Not in the default parts (it needs the swarm).

Runs alternate (A B B A A B ...) so that drift in the machine's load hits both sides alike; each figure is a median.
The environment is the simulated host's (the Makefile's SIMHOST); on a real GPU host, run the `entrypoint` part
with the real driver (no LD_LIBRARY_PATH, no FAKEGPU_TOPOLOGY), as bench/records/real-gpu.md shows. `--engines 20.10 26`
runs the docker parts on each engine's sandbox (tests/sandbox/sandbox.sh env: its address and its own docker CLI)
and prints them side by side; without it they run against DOCKER_HOST with the docker CLI on PATH. `--engines podman`
runs them against the sandboxed podman service (tests/sandbox/podman.sh, `make podman-up`), the floor being `podman
--remote run --device nvidia.com/gpu=U` through the same service; GPUPIN_PODMAN=5 (`make bench PODMAN=5`) picks the
podman 5 service (its figures named podman5).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DOCKER = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
IMAGE = os.environ.get("GPUPIN_BENCH_IMAGE", "gpupin:test")
SANDBOX = REPO / "tests" / "sandbox" / "sandbox.sh"
PODMAN_SANDBOX = REPO / "tests" / "sandbox" / "podman.sh"

# The floor's child: the bare minimum a process must do to learn what cuda:k is (no gpupin code).
BARE_CUDA_PROBE = (
    "import ctypes\n"
    "c = ctypes.CDLL('libcuda.so.1')\n"
    "assert c.cuInit(0) == 0\n"
    "n = ctypes.c_int(); c.cuDeviceGetCount(ctypes.byref(n))\n"
    "for k in range(n.value):\n"
    "    d = ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d), k)\n"
    "    b = ctypes.create_string_buffer(64); c.cuDeviceGetPCIBusId(b, 64, d)\n"
    "    u = (ctypes.c_ubyte * 16)(); c.cuDeviceGetUuid(u, d)\n"
    "    print(k, bytes(u).hex(), b.value.decode())\n"
)
FLOOR_NVML = "import os, pynvml\npynvml.nvmlInit()\nos.execvp('true', ['true'])\n"
FLOOR_CUDA = (
    "import os, subprocess, sys, pynvml\npynvml.nvmlInit()\n"
    f"subprocess.run([sys.executable, '-I', '-S', '-c', {BARE_CUDA_PROBE!r}], check=True, stdout=subprocess.PIPE)\n"
    "os.execvp('true', ['true'])\n"
)


def timed(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} failed ({p.returncode}): {p.stderr.decode()[-500:]}")
    return dt


def side_by_side(a: Callable[[], float], b: Callable[[], float], n: int, warmup: int = 2) -> tuple[float, float]:
    for _ in range(warmup):
        a()
        b()
    xs, ys = [], []
    for i in range(n):
        # A B, then B A: whichever runs second in a pair (warmer caches, or a busier machine) alternates.
        if i % 2:
            ys.append(b())
            xs.append(a())
        else:
            xs.append(a())
            ys.append(b())
    return statistics.median(xs), statistics.median(ys)


class Engine:
    """Where the docker parts run: a daemon's environment (DOCKER_HOST, DOCKER_CONFIG) and its docker CLI."""

    def __init__(self, name: str, env: dict[str, str], docker: str) -> None:
        self.name = name
        self.env = env
        self.docker = docker
        self.cli = [docker]  # the command line of its CLI (podman's: several words)

    @classmethod
    def sandbox(cls, name: str) -> Engine:
        if name == "podman":  # the sandboxed podman service (tests/sandbox/podman.sh); its CLI is `podman --remote`
            return cls.podman()
        out = subprocess.run(
            [str(SANDBOX), "env"],
            env={**os.environ, "GPUPIN_SANDBOX_ENGINE": name},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        env = {**os.environ, "DOCKER_HOST": info["DOCKER_HOST"]}
        if "DOCKER_CONFIG" in info:
            env["DOCKER_CONFIG"] = info["DOCKER_CONFIG"]
        return cls(name, env, info["GPUPIN_SANDBOX_DOCKER"])

    @classmethod
    def podman(cls) -> Engine:
        out = subprocess.run([str(PODMAN_SANDBOX), "env"], capture_output=True, text=True, check=True).stdout
        info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        name = "podman5" if os.environ.get("GPUPIN_PODMAN") == "5" else "podman"
        engine = cls(name, {**os.environ, "DOCKER_HOST": info["DOCKER_HOST"]}, "")
        engine.cli = info["GPUPIN_SANDBOX_PODMAN"].split()
        return engine

    @property
    def prefix(self) -> str:
        return f"[{self.name}] " if self.name else ""


def report(name: str, ours: float, floor: float, target: float, results: dict[str, object], note: str = "") -> None:
    ratio = ours / floor
    verdict = "ok" if ratio <= target else "MISSED"
    print(
        f"{name:<44} {ours * 1000:8.1f} ms vs floor {floor * 1000:8.1f} ms   ratio {ratio:5.2f}x "
        f"(target <= {target}x) {verdict}{f'  ({note})' if note else ''}",
        flush=True,
    )
    results[name] = {
        "ours_ms": round(ours * 1000, 2),
        "floor_ms": round(floor * 1000, 2),
        "ratio": round(ratio, 3),
        "target": target,
        "met": ratio <= target,
        "note": note,
    }


def bench_entrypoint(n: int, results: dict[str, object], expect: str | None) -> None:
    env = dict(os.environ)
    env["GPUPIN_QUIET"] = "1"
    if expect:
        env["GPUPIN_EXPECT"] = expect
    ep = shutil.which("gpupin-entrypoint") or str(BIN / "gpupin-entrypoint")
    py = sys.executable
    # The floor's probe runs under the environment the entrypoint gives its workload, so that both ask the
    # driver about the same cards (cuInit costs ~0.2 s per visible card on a real host).
    check = subprocess.run([ep, "--json", "--verify", "nvml"], env=env, capture_output=True, text=True, check=True)
    floor_env = {**env, **json.loads(check.stdout)["set"]}
    for level, floor_code, target in (("nvml", FLOOR_NVML, 1.3), ("cuda", FLOOR_CUDA, 1.2)):
        ours, floor = side_by_side(
            lambda lv=level: timed([ep, "--verify", lv, "true"], env),  # type: ignore[misc]
            lambda fc=floor_code: timed([py, "-c", fc], floor_env),  # type: ignore[misc]
            n,
        )
        report(f"entrypoint --verify {level} (exec true)", ours, floor, target, results)


def _first_uuid() -> str:
    """The simulated host's card 1; on a real host (no FAKEGPU_TOPOLOGY: the gpu tier's run) NVML's last card."""
    if not os.environ.get("FAKEGPU_TOPOLOGY"):
        import pynvml

        pynvml.nvmlInit()
        try:
            return str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(pynvml.nvmlDeviceGetCount() - 1)))
        finally:
            pynvml.nvmlShutdown()
    topo = json.loads(Path(os.environ["FAKEGPU_TOPOLOGY"]).read_text())
    return str(topo["gpus"][1]["uuid"])


# hostagent.mark's phases, in order, and what the time up to each one is spent on.
PHASES = (
    ("main", "interpreter start-up and hostagent's CLI import"),
    ("parsed", "argument parsing"),
    ("asking", "through the agent: the agent found, the request put in JSON"),
    ("connected", "the API version (the daemon's /_ping; NVML is read on a thread from here)"),
    ("locked", "the ledger's lock (local, then the daemon's)"),
    ("cards", "NVML: what is left of the cards' read once the lock is held"),
    ("looked", "the ledger read"),
    ("attributed", "the cards' processes, attributed to containers or the host"),
    ("created", "the create call (through the agent: the request, its look, lock and create)"),
    ("attached", "attaching the streams, registering the wait"),
    ("started", "the start call (the runtime and its hook run here)"),
    ("exited", "the workload, until its exit is known"),
    ("done", "after the exit (--rm's removal etc.)"),
)


def traced(argv: Sequence[str], env: dict[str, str], path: Path) -> dict[str, float]:
    """One run with GPUPIN_TRACE: seconds from the spawn to each phase, and to the process's end ("end")."""
    path.unlink(missing_ok=True)
    t0 = time.time()
    timed(argv, {**env, "GPUPIN_TRACE": str(path)})
    end = time.time()
    marks = {name: float(at) - t0 for name, at in (line.split() for line in path.read_text().splitlines())}
    return {**marks, "end": end - t0}


def breakdown(runs: list[dict[str, float]], docker_total: float, results: dict[str, object], prefix: str = "") -> None:
    """Median time spent in each phase (from the mark before it), against docker run's whole run."""
    print(
        f"  {prefix}where hostagent run's time goes (medians of {len(runs)} traced runs; docker run takes "
        f"{docker_total * 1000:.1f} ms in all):",
        flush=True,
    )
    rows: dict[str, float] = {}
    before = "spawn"
    for name, what in (*PHASES, ("end", "process exit")):
        spans = [
            r[name] - (r[before] if before != "spawn" else 0.0)
            for r in runs
            if name in r and (before == "spawn" or before in r)
        ]
        if spans:
            rows[name] = statistics.median(spans)
            print(f"    {rows[name] * 1000:7.1f} ms  {name:<10} {what}", flush=True)
            before = name
    results[f"{prefix}hostagent run phases (ms)"] = {k: round(v * 1000, 2) for k, v in rows.items()}


def bench_imports(n: int, results: dict[str, object]) -> None:
    """What importing costs, against a bare interpreter: hostagent's CLI, and the docker SDK it needs to create."""
    py = sys.executable
    floor = statistics.median(timed([py, "-c", "pass"]) for _ in range(n))
    print(f"  imports (medians of {n}, beyond the interpreter's own {floor * 1000:.1f} ms):", flush=True)
    out = {}
    for what, code in (("gpupin.hostagent.cli", "import gpupin.hostagent.cli"), ("docker (the SDK)", "import docker")):
        cost = statistics.median(timed([py, "-c", code]) for _ in range(n)) - floor
        out[what] = round(cost * 1000, 2)
        print(f"    {cost * 1000:7.1f} ms  import {what}", flush=True)
    results["imports (ms beyond the interpreter)"] = out


def bench_run(n: int, results: dict[str, object], engine: Engine) -> None:
    uuid = _first_uuid()
    direct = {**engine.env, "GPUPIN_AGENT": "0"}  # today's path, whatever agent this host runs
    ha = [str(BIN / "hostagent"), "run", "--rm", "--uuid", uuid, IMAGE, "--quiet", "true"]
    line = subprocess.run(
        [str(BIN / "hostagent"), "run", "--dry-run", "--uuid", uuid, IMAGE],
        env=direct,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    via, pin = (
        ("cdi", ["--device", f"nvidia.com/gpu={uuid}"])
        if "--device nvidia.com/gpu=" in line
        else ("nvidia", ["--gpus", f"device={uuid}"])
    )
    dk = [*engine.cli, "run", "--rm", *pin, IMAGE, "--quiet", "true"]
    from bench.agent_bench import ResidentAgent

    agent = ResidentAgent(engine.env, str(BIN / "hostagent"))
    trace = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpupin-bench-trace-{os.getpid()}"
    try:
        through = {**engine.env, "GPUPIN_AGENT_SOCKET": agent.socket}
        ours, floor = side_by_side(lambda: timed(ha, through), lambda: timed(dk, engine.env), n)
        report(
            f"{engine.prefix}hostagent run (agent) vs docker run",
            ours,
            floor,
            1.10,
            results,
            f"through hostagent serve; docker run {pin[0]} ...",
        )
        agent_total = floor
        ours, floor = side_by_side(lambda: timed(ha, direct), lambda: timed(dk, engine.env), n)
        report(
            f"{engine.prefix}hostagent run vs docker run",
            ours,
            floor,
            1.25,
            results,
            f"without the agent; docker run {pin[0]} ...",
        )
        docker_total = floor
        forced = [*ha[:2], "--via", via, *ha[2:]]
        ours, floor = side_by_side(lambda: timed(ha, direct), lambda: timed(forced, direct), n)
        report(
            f"{engine.prefix}hostagent run vs run --via (asking for CDI)", ours, floor, 1.05, results, f"--via {via}"
        )
        breakdown([traced(ha, through, trace) for _ in range(n)], agent_total, results, f"{engine.prefix}(agent) ")
        breakdown([traced(ha, direct, trace) for _ in range(n)], docker_total, results, engine.prefix)
    finally:
        trace.unlink(missing_ok=True)
        agent.close()


def bench_processes(n: int, results: dict[str, object], engine: Engine, count: int = 64) -> None:
    """`run --count 1` with `count` host processes on the cards (FAKEGPU_PROCESSES) against none: the processes
    phase's median each, and the difference."""
    topo = json.loads(Path(os.environ["FAKEGPU_TOPOLOGY"]).read_text())
    others = [g["uuid"] for i, g in enumerate(topo["gpus"]) if i != 1]  # card 1 stays free for the run
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    listed, empty = tmp / f"gpupin-bench-procs-{os.getpid()}.json", tmp / f"gpupin-bench-none-{os.getpid()}.json"
    trace = tmp / f"gpupin-bench-trace-procs-{os.getpid()}"
    try:
        listed.write_text(
            json.dumps(
                {
                    u: [{"pid": p.pid, "used_memory_mib": 64} for p in sleepers[k :: len(others)]]
                    for k, u in enumerate(others)
                }
            )
        )
        empty.write_text("{}")
        ha = [str(BIN / "hostagent"), "run", "--rm", "--count", "1", IMAGE, "--quiet", "true"]

        def phase(path: Path) -> float:
            marks = traced(ha, {**engine.env, "FAKEGPU_PROCESSES": str(path)}, trace)
            return marks["attributed"] - marks["looked"]

        ours, floor = side_by_side(lambda: phase(listed), lambda: phase(empty), n)
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
        for f in (listed, empty, trace):
            f.unlink(missing_ok=True)
    extra = (ours - floor) * 1000
    verdict = "ok" if extra <= 5 else "MISSED"
    print(
        f"{engine.prefix + f'run --count 1: {count} processes on the cards':<44} {ours * 1000:8.2f} ms vs none "
        f"{floor * 1000:8.2f} ms   {extra:+.2f} ms (target <= +5 ms) {verdict}",
        flush=True,
    )
    results[f"{engine.prefix}run --count 1: {count} processes on the cards"] = {
        "ours_ms": round(ours * 1000, 3),
        "floor_ms": round(floor * 1000, 3),
        "extra_ms": round(extra, 3),
        "target_extra_ms": 5,
        "met": extra <= 5,
    }


def bench_ls(n: int, results: dict[str, object], engine: Engine, containers: int = 500) -> None:
    import docker

    api = docker.APIClient(base_url=engine.env["DOCKER_HOST"], version="auto", timeout=300)
    topo = json.loads(Path(os.environ["FAKEGPU_TOPOLOGY"]).read_text())
    uuids = [g["uuid"] for g in topo["gpus"]]
    label = {"gpupin.bench": "ls"}
    old = api.containers(all=True, filters={"label": "gpupin.bench=ls"})
    t0 = time.perf_counter()
    for i in range(len(old), containers):
        api.create_container(
            IMAGE,
            ["true"],
            labels={**label, "gpupin.devices": uuids[i % len(uuids)]},
            host_config=api.create_host_config(network_mode="none"),
        )
    print(f"(created {containers - len(old)} pinned containers in {time.perf_counter() - t0:.1f} s)", flush=True)
    try:
        env = engine.env
        ha = [str(BIN / "hostagent"), "ls", "--json"]
        dk = [*engine.cli, "ps", "-a", "--filter", "label=gpupin.devices"]
        ours, floor = side_by_side(lambda: timed(ha, env), lambda: timed(dk, env), n)
        report(f"{engine.prefix}hostagent ls --json vs docker ps ({containers} pinned)", ours, floor, 1.5, results)
    finally:
        for c in api.containers(all=True, filters={"label": "gpupin.bench=ls"}):
            api.remove_container(c["Id"], force=True)


def bench_swarm(n: int, results: dict[str, object]) -> None:
    env = dict(os.environ)
    ha = [str(BIN / "hostagent"), "ls", "--swarm", "--json"]
    listing = json.loads(subprocess.run(ha, env=env, capture_output=True, text=True, check=True).stdout)
    cards = listing["summary"]["resources"]
    service = "gpupin-bench-swarm"
    subprocess.run([DOCKER, "service", "rm", service], env=env, capture_output=True)
    subprocess.run(
        [
            DOCKER,
            "service",
            "create",
            "-d",
            "--name",
            service,
            "--replicas",
            str(cards + 1),
            "--generic-resource",
            "GPU=1",
            "--no-resolve-image",
            "--restart-condition",
            "none",
            "--entrypoint",
            "sleep",
            IMAGE,
            "infinity",
        ],
        env=env,
        capture_output=True,
        check=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            summary = json.loads(subprocess.run(ha, env=env, capture_output=True, text=True, check=True).stdout)
            if summary["summary"]["held"] == cards and summary["summary"]["pending"] == 1:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: {cards} tasks did not all start, nor one wait: {summary['summary']}")
            time.sleep(1)
        print(
            f"(a swarm of {listing['summary']['nodes']} nodes, {cards} cards: {cards} tasks running, one pending)",
            flush=True,
        )
        node_ls, service_ps = [DOCKER, "node", "ls"], [DOCKER, "service", "ps", service]
        ours, floor = side_by_side(lambda: timed(ha, env), lambda: timed(node_ls, env) + timed(service_ps, env), n)
        report(f"hostagent ls --swarm --json vs node ls + service ps ({cards + 1} tasks)", ours, floor, 1.0, results)
    finally:
        subprocess.run([DOCKER, "service", "rm", service], env=env, capture_output=True)


def side_by_side_table(results: dict[str, object], engines: Sequence[str]) -> None:
    """The docker parts of each engine in one table: a row per measure, ours/floor/ratio per engine."""
    rows: dict[str, dict[str, str]] = {}
    for key, value in results.items():
        if key.startswith("[") and isinstance(value, dict) and "ratio" in value:
            engine, _, what = key[1:].partition("] ")
            note = f" ({value['note']})" if value.get("note") else ""
            rows.setdefault(what, {})[engine] = (
                f"{value['ours_ms']:.1f} / {value['floor_ms']:.1f} ms = {value['ratio']:.2f}x{note}"
            )
        elif key.startswith("[") and isinstance(value, dict) and "cell" in value:  # a figure without a floor
            engine, _, what = key[1:].partition("] ")
            rows.setdefault(what, {})[engine] = str(value["cell"])
    print("\n" + " | ".join(["what", *(f"Engine {e}" for e in engines)]))
    for what, cells in rows.items():
        print(" | ".join([what, *(cells.get(e, "-") for e in engines)]))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "parts",
        nargs="*",
        metavar="PART",
        help="entrypoint, watch, run, processes, ls, agent (default: these six), swarm",
    )
    p.add_argument("-n", type=int, default=30, help="measured runs per side (entrypoint; a third for docker parts)")
    p.add_argument("--expect", help="GPUPIN_EXPECT for the entrypoint part (default: the topology's card 1)")
    p.add_argument("--watch-interval", type=float, default=5.0, metavar="S", help="the watch part's --watch (5)")
    p.add_argument(
        "--watch-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="how long the watch part measures the watcher's CPU (60)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument(
        "--engines",
        metavar="'ENGINE ...'",
        help="run the docker parts on these engines' sandboxes ('20.10 26'), side by side",
    )
    args = p.parse_args(argv)
    args.parts = args.parts or ["entrypoint", "watch", "run", "processes", "ls", "agent", "record"]
    known = {"entrypoint", "watch", "run", "processes", "ls", "agent", "record", "swarm"}
    if set(args.parts) - known:
        p.error(f"unknown part(s): {' '.join(sorted(set(args.parts) - known))}")
    sys.path.insert(0, str(REPO))  # bench/ as a package of the checkout (its other modules), as mypy reads it
    results: dict[str, object] = {}
    print(f"bench: {os.cpu_count()} CPU(s), python {sys.version.split()[0]}, medians of interleaved runs", flush=True)
    expect = args.expect or (_first_uuid() if os.environ.get("FAKEGPU_TOPOLOGY") else None)
    if "entrypoint" in args.parts:
        bench_entrypoint(args.n, results, expect)
    if "watch" in args.parts:
        from bench.watch_bench import bench_watch

        bench_watch(results, expect, args.watch_interval, args.watch_seconds, max(args.n // 5, 3))
    names = args.engines.replace(",", " ").split() if args.engines else []
    engines = [Engine.sandbox(e) for e in names] if names else [Engine("", dict(os.environ), DOCKER)]
    for engine in engines:
        if "run" in args.parts:
            bench_run(max(args.n // 3, 5), results, engine)
        if "processes" in args.parts:
            bench_processes(max(args.n // 3, 5), results, engine)
        if "ls" in args.parts:
            bench_ls(max(args.n // 3, 5), results, engine)
        if "agent" in args.parts:
            from bench.agent_bench import bench_agent

            bench_agent(results, engine.env, str(BIN / "hostagent"), IMAGE, engine.prefix, n=args.n)
    if "run" in args.parts:
        bench_imports(max(args.n // 3, 5), results)
    if "record" in args.parts:
        from bench.record_bench import bench_record

        bench_record(results, str(BIN / "hostagent"), n=max(args.n // 6, 5))
    if "swarm" in args.parts:
        bench_swarm(max(args.n // 3, 5), results)
    if len(engines) > 1:
        side_by_side_table(results, [e.name for e in engines])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    missed = [k for k, v in results.items() if isinstance(v, dict) and v.get("met") is False]
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())

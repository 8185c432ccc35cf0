"""What the authorization plugin costs a `docker run` (docs/authz.md, docs/benchmarks.md): on a sandboxed engine,
`hostagent authz` and the agent beside it, the plugin turned on and off (daemon.json, SIGHUP) in alternating blocks,
and in each block `docker run --rm` of a container that reaches no card (the plugin answers alone) and of one that
pins a free card (the plugin asks the agent; `grants = false` lets the plain create through). Medians side by side.

    make bench-authz ENGINES="20.10 26"      (the sandbox and the simulated host's environment come from make)

`--calls SOCKET` times the plugin's own answers instead, on a plugin already serving there: each message a `docker
run` makes the daemon send (the request and the answer of a ping, a create that reaches no card, one that pins a
card, a start), over one kept-open connection as the daemon's client keeps it. Their sum bounds what the plugin adds.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOSTAGENT = str(Path(sys.executable).parent / "hostagent")
IMAGE = "gpupin:test"
POLICY = '[enforce]\nmode = "on"\ngrants = false\n'


def sandbox(engine: str) -> dict[str, str]:
    out = subprocess.run(
        [str(REPO / "tests/sandbox/sandbox.sh"), "env"],
        env={**os.environ, "GPUPIN_SANDBOX_ENGINE": engine},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait(what: str, ok: Callable[[], bool], limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"authz_bench: {what} did not happen within {limit:g}s")
        time.sleep(0.05)


class Door:
    def __init__(self, engine: str, tmp: Path) -> None:
        info = sandbox(engine)
        self.run = Path(info["GPUPIN_SANDBOX_RUN"])
        self.env = {
            **os.environ,
            "DOCKER_HOST": info["DOCKER_HOST"],
            "GPUPIN_AGENT_SOCKET": str(tmp / "agent.sock"),
            "GPUPIN_LOCK_DIR": str(tmp),  # never the host's /run/gpupin
        }
        self.docker = info["GPUPIN_SANDBOX_DOCKER"]
        policy = tmp / "policy.toml"
        policy.write_text(POLICY)
        self.config = json.loads((self.run / "daemon.json").read_text())
        self.procs = [
            subprocess.Popen(
                [HOSTAGENT, "serve", "--socket", str(tmp / "agent.sock"), "--http", "none", "--record", "none",
                 "--policy", str(policy)],
                env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ),
            subprocess.Popen(
                [HOSTAGENT, "authz", "--socket", str(self.run / "plugins/gpupin.sock"),
                 "--agent-socket", str(tmp / "agent.sock"), "--policy", str(policy)],
                env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ),
        ]  # fmt: skip
        wait("the agent and the plugin to listen", lambda: (tmp / "agent.sock").exists() and self.socket_ready())

    def socket_ready(self) -> bool:
        return (self.run / "plugins/gpupin.sock").exists()

    def plugin(self, on: bool) -> None:
        log = self.run / "dockerd.log"
        before = log.read_text(errors="replace").count("Reloaded configuration")
        config = dict(self.config)
        if on:
            config["authorization-plugins"] = ["gpupin"]
        (self.run / "daemon.json").write_text(json.dumps(config))
        os.kill(int((self.run / "dockerd.pid").read_text()), signal.SIGHUP)
        wait("the daemon to reload", lambda: log.read_text(errors="replace").count("Reloaded configuration") > before)

    def timed(self, *args: str) -> float:
        t0 = time.perf_counter()
        r = subprocess.run([self.docker, "run", "--rm", *args], env=self.env, capture_output=True, text=True)
        took = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"authz_bench: docker run {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
        return took * 1000

    def close(self) -> None:
        self.plugin(False)
        for p in self.procs:
            p.terminate()
            p.wait(10)


def bench(engine: str, blocks: int, n: int, gpu: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="gpupin-authz-bench-") as tmp:
        door = Door(engine, Path(tmp))
        times: dict[tuple[bool, str], list[float]] = {}
        try:
            for block in range(blocks):
                on = block % 2 == 0
                door.plugin(on)
                for _ in range(n):
                    plain = door.timed("--entrypoint", "true", IMAGE)
                    pinned = door.timed("--gpus", f"device={gpu}", "--entrypoint", "true", IMAGE)
                    times.setdefault((on, "plain"), []).append(plain)
                    times.setdefault((on, "gpu"), []).append(pinned)
        finally:
            door.close()
    out: dict[str, object] = {"engine": engine}
    for what in ("plain", "gpu"):
        with_it, without = statistics.median(times[True, what]), statistics.median(times[False, what])
        out[what] = {"on_ms": with_it, "off_ms": without, "added_ms": with_it - without, "n": len(times[True, what])}
        print(
            f"Engine {engine}, docker run ({'no card' if what == 'plain' else 'a pinned free card'}): plugin on "
            f"{with_it:.1f} ms, off {without:.1f} ms, added {with_it - without:+.1f} ms "
            f"(medians of {len(times[True, what])} each)"
        )
    return out


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("plugin")
        self.path = path

    def connect(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def _message(method: str, uri: str, body: object | None = None, answer: bool = False) -> bytes:
    """A message as moby's pkg/authorization sends it (RequestUri, the body base64 in RequestBody)."""
    msg: dict[str, object] = {"User": "", "RequestMethod": method, "RequestUri": uri, "RequestHeaders": {}}
    if body is not None:
        msg["RequestHeaders"] = {"Content-Type": "application/json"}
        msg["RequestBody"] = base64.b64encode(json.dumps(body).encode()).decode()
    if answer:  # a create's answer names the container (the plugin reads it: docs/authz.md, Grants)
        created = uri.split("?")[0].endswith("/containers/create")
        msg["ResponseStatusCode"], msg["ResponseHeaders"] = (201 if created else 200), {}
        if created:
            msg["ResponseBody"] = base64.b64encode(json.dumps({"Id": "c0" * 32, "Warnings": []}).encode()).decode()
    return json.dumps(msg).encode()


def calls(socket_path: str, n: int, gpu: str) -> dict[str, object]:
    """Median and 99th percentile of each message's round trip, in ms; and their sum over one `docker run`."""
    create = {"Image": IMAGE, "Entrypoint": ["true"], "HostConfig": {}}
    pinned = {**create, "HostConfig": {"DeviceRequests": [{"Driver": "", "Count": 0, "DeviceIDs": [gpu],
                                                           "Capabilities": [["gpu"]]}]}}  # fmt: skip
    run = [  # what the CLI's `docker run --rm` sends, each asked before (AuthZReq) and after (AuthZRes)
        ("ping", "HEAD", "/_ping", None),
        ("create, no card", "POST", "/v1.41/containers/create", create),
        ("attach", "POST", "/v1.41/containers/c0ffee/attach?stream=1&stdout=1&stderr=1", None),
        ("wait", "POST", "/v1.41/containers/c0ffee/wait?condition=removed", None),
        ("start", "POST", "/v1.41/containers/c0ffee/start", None),
    ]
    conn = _Unix(socket_path)
    out: dict[str, object] = {}

    def timed(what: str, path: str, body: bytes) -> float:
        took = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            took.append((time.perf_counter() - t0) * 1000)
        took.sort()
        med, p99 = statistics.median(took), took[min(len(took) - 1, int(len(took) * 0.99))]
        out[what] = {"median_ms": med, "p99_ms": p99, "n": n}
        print(f"  {what}: median {med:.3f} ms, p99 {p99:.3f} ms (n={n})")
        return med

    print(f"the plugin on {socket_path}, each message's round trip:")
    total = 0.0
    for what, method, uri, body in run:
        total += timed(f"AuthZReq {what}", "/AuthZPlugin.AuthZReq", _message(method, uri, body))
        total += timed(f"AuthZRes {what}", "/AuthZPlugin.AuthZRes", _message(method, uri, body, answer=True))
    pin = timed("AuthZReq create, a pinned card (the agent asked)", "/AuthZPlugin.AuthZReq",
                _message("POST", "/v1.41/containers/create", pinned))  # fmt: skip
    pin += timed("AuthZRes create, a pinned card (the agent told)", "/AuthZPlugin.AuthZRes",
                 _message("POST", "/v1.41/containers/create", pinned, answer=True))  # fmt: skip
    no_card = [out[f"AuthZ{x} create, no card"] for x in ("Req", "Res")]
    out["docker_run_no_card_ms"] = total
    out["docker_run_pinned_ms"] = total - sum(float(x["median_ms"]) for x in no_card if isinstance(x, dict)) + pin
    print(f"sum over one docker run's {2 * len(run)} messages: no card {total:.2f} ms, a pinned card "
          f"{out['docker_run_pinned_ms']:.2f} ms")  # fmt: skip
    return out


def under_load(socket_path: str, threads: int, n: int) -> dict[str, object]:
    """`threads` connections at once, each sending a ping's AuthZReq `n` times (as a daemon serving that many
    clients does): each call's round trip, median and 99th percentile."""
    import threading

    took: list[float] = []
    lock = threading.Lock()
    body = _message("HEAD", "/_ping")

    def one() -> None:
        conn, mine = _Unix(socket_path), []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.request("POST", "/AuthZPlugin.AuthZReq", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            mine.append((time.perf_counter() - t0) * 1000)
        with lock:
            took.extend(mine)

    workers = [threading.Thread(target=one) for _ in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    took.sort()
    med, p99 = statistics.median(took), took[min(len(took) - 1, int(len(took) * 0.99))]
    print(f"under load: {threads} connections at once, {len(took)} calls in {wall:.2f} s ({len(took) / wall:.0f}/s): "
          f"median {med:.3f} ms, p99 {p99:.3f} ms, max {took[-1]:.3f} ms")  # fmt: skip
    return {"threads": threads, "calls": len(took), "per_s": len(took) / wall, "median_ms": med, "p99_ms": p99,
            "max_ms": took[-1]}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="20.10")
    p.add_argument("--blocks", type=int, default=8, help="alternating blocks, plugin on first")
    p.add_argument("-n", type=int, default=5, help="runs of each kind per block")
    p.add_argument("--gpu", default="3", help="a free card of the simulated host to pin")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--calls", metavar="SOCKET", help="time the messages of the plugin serving on SOCKET instead")
    p.add_argument("--calls-n", type=int, default=2000, help="round trips of each message (--calls)")
    p.add_argument("--calls-threads", type=int, default=0, help="then that many connections at once (--calls)")
    args = p.parse_args()
    if args.calls:
        results: list[dict[str, object]] = [calls(args.calls, args.calls_n, args.gpu)]
        if args.calls_threads:
            results.append(under_load(args.calls, args.calls_threads, args.calls_n // args.calls_threads or 1))
    else:
        results = [bench(e, args.blocks, args.n, args.gpu) for e in args.engines.split()]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

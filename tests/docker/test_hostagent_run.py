"""`hostagent run` as a drop-in for `docker run`, on the sandbox: a terminal session driven through a real pty,
piped input, every docker run option landing in the created container, signals as docker run handles them, and
the options that would hand out other GPUs refused by name."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.spawn import default_signals
from tests.support.wait import wait_for

# Every engine runs these (`hostagent run`'s whole path on the engine: create, attach, start, signals, exit;
# what hostagent refuses before it asks the daemon, `agent_any`, once): docs/testing.md, The engines.
pytestmark = pytest.mark.per_engine

RTX = uuids("mixed-4")[1]


@pytest.fixture(params=["direct", "agent"])
def way(request: pytest.FixtureRequest, agent: Agent) -> Iterator[str]:
    """The run on its own, or through a resident agent (which books and creates; the run attaches, starts and
    follows): the terminal, the input, the options, the signals and the exit codes are the same."""
    if request.param == "direct":
        yield request.param
        return
    resident = Resident(agent.env)
    trace = resident.dir / "trace"
    agent.env.update(GPUPIN_AGENT_SOCKET=resident.socket, GPUPIN_TRACE=str(trace))
    try:
        yield request.param
        marks = trace.read_text().split()
        assert "created" in marks and "cards" not in marks  # the agent booked: the run read no NVML itself
    finally:
        trace.unlink(missing_ok=True)
        resident.close()


def _terminal_of_its_own() -> None:
    """In the child: the pty as its controlling terminal, and the signals a shell gives a foreground job."""
    default_signals()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """hostagent run in a pseudo-terminal, typed at as a person would."""

    def __init__(self, agent: Agent, *args: str, rows: int = 33, cols: int = 101) -> None:
        self.master, slave = pty.openpty()
        self.set_size(rows, cols, slave)
        self.proc = subprocess.Popen(
            agent.argv("run", *args),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=agent.env,
            start_new_session=True,
            preexec_fn=_terminal_of_its_own,
        )
        os.close(slave)
        self.seen = b""

    def set_size(self, rows: int, cols: int, fd: int | None = None) -> None:
        fcntl.ioctl(self.master if fd is None else fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def expect(self, token: bytes, timeout: float = 30) -> bool:
        return self._read_until(lambda: token in self.seen, timeout)

    def expect_count(self, token: bytes, count: int, timeout: float = 30) -> bool:
        return self._read_until(lambda: self.seen.count(token) >= count, timeout)

    def _read_until(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                try:
                    self.seen += os.read(self.master, 4096)
                except OSError:
                    break
        return done()

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


def test_an_interactive_shell_in_a_pinned_container(agent: Agent, way: str) -> None:
    term = Terminal(agent, "-it", "--rm", "--gpu", "1", TEST_IMAGE, "bash", "--norc", "-i")
    try:
        assert term.expect(b"# "), term.seen
        # the pin was proven before the shell started, and the shell sees this terminal's size
        assert RTX.encode() in term.seen
        term.type("stty size; echo sum=$((40+2)) $CUDA_VISIBLE_DEVICES\r")
        assert term.expect(b"sum=42 0"), term.seen
        assert b"33 101" in term.seen
        term.set_size(40, 120)  # the kernel signals SIGWINCH to hostagent, which resizes the container's TTY
        # The daemon applies a resize when it gets to it (a busy one took seconds in CI): ask until it has. The shell
        # answers meanwhile: hostagent asks for the resize on a thread, never from the output loop.
        resized = False
        deadline = time.monotonic() + 30
        while not resized and time.monotonic() < deadline:
            asked = term.seen.count(b"stty size")
            term.type("stty size\r")
            assert term.expect_count(b"stty size", asked + 1), term.seen  # the echo: the terminal is alive
            resized = term.expect(b"40 120", timeout=0.5)
        assert resized, term.seen
        term.type("exit 3\r")
        assert term.proc.wait(30) == 3
    finally:
        term.close()
    assert agent.containers() == []


def test_piped_input_reaches_the_workload_with_i_and_not_without(agent: Agent, way: str) -> None:
    r = subprocess.run(
        agent.argv("run", "-i", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "sh"),
        input="echo hi-from-stdin\nexit 5\n",
        env=agent.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (r.returncode, r.stdout) == (5, "hi-from-stdin\n"), r.stderr
    r = subprocess.run(
        agent.argv("run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "sh", "-c", "cat; echo end"),
        input="not forwarded\n",
        env=agent.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (r.returncode, r.stdout) == (0, "end\n"), r.stderr


def test_it_without_a_terminal_is_refused_before_anything_is_created(agent_any: Agent) -> None:
    r = subprocess.run(
        agent_any.argv("run", "-it", "--gpu", "1", TEST_IMAGE),
        input="",
        env=agent_any.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 64 and "the input is not a TTY" in r.stderr
    assert agent_any.containers() == []


def _blocked(pid: int, tid: int) -> int:
    with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as fh:
        return int(next(ln.split()[1] for ln in fh if ln.startswith("SigBlk:")), 16)


def test_only_the_main_thread_takes_the_signals_hostagent_handles(agent: Agent) -> None:
    # Python runs handlers in the main thread, when it wakes: a Ctrl-C or a resize that the kernel handed to a
    # helper thread would wait for the container's next output. So every helper blocks them.
    term = Terminal(agent, "-it", "--rm", "--gpu", "1", TEST_IMAGE, "bash", "--norc", "-i")
    try:
        assert term.expect(b"# "), term.seen
        pid = term.proc.pid
        handled = sum(1 << (s - 1) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGWINCH))
        helpers = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        assert len(helpers) >= 2, helpers  # at least the exit waiter and the stdin pump
        assert _blocked(pid, pid) & handled == 0
        assert all(_blocked(pid, tid) & handled == handled for tid in helpers)
        term.type("exit 0\r")
        assert term.proc.wait(30) == 0
    finally:
        term.close()


def inspect(agent: Agent, cid: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(agent.sandbox.docker("inspect", cid, check=True).stdout)[0]
    return info


@pytest.mark.needs("gpus", "run-options")  # --gpu-capabilities: the nvidia driver's request
def test_every_docker_run_option_lands_in_the_created_container(agent: Agent, way: str) -> None:
    r = agent(
        "run",
        "-d",
        "--gpu",
        "1",
        "--gpu-capabilities",
        "compute,utility",
        "-p",
        "127.0.0.1:18080:80/tcp",
        "-p",
        "9000",
        "--cpus",
        "1.5",
        "--memory",
        "512m",
        "--memory-swap",
        "1g",
        "--device",
        "/dev/null:/dev/mynull:rw",
        "--ulimit",
        "nofile=1024:2048",
        "--ulimit",
        "core=0",
        "--cap-add",
        "SYS_PTRACE",
        "--cap-drop",
        "MKNOD",
        "--security-opt",
        "no-new-privileges",
        "--runtime",
        "runc",
        "--restart",
        "on-failure:3",
        "--init",
        "--hostname",
        "trainer",
        "--add-host",
        "db:10.1.2.3",
        "--mount",
        "type=tmpfs,target=/scratch",
        "--mount",
        "type=volume,source=gpupin-test-vol,target=/vol,readonly",
        "--tmpfs",
        "/cache:size=64m",
        "--read-only",
        "--group-add",
        "video",
        "--platform",
        "linux/amd64",
        "--stop-timeout",
        "7",
        "--sig-proxy=false",
        TEST_IMAGE,
        "sleep",
        "60",
    )
    assert r.returncode == 0, r.stderr
    info = inspect(agent, r.stdout.strip())
    agent.sandbox.docker("rm", "-f", info["Id"])
    agent.sandbox.docker("volume", "rm", "gpupin-test-vol")
    host, config = info["HostConfig"], info["Config"]
    assert host["DeviceRequests"] == [
        {
            "Driver": "nvidia",
            "Count": 0,
            "DeviceIDs": [RTX],
            "Capabilities": [["gpu", "compute", "utility"]],
            "Options": {},
        }
    ]
    assert host["PortBindings"] == {
        "80/tcp": [{"HostIp": "127.0.0.1", "HostPort": "18080"}],
        "9000/tcp": [{"HostIp": "", "HostPort": ""}],
    }
    assert set(config["ExposedPorts"]) == {"80/tcp", "9000/tcp"}
    assert (host["NanoCpus"], host["Memory"], host["MemorySwap"]) == (1_500_000_000, 512 << 20, 1 << 30)
    assert host["Devices"] == [{"PathOnHost": "/dev/null", "PathInContainer": "/dev/mynull", "CgroupPermissions": "rw"}]
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {"nofile": (1024, 2048), "core": (0, 0)}
    assert (host["CapAdd"], host["CapDrop"], host["SecurityOpt"]) == (["SYS_PTRACE"], ["MKNOD"], ["no-new-privileges"])
    assert (host["Runtime"], host["RestartPolicy"], host["Init"]) == (
        "runc",
        {"Name": "on-failure", "MaximumRetryCount": 3},
        True,
    )
    assert host["ExtraHosts"] == ["db:10.1.2.3"] and host["Tmpfs"] == {"/cache": "size=64m"}
    assert [(m["Type"], m["Target"], m.get("ReadOnly", False)) for m in host["Mounts"]] == [
        ("tmpfs", "/scratch", False),
        ("volume", "/vol", True),
    ]
    assert (host["ReadonlyRootfs"], host["GroupAdd"]) == (True, ["video"])
    assert (config["Hostname"], config["StopTimeout"]) == ("trainer", 7)


@pytest.mark.needs("run-options")
def test_namespace_resource_and_logging_options_land_in_the_created_container(agent: Agent) -> None:
    r = agent(
        "run",
        "-d",
        "--gpu",
        "1",
        "--pid",
        "host",
        "--userns",
        "host",
        "--cgroupns",
        "private",
        "--dns",
        "10.0.0.2",
        "--dns-search",
        "example.test",
        "--dns-option",
        "ndots:2",
        "--domainname",
        "example.test",
        "--sysctl",
        "net.core.somaxconn=1024",
        "--log-driver",
        "json-file",
        "--log-opt",
        "max-size=10m",
        "--log-opt",
        "max-file=2",
        "--cpuset-cpus",
        "0",
        "-c",
        "512",
        "--cpu-period",
        "100000",
        "--cpu-quota",
        "50000",
        "-m",
        "256m",
        "--memory-reservation",
        "128m",
        "--oom-score-adj",
        "100",
        "--pids-limit",
        "64",
        "--stop-signal",
        "SIGINT",
        "-P",
        "-l",
        "team=ml",
        TEST_IMAGE,
        "sleep",
        "60",
    )
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    try:
        info = inspect(agent, cid)
        inside = agent.sandbox.docker(
            "exec", cid, "sh", "-c", "cat /etc/resolv.conf /proc/sys/net/core/somaxconn", check=True
        ).stdout
    finally:
        agent.sandbox.docker("rm", "-f", cid)
    host, config = info["HostConfig"], info["Config"]
    assert (host["PidMode"], host["UsernsMode"], host["CgroupnsMode"]) == ("host", "host", "private")
    assert (host["Dns"], host["DnsSearch"], host["DnsOptions"]) == (["10.0.0.2"], ["example.test"], ["ndots:2"])
    assert host["Sysctls"] == {"net.core.somaxconn": "1024"}
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}}
    assert (host["CpusetCpus"], host["CpuShares"], host["CpuPeriod"], host["CpuQuota"]) == ("0", 512, 100000, 50000)
    assert (host["Memory"], host["MemoryReservation"]) == (256 << 20, 128 << 20)
    assert (host["OomScoreAdj"], host["PidsLimit"], host["PublishAllPorts"]) == (100, 64, True)
    assert (config["Domainname"], config["StopSignal"], config["Labels"]["team"]) == ("example.test", "SIGINT", "ml")
    assert "nameserver 10.0.0.2" in inside and "options ndots:2" in inside and inside.rstrip().endswith("1024")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpus", "all"], "hostagent run does not take --gpus"),
        (["--privileged"], "hostagent run does not take --privileged"),
        (
            ["--device", "/dev/nvidia1"],
            "--device /dev/nvidia1: the host path /dev/nvidia1 reaches an NVIDIA device "
            "node, which would give the container GPUs outside its pin",
        ),
        (["--device=/dev/nvidiactl"], "--device /dev/nvidiactl"),
        (["--mount", "type=bind,source=/dev/nvidia0,target=/dev/nvidia0"], "--mount type=bind,source=/dev/nvidia0"),
        (["-v", "/dev/nvidia2:/dev/nvidia2"], "-v /dev/nvidia2:/dev/nvidia2"),
        # every spelling of a path to a node, and the folders that hold them (tests/test_ledger_docker.py: on disk)
        (["--device", "/dev//nvidia1"], "--device /dev//nvidia1: the host path /dev/nvidia1 reaches"),
        (["--device", "/dev/./nvidia1"], "--device /dev/./nvidia1: the host path /dev/nvidia1 reaches"),
        (["--device", "/dev/../dev/nvidia1"], "--device /dev/../dev/nvidia1: the host path /dev/nvidia1 reaches"),
        (["--device", "/dev:/hostdev"], "--device /dev:/hostdev: the host path /dev reaches"),
        (["--device", "/dev/"], "--device /dev/: the host path /dev reaches"),
        (["--device", "/dev/char/195:1"], "--device /dev/char/195:1: the host path /dev/char/195 reaches"),  # HOST:CTR
        (["--device", "/dev/nvidia-caps/nvidia-cap1"], "the host path /dev/nvidia-caps/nvidia-cap1 reaches"),
        (["-v", "/dev:/dev"], "-v /dev:/dev: the host path /dev reaches"),
        (["-v", "/:/host"], "-v /:/host: the host path / reaches"),
        (["--mount", "type=bind,src=/dev/,dst=/d"], "--mount type=bind,src=/dev/,dst=/d: the host path /dev reaches"),
        # the variables a runtime reads to pick devices
        (
            ["-e", f"DOCKER_RESOURCE_GPU={RTX}"],
            "-e DOCKER_RESOURCE_GPU: the NVIDIA runtime reads DOCKER_RESOURCE_GPU to pick the devices it exposes",
        ),
        (["-e", "NVIDIA_MIG_CONFIG_DEVICES=all"], "-e NVIDIA_MIG_CONFIG_DEVICES: the NVIDIA runtime reads"),
        (["-e", "NVIDIA_MIG_MONITOR_DEVICES=0"], "-e NVIDIA_MIG_MONITOR_DEVICES: the NVIDIA runtime reads"),
        (["-e", "NVIDIA_IMEX_CHANNELS=0"], "-e NVIDIA_IMEX_CHANNELS: the NVIDIA runtime reads"),
        (["-e", "NVIDIA_VISIBLE_DEVICES=2"], "-e NVIDIA_VISIBLE_DEVICES: hostagent sets NVIDIA_VISIBLE_DEVICES itself"),
        (["--restart", "always", "--rm"], "--rm and --restart always conflict"),
        (["--restart", "sometimes"], "--restart 'sometimes'"),
        (["--cpus", "lots"], "--cpus 'lots'"),
        (["--ulimit", "nofile"], "--ulimit 'nofile'"),
        (["--gpu-capabilities", "compute,telepathy"], "unknown capability telepathy"),
        (["--mount", "type=bind,colour=red,target=/x"], "unknown key 'colour'"),
        (["-p", "eighty"], "-p"),
        (["-p", "80-70:80-70"], "--publish '80-70:80-70': invalid container port"),
        (["--ip", "10.0.0.9"], "hostagent run does not take docker run's --ip"),
        (["--label-file", "labels.txt"], "hostagent run does not take --label-file"),
        (["--userns", "remap"], "--userns remap: not one of host"),
        (["--sysctl", "net.core.somaxconn"], "--sysctl 'net.core.somaxconn': 'net.core.somaxconn' is not KEY=VALUE"),
        (["--oom-score-adj", "5000"], "a whole number from -1000 to 1000"),
        (["--nmae", "x"], "did you mean --name?"),
    ],
)
def test_options_that_would_escape_the_pin_or_make_no_sense_are_refused(
    agent_any: Agent, args: list[str], says: str
) -> None:
    # Refused from the command line alone, before the daemon is asked anything: one engine shows it.
    r = agent_any("run", "--gpu", "1", *args, TEST_IMAGE)
    assert r.returncode == 64, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(errors) == 1 and says in errors[0], r.stderr
    assert agent_any.containers() == []


TRAP = "trap 'echo got TERM; exit 42' TERM; trap 'echo got INT; exit 43' INT; echo ready; while :; do sleep 0.1; done"
IGNORE = "trap '' TERM INT; echo ready; while :; do sleep 0.1; done"


def _started(agent: Agent, *args: str) -> subprocess.Popen[str]:
    p = agent.popen("run", "--rm", "--gpu", "1", *args)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGTERM, 42, "got TERM"), (signal.SIGINT, 43, "got INT")])
def test_a_signal_is_forwarded_to_the_workload(
    agent: Agent, way: str, sig: signal.Signals, code: int, said: str
) -> None:
    p = _started(agent, TEST_IMAGE, "--quiet", "sh", "-c", TRAP)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (code, f"{said}\n"), err
    _gone(agent)


def test_a_second_signal_stops_a_workload_that_ignores_the_first(agent: Agent, way: str) -> None:
    p = _started(agent, "--stop-timeout", "1", TEST_IMAGE, "--quiet", "sh", "-c", IGNORE)
    p.send_signal(signal.SIGINT)
    time.sleep(1)  # a second to see that nothing happens: forwarded and ignored, it is still running
    assert p.poll() is None
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 137 and "stopping" in err, err  # SIGTERM ignored too: killed after the stop timeout
    _gone(agent)


def test_without_sig_proxy_the_first_signal_stops_the_container(agent: Agent, way: str) -> None:
    p = _started(agent, "--sig-proxy=false", TEST_IMAGE, "--quiet", "sh", "-c", TRAP)
    p.send_signal(signal.SIGINT)  # not forwarded: docker stop sends SIGTERM
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (42, "got TERM\n") and "stopping" in err, err
    _gone(agent)


def _gone(agent: Agent) -> None:
    wait_for(lambda: agent.containers() == [], 10, "the container to be removed (--rm)")

"""`hostagent ls`: the cards from NVML, the holders from Docker, the processes from /proc, and graceful degradation
of each; its table checked exactly against golden files (tests/golden), its colours, --format and --watch.

Golden files: `ls-<scenario>[-color].txt` and `ls-<scenario>.json` (`ls --json`) for every shipped scenario
(tests/fakegpu/scenarios), from the real CLI on the simulated host with Docker unavailable (a socket that does not
exist), `api-ls-<scenario>.json` from a resident agent's /api/ls there, and `ls-holders-<engine>[-color].txt` and
`ls-holders-<engine>.json` from the sandbox with holders of every kind. The host name is fixed by running the CLI in
a UTS namespace of its own (`unshare --uts`, then sethostname), and in a pid namespace of its own (`--pid
--mount-proc`) so that the scenarios' process ids name no process of the machine that runs the tests: the CLI itself
is unchanged. Each file holds stdout, then stderr and the exit code when there are any. `make golden` (pytest
--update-golden) rewrites them when a change of the output is meant."""

from __future__ import annotations

import json
import os
import pty
import pwd
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.ledger import processes as procs
from gpupin.hostagent.ls import template as lsformat
from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.ls import (
    GOLDEN,
    by_uuid,
    check_golden,
    ls,
    ls_on_golden_host,
    on_golden_host,
    shown,
    write_topology,
)
from tests.support.resident import Resident
from tests.support.scenarios import SHIPPED, cards, uuids
from tests.support.spawn import default_signals

A800, RTX, A800B, A800C = uuids("mixed-4")
NO_DOCKER = "unix:///nonexistent/gpupin-golden/docker.sock"  # the same path in every golden file
ESC = "\x1b["


# --- golden files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("color", [False, True], ids=["plain", "color"])
@pytest.mark.parametrize("name", SHIPPED)
def test_golden_scenario(fakegpu: Path, request: pytest.FixtureRequest, name: str, color: bool) -> None:
    r = ls_on_golden_host(["--color", "always"] if color else [], simhost_env(name, DOCKER_HOST=NO_DOCKER))
    check_golden(request, f"ls-{name}{'-color' if color else ''}.txt", shown(r))


@pytest.mark.parametrize("name", SHIPPED)
def test_golden_json(fakegpu: Path, request: pytest.FixtureRequest, name: str) -> None:
    """`ls --json` byte for byte: the field names, their order, the numbers' forms are what scripts read."""
    r = ls_on_golden_host(["--json"], simhost_env(name, DOCKER_HOST=NO_DOCKER))
    check_golden(request, f"ls-{name}.json", shown(r))


@pytest.mark.parametrize("name", SHIPPED)
def test_golden_api_ls(fakegpu: Path, request: pytest.FixtureRequest, name: str) -> None:
    """A resident agent's /api/ls byte for byte, on the same host as test_golden_json (its own golden file: the
    agent's view may say more than the CLI's, e.g. idle time, once it has watched the cards)."""
    agent = Resident(simhost_env(name, DOCKER_HOST=NO_DOCKER), wrap=on_golden_host())
    try:
        status, body, kind = agent.get("/api/ls")
    finally:
        # unshare does not pass SIGTERM on: the agent (its child, pid 1 of the namespace) is stopped itself.
        inner = Path(f"/proc/{agent.proc.pid}/task/{agent.proc.pid}/children").read_text().split()
        for pid in inner:
            os.kill(int(pid), signal.SIGTERM)
        agent.proc.communicate(timeout=10)
        shutil.rmtree(agent.dir, ignore_errors=True)
    assert agent.proc.returncode == 0, agent.proc.returncode
    # The status and type first (an agent whose NVML fails answers 503), then the body as it came.
    check_golden(request, f"api-ls-{name}.json", f"{status} {kind}\n{body.decode()}")


# --- the data (--json) -----------------------------------------------------------------------------------------

OLD_KEYS = {
    "index",
    "uuid",
    "bus_id",
    "name",
    "memory_total_mib",
    "memory_used_mib",
    "memory_free_mib",
    "utilization_gpu",
    "mig_mode",
    "mig_devices",
    "compute_processes",
    "compute_capability",
    "error",
    "held",
    "holders",
    "mislabelled",
}


def test_without_docker_the_cards_are_listed_and_the_listing_says_so(fakegpu: Path, tmp_path: Path) -> None:
    r = ls("--json", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["docker"]["available"] is False and "does not answer" in data["docker"]["error"]
    assert [(g["index"], g["uuid"], g["bus_id"], g["name"]) for g in data["gpus"]] == [
        (0, A800, "00000000:1B:00.0", "NVIDIA A800-SXM4-80GB"),
        (1, RTX, "00000000:3B:00.0", "NVIDIA GeForce RTX 4090"),
        (2, A800B, "00000000:86:00.0", "NVIDIA A800-SXM4-80GB"),
        (3, A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB"),
    ]
    busy = by_uuid(data)[A800B]
    assert (busy["memory_total_mib"], busy["memory_used_mib"], busy["memory_free_mib"]) == (81920, 40962, 40958)
    assert (busy["utilization_gpu"], busy["compute_processes"], busy["mig_mode"]) == (87, 1, False)
    assert r.stderr.startswith(f"hostagent: WARNING: Docker unavailable at unix://{tmp_path}/none.sock (")
    plain = ls(DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    table = plain.stdout  # the listing only: the diagnostic is on stderr
    assert "Docker unavailable: who holds which card is unknown" in table.splitlines()[0]
    assert [line.split()[0] for line in table.splitlines()[1:] if line.startswith("[")] == ["[0]", "[1]", "[2]", "[3]"]
    assert "does not answer" not in table and "who holds which card is unknown" in plain.stderr


def test_json_adds_host_sensors_and_processes_and_keeps_its_keys(fakegpu: Path, tmp_path: Path) -> None:
    data = json.loads(ls("--json", DOCKER_HOST=f"unix://{tmp_path}/none.sock").stdout)
    assert (data["hostname"], data["driver_version"], data["cuda_driver_version"]) == (
        os.uname().nodename,
        "580.159.04",
        "13.0",
    )
    cards = by_uuid(data)
    assert all(set(g) >= OLD_KEYS for g in data["gpus"])  # scripts read these: added to, never renamed
    busy = cards[A800B]
    assert (busy["temperature_c"], busy["power_draw_w"], busy["power_limit_w"]) == (71, 312.46, 400.0)
    assert [(p["pid"], p["used_memory_mib"], p["mig_uuid"]) for p in busy["processes"]] == [(4242, 40448, None)]
    # Without Docker whether a card is held (or shared) is unknown: null, never false.
    assert (cards[RTX]["temperature_c"], cards[RTX]["power_limit_w"], cards[RTX]["shared"]) == (36, 450.0, None)
    bare = json.loads(ls("--json", scenario_name="slurm-shuffled", DOCKER_HOST=f"unix://{tmp_path}/n.sock").stdout)
    assert {(g["temperature_c"], g["power_draw_w"], g["power_limit_w"]) for g in bare["gpus"]} == {(None, None, None)}


def test_a_lost_card_is_shown_not_a_crash(fakegpu: Path, tmp_path: Path) -> None:
    r = ls("--json", scenario_name="fault-lost", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert r.returncode == 0, r.stderr
    gpus = json.loads(r.stdout)["gpus"]
    assert [g["error"] for g in gpus] == [None, None, "GPU is lost", None]
    assert gpus[2]["temperature_c"] is None and gpus[2]["processes"] == []
    assert gpus[2]["health"] == {"healthy": False, "reasons": ["lost to NVML"], "since": None}
    table = ls(scenario_name="fault-lost", DOCKER_HOST=f"unix://{tmp_path}/n.sock").stdout
    assert "[2] UNHEALTHY: lost to NVML (GPU is lost)" in table


def test_nvml_unusable_is_69(fakegpu: Path) -> None:
    r = ls(scenario_name="fault-nvml-unknown")
    assert r.returncode == 69 and r.stdout == ""
    assert "Failed to initialize NVML: Unknown Error" in r.stderr and "HINT:" in r.stderr


def test_mig_devices_are_listed_under_their_card(fakegpu: Path, tmp_path: Path) -> None:
    r = ls("--json", scenario_name="mig", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    mig = [g for g in json.loads(r.stdout)["gpus"] if g["mig_mode"]]
    assert len(mig) == 1 and len(mig[0]["mig_devices"]) == 2
    assert [
        (m["uuid"][:4], m["index"], m["memory_used_mib"], m["memory_total_mib"], m["held"])
        for m in mig[0]["mig_devices"]
    ] == [("MIG-", 0, 0, 20096, None), ("MIG-", 1, 2560, 20096, True)]
    # Without Docker: MIG 0 is unknown; MIG 1 runs a process whose owner /proc does not show: busy.
    assert [m["state"] for m in mig[0]["mig_devices"]] == ["unknown", "busy"]
    # The process runs in GPU instance 2: the second MIG device. A card in MIG mode has no utilization (nvml.h).
    assert [(p["pid"], p["mig_uuid"]) for p in mig[0]["processes"]] == [(5151, mig[0]["mig_devices"][1]["uuid"])]
    assert mig[0]["utilization_gpu"] is None


SLOTS = (
    "index",
    "uuid",
    "name",
    "memory_total",
    "memory_used",
    "utilization_gpu",
    "mig_mode",
    "processes",
    "minor_number",
    "compute_capability",
    "temperature",
    "power_draw",
    "power_limit",
)


@pytest.mark.parametrize("name", ["mixed-4", "dgx-8", "mig", "mig-shared-prefix", "slurm-shuffled"])
def test_the_nvml_adapter_reads_what_the_scenario_says(fakegpu: Path, name: str) -> None:
    """gpupin.core.nvml over the fake NVML gives the cards tests/support/scenarios.py reads from the same file (what
    the pure tests take as the truth): every field, MIG devices and processes included."""
    code = f"""
import json
from gpupin.core import nvml
def card(c):
    return {{**{{s: getattr(c, s) for s in {SLOTS!r}}}, "bus_id": str(c.bus_id),
            "procs": [[p.pid, p.used_memory, p.gpu_instance_id, p.compute_instance_id] for p in c.process_list],
            "migs": [[m.uuid, m.index, m.gpu_instance_id, m.compute_instance_id, m.name, m.memory_total,
                      m.memory_used] for m in c.mig_devices]}}
print(json.dumps([card(c) for c in nvml.list_cards(detail=True)]))
"""

    def card(c: Any) -> dict[str, Any]:
        return {
            **{s: getattr(c, s) for s in SLOTS},
            "bus_id": str(c.bus_id),
            "procs": [[p.pid, p.used_memory, p.gpu_instance_id, p.compute_instance_id] for p in c.process_list],
            "migs": [
                [m.uuid, m.index, m.gpu_instance_id, m.compute_instance_id, m.name, m.memory_total, m.memory_used]
                for m in c.mig_devices
            ],
        }

    r = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-c", code],
        env=simhost_env(name),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [card(c) for c in cards(name)]


def test_a_mig_devices_holders_and_processes_are_shown_under_it(fakegpu: Path, tmp_path: Path) -> None:
    """The table from the mig scenario's real data, with the ledger's holders of one MIG device and of the whole
    card put in (the sandbox's hook exposes no MIG device by UUID to a container of mixed-4)."""
    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.ls import view as lsview
    from gpupin.hostagent.ls.listing import holder_shown

    data = json.loads(ls("--json", scenario_name="mig", DOCKER_HOST=f"unix://{tmp_path}/none.sock").stdout)
    card = data["gpus"][0]
    mig1 = card["mig_devices"][1]["uuid"]
    card["holders"] = [
        holder_shown(Holder("a" * 64, "on-mig", "running", [mig1], True, "gpupin"), 0).to_json(),
        holder_shown(Holder("b" * 64, "whole", "running", [card["uuid"]], False, "--gpus all"), 0).to_json(),
    ]
    card["held"] = card["mig_devices"][1]["held"] = True
    card["state"], card["mig_devices"][0]["state"], card["mig_devices"][1]["state"] = "held", "free", "held"
    card["unknown"] = None
    data["docker"]["available"] = True
    lines = lsview.render(data).splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("    MIG 1")))
    assert lines[at].endswith("2560 / 20096 MiB  held") and lines[at - 1].endswith("0 / 20096 MiB  free")
    assert lines[at + 1] == "      held by      on-mig  aaaaaaaaaaaa  running  gpupin"
    assert lines[at + 2] == "      process      5151  C  N/A  2048 MiB  N/A  owner unknown"
    assert lines[at + 3] == "    held by      whole  bbbbbbbbbbbb  running  --gpus all"
    assert lines[1].endswith("  held")


@pytest.mark.parametrize(("ahead", "said"), [(60, "will be stopped at"), (-5, "being stopped (due at")])
def test_an_idle_warning_never_says_will_be_stopped_at_a_time_past(ahead: float, said: str) -> None:
    """The idle rule's stop takes the engine's stop and the container's grace: past `stop_at`, `ls --host` says the
    stop is under way, never "will be stopped at" a time already gone."""
    from gpupin.hostagent.ls import view as lsview

    data = json.loads((GOLDEN / "api-ls-mixed-4.json").read_text().split("\n", 1)[1])  # after the status line
    stop_at = time.time() + ahead
    data["gpus"][0].update(
        idle=True, idle_seconds=120, idle_warning={"container": "train", "since": stop_at - 90, "stop_at": stop_at}
    )
    at = time.strftime("%H:%M:%S", time.localtime(stop_at))
    line = next(ln for ln in lsview.render(data).splitlines() if "IDLE:" in ln)
    assert line.endswith(f"train warned, {said} {at}" + (")" if ahead < 0 else "")), line
    assert ("will be stopped" in line) == (ahead > 0), line


@pytest.fixture
def other_user_process() -> Iterator[tuple[int, str]]:
    """A process of another user (nobody, when the tests run as root), and its user's name."""
    uid = 65534 if os.geteuid() == 0 else os.getuid()
    p = subprocess.Popen(["sleep", "60"], user=uid)
    try:
        yield p.pid, pwd.getpwuid(uid).pw_name
    finally:
        p.kill()
        p.wait()


def test_processes_show_their_user_and_command_from_proc(
    fakegpu: Path, tmp_path: Path, other_user_process: tuple[int, str]
) -> None:
    pid, user = other_user_process
    topo = write_topology(tmp_path, "mixed-4", pid, used=None)
    r = ls("--json", FAKEGPU_TOPOLOGY=str(topo), DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    (proc,) = by_uuid(json.loads(r.stdout))[RTX]["processes"]
    assert (proc["pid"], proc["user"], proc["command"], proc["used_memory_mib"]) == (pid, user, "sleep", None)
    table = ls(FAKEGPU_TOPOLOGY=str(topo), DOCKER_HOST=f"unix://{tmp_path}/none.sock").stdout
    assert re.search(rf"^    process +{pid}  C  {user}  N/A  sleep  host$", table, re.M), table


def test_a_process_that_is_gone_has_no_user_and_no_error() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    p = procs.describe(gone.pid)
    assert (p.pid, p.user, p.command, p.container_id) == (gone.pid, None, None, None)
    me = procs.describe(os.getpid())
    assert me.user == pwd.getpwuid(os.getuid()).pw_name and me.command


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        ("0::/system.slice/docker-" + "a" * 64 + ".scope\n", "a" * 64),  # cgroup v2, systemd driver
        ("12:memory:/docker/" + "b" * 64 + "\n0::/\n", "b" * 64),  # cgroup v1, cgroupfs driver
        ("0::/kubepods/burstable/pod1/cri-containerd-" + "c" * 64 + ".scope\n", "c" * 64),
        ("0::/user.slice/user-0.slice/session-1.scope\n", None),
        ("4:memory:/process_api/175dadd2fd383b9a881c2c184a5e745e\n", None),  # 32 hex: not a container id
        ("", None),
    ],
)
def test_container_id_from_cgroup(cgroup: str, expected: str | None) -> None:
    assert procs.container_id(cgroup) == expected


# --- colour ----------------------------------------------------------------------------------------------------


def on_tty(
    argv: list[str],
    env: dict[str, str],
    stop_when: Callable[[bytes], bool] | None = None,
) -> tuple[int, bytes]:
    """Run `argv` on a pseudo-terminal until it ends (sent SIGINT, Ctrl-C, once `stop_when(output so far)`): its
    exit code and what it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        try:
            default_signals()
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    out = b""
    started = time.monotonic()
    sent = False
    while True:
        if stop_when is not None and not sent and stop_when(out):
            os.kill(pid, signal.SIGINT)
            sent = True
        if time.monotonic() - started > 60:
            os.kill(pid, signal.SIGKILL)
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child is gone and its terminal with it
                chunk = b""
            if not chunk:
                break
            out += chunk
    os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out


def test_colour_on_a_terminal_unless_no_color_or_never(fakegpu: Path, tmp_path: Path) -> None:
    env = simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock", TERM="xterm")
    rc, out = on_tty([HOSTAGENT, "ls"], env)
    assert rc == 0 and ESC.encode() in out
    for extra, args in (({"NO_COLOR": "1"}, []), ({"TERM": "dumb"}, []), ({}, ["--color", "never"])):
        rc, out = on_tty([HOSTAGENT, "ls", *args], {**env, **extra})
        assert rc == 0 and b"[0] NVIDIA" in out and ESC.encode() not in out, (extra, args)
    # Piped: no colour, unless asked; NO_COLOR set but empty does not count (no-color.org).
    assert ESC not in ls(DOCKER_HOST=f"unix://{tmp_path}/none.sock").stdout
    assert ESC in ls("--color", "always", NO_COLOR="1", DOCKER_HOST=f"unix://{tmp_path}/none.sock").stdout
    rc, out = on_tty([HOSTAGENT, "ls"], {**env, "NO_COLOR": ""})
    assert ESC.encode() in out


# --- --watch ---------------------------------------------------------------------------------------------------


def test_watch_redraws_in_place_and_ctrl_c_restores_the_terminal(fakegpu: Path, tmp_path: Path) -> None:
    env = simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock", TERM="xterm")
    rc, out = on_tty([HOSTAGENT, "ls", "--watch", "0.2"], env, stop_when=lambda out: out.count(b"\x1b[J") >= 3)
    assert rc == 0
    text = out.decode()
    assert text.startswith("\x1b[?1049h\x1b[?25l\x1b[?7l")  # alternate screen, cursor hidden, no line wrap
    assert text.endswith("\x1b[?7h\x1b[?25h\x1b[?1049l")  # all three undone, in reverse
    frames = text.count("\x1b[H")
    assert frames >= 2 and text.count("every 0.2s") == frames  # each frame from the top, timed on its header
    assert "hostagent: WARNING" not in text  # Docker's absence is on the header line, not over the screen


def test_watch_to_a_pipe_appends_frames_and_ends_on_sigint_or_sigterm(fakegpu: Path, tmp_path: Path) -> None:
    env = simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    for sig, code in ((signal.SIGINT, 0), (signal.SIGTERM, 143)):
        p = subprocess.Popen(
            [HOSTAGENT, "ls", "--watch", "0.2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert p.stdout is not None
        seen = ""
        while seen.count("[3] NVIDIA") < 2:  # two frames, however slow the machine
            line = p.stdout.readline()
            assert line, p.stderr.read() if p.stderr else ""
            seen += line
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        out = seen + out
        assert p.returncode == code and err == "", (sig, err)
        assert ESC not in out and "every 0.2s" in out
        assert re.search(r"00000000:AF:00.0\n\n\S+  driver ", out)  # frames a blank line apart


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--watch", "--json"], "--watch redraws the table on a terminal; it does not go with --json"),
        (["--watch", "5", "--format", "{index}"], "it does not go with --format"),
        (["--json", "--format", "{index}"], "--json and --format are two outputs for scripts"),
        (["--watch", "0"], "seconds must be between 0.1 and 86400, not 0"),
        (["--watch", "soon"], "invalid seconds 'soon'"),
        (["--color", "sometimes"], "invalid choice: 'sometimes'"),
        (["--format", "{{.Index}}"], "is a Go template; hostagent's --format takes Python str.format fields"),
        (["--format", "{indx}"], "unknown field {indx}. HINT: did you mean {index}?"),
        (["--format", "{}"], "{} names no field"),
        (["--format", "{index.real}"], "unknown field {index.real}"),
        (["--format", "{name:d}"], "{name:d}: Unknown format code 'd'"),
        (["--format", "{index"], "expected '}' before end of string"),
        (["--format", "{name:>999999999}"], "{name:>999999999}: a width or precision above 1000"),
        (["--format", "{power_draw_w:.99999}"], "a width or precision above 1000"),
    ],
)
def test_bad_options_are_one_line_and_64(fakegpu: Path, args: list[str], says: str) -> None:
    r = ls(*args, DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert r.returncode == 64 and r.stdout == ""
    assert r.stderr.startswith("hostagent: ERROR: ") and says in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


# --- --format --------------------------------------------------------------------------------------------------


def test_format_prints_one_line_per_card(fakegpu: Path, tmp_path: Path) -> None:
    r = ls(
        "--format",
        r"{index}\t{uuid}\t{temperature_c:>3}\t{power_draw_w:.1f}\t{processes}\t{hostname}",
        DOCKER_HOST=f"unix://{tmp_path}/none.sock",
    )
    host = os.uname().nodename
    assert r.returncode == 0 and r.stdout == (
        f"0\t{A800}\t 31\t61.2\t\t{host}\n1\t{RTX}\t 36\t21.5\t\t{host}\n"
        f"2\t{A800B}\t 71\t312.5\t4242\t{host}\n"
        f"3\t{A800C}\t 30\t60.8\t\t{host}\n"
    )
    # N/A keeps the column: a numeric spec's width and alignment apply to it; held is unknown without Docker.
    r = ls(
        "--format",
        "{index}|{temperature_c:>5d}|{power_limit_w:6.1f}|{held}|{error}",
        scenario_name="fault-lost",
        DOCKER_HOST=f"unix://{tmp_path}/none.sock",
    )
    assert r.stdout.splitlines() == [
        "0|   31| 400.0|N/A|N/A",
        "1|   36| 450.0|N/A|N/A",
        "2|  N/A|   N/A|N/A|GPU is lost",
        "3|   30| 400.0|N/A|N/A",
    ]


def test_format_shows_text_from_elsewhere_through_the_one_rule(fakegpu: Path, tmp_path: Path) -> None:
    """A holder's name, the daemon's words and a hostname with a screen clear, an OSC 8 link and a newline (what a
    daemon that does not check names, or its errors, could send): each line stays one line, nothing is obeyed, and
    printable text prints as itself."""
    listing = json.loads(ls("--json", DOCKER_HOST=f"unix://{tmp_path}/none.sock").stdout)
    evil = "x\x1b[2J\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07\nsecond"
    listing["docker"]["available"] = True
    listing["hostname"] = f"host{evil}"
    for card in listing["gpus"]:
        card["holders"] = [{"name": evil, "holds": True}, {"name": "plain-name", "holds": True}]
        card["unknown"] = f"the daemon said: {evil}"
    out = lsformat.Template("{index}|{hostname}|{holders:<12}|{unknown}").render(listing)
    escaped = "'x\\x1b[2J\\x1b]8;;http://evil.example/\\x07click\\x1b]8;;\\x07\\nsecond'"
    assert "\x1b" not in out and "\x07" not in out and len(out.splitlines()) == 4, out
    assert out.splitlines()[0] == f"0|'host{escaped[1:]}|plain-name,{escaped}|'the daemon said: {escaped[1:]}", out


def test_help_explains_every_option_and_field(fakegpu: Path) -> None:
    r = subprocess.run([HOSTAGENT, "ls", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for option in ("--json", "--format TEMPLATE", "--color {auto,always,never}", "--watch [SECONDS]", "NO_COLOR"):
        assert option in r.stdout, option
    for field in lsformat.FIELDS:
        assert re.search(rf"^  {field} +\S", r.stdout, re.M), field


def test_ls_json_stays_on_the_fast_path(fakegpu: Path, tmp_path: Path) -> None:
    """`ls --json` (benchmarked against `docker ps`) builds no parser and loads neither the docker SDK nor the
    table's or the templates' modules."""
    code = (
        "import sys\nfrom gpupin.hostagent import cli\nrc = cli.main(['ls', '--json'])\n"
        "sys.stderr.write(repr(sorted(m for m in ('docker', 'gpupin.hostagent.ls.view', "
        "'gpupin.hostagent.ls.template', 'difflib', 'requests') if m in sys.modules)))\n"
    )
    r = subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        env=simhost_env("mixed-4", DOCKER_HOST=f"unix://{tmp_path}/none.sock"),
        timeout=60,
    )
    assert r.stderr.splitlines()[-1] == "[]" and json.loads(r.stdout)["gpus"]


def test_a_reader_that_leaves_ends_it_quietly(fakegpu: Path, tmp_path: Path) -> None:
    """`hostagent ls --json | head -c1`: exit 141 as a C tool killed by SIGPIPE, no traceback, no error line."""
    r = subprocess.run(
        f'{shlex.quote(HOSTAGENT)} ls --json | (exec 0<&-; sleep 0.5); echo "${{PIPESTATUS[0]}}"',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=simhost_env("dgx-8", DOCKER_HOST=f"unix://{tmp_path}/none.sock"),
        timeout=60,
    )
    assert r.stdout.strip() == "141" and "ERROR" not in r.stderr and "Traceback" not in r.stderr, r.stderr


# Last, so that `make golden` has written every file before these read them.
def test_golden_files_are_all_for_shipped_scenarios() -> None:
    """A golden file of a scenario that is gone is stale, not a check."""
    names = {p.name for p in GOLDEN.glob("*")}
    # One holders file per way of pinning (--gpus: 20.10's; CDI: 26's, which 28.5 shares): test_hostagent_ls.py.
    ways = ("holders-20.10", "holders-26")
    expected = {f"ls-{s}{c}.txt" for s in [*SHIPPED, *ways] for c in ("", "-color")}
    expected |= {f"{kind}-{s}.json" for s in SHIPPED for kind in ("ls", "api-ls")}
    expected |= {f"ls-{way}.json" for way in ways}
    assert names == expected


def test_golden_plain_is_the_colour_one_without_escapes() -> None:
    """Colour only adds escape codes: the same text, the same columns."""
    for plain in GOLDEN.glob("ls-*.txt"):
        if plain.stem.endswith("-color"):
            continue
        colored = (GOLDEN / f"{plain.stem}-color.txt").read_text()
        assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == plain.read_text(), plain.name

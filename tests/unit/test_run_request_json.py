"""What `hostagent run` sends the resident agent (gpupin.hostagent.run.request_json) and how it reads the answers of
the agent and the Engine without an HTTP library (gpupin.hostagent.http1, engine.unix's frames): the request arrives
as the user typed it with what the caller read (its env files, its folder, its seccomp profile), the agent builds
the container from it with every check of a run, and opens nothing."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from gpupin.core.errors import UsageError
from gpupin.hostagent import http1
from gpupin.hostagent.engine.unix import STDERR, STDOUT, Stream
from gpupin.hostagent.run import request_json
from gpupin.hostagent.run.request import RunRequest


def test_the_request_arrives_as_the_caller_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / "env"
    env_file.write_text("TOKEN=from-the-file\n")
    monkeypatch.chdir(tmp_path)
    req = RunRequest(
        "gpupin:test",
        ["python3", "train.py"],
        gpus=["1"],
        env=["A=1"],
        env_files=[str(env_file)],
        volumes=["./data:/data"],
        publish=["127.0.0.1:8080:80"],
        ulimits=["nofile=10:20"],
        labels=["team=x"],
        name="job",
        rm=True,
        environ={},
    )
    sent = json.loads(json.dumps(request_json.dump(req)))  # through JSON, as the socket carries it
    env_file.unlink()  # the agent reads no file of the caller's ...
    monkeypatch.chdir("/")  # ... and its folder is not the caller's
    got = request_json.load(sent)
    assert got.payload == req.payload and got.user_env == req.user_env
    assert got.payload["host"]["port_bindings"] == {"80": [("127.0.0.1", "8080")]}  # a tuple again
    assert got.payload["host"]["binds"] == [f"{tmp_path}/data:/data"]
    assert (got.image, got.command, got.gpus, got.name, got.rm, got.wait) == (
        "gpupin:test",
        ["python3", "train.py"],
        ["1"],
        "job",
        True,
        None,
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"wire": 0},
        {"wire": request_json.VERSION, "options": {"privileged": True}},
        {"wire": request_json.VERSION, "options": {}, "payload": {}, "env": [["A"]]},
        {**request_json.dump(RunRequest("gpupin:test", gpus=["1"], environ={})), "payload": {"host": {}}},
        {**request_json.dump(RunRequest("gpupin:test", gpus=["1"], environ={})), "options": {"rm": "yes"}},
        {**request_json.dump(RunRequest("gpupin:test", gpus=["1"], environ={})), "cwd": "relative"},
        {**request_json.dump(RunRequest("gpupin:test", gpus=["1"], environ={})), "files": {"/x": "\ud800"}},
    ],
)
def test_a_malformed_request_is_a_usage_error(bad: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        request_json.load(bad)


def test_what_the_agent_checks_again_it_refuses() -> None:
    sent = request_json.dump(RunRequest("gpupin:test", gpus=["1"], environ={}))
    sent["options"]["labels"] = ["gpupin.devices=GPU-x"]  # a label the pin owns, past a client's check
    with pytest.raises(UsageError, match=r"hostagent writes gpupin\.devices itself"):
        request_json.load(sent)


def test_the_agent_reads_only_what_the_caller_sent(tmp_path: Path) -> None:
    profile = tmp_path / "seccomp.json"
    profile.write_text('{"defaultAction": "SCMP_ACT_ALLOW"}')
    req = RunRequest("gpupin:test", gpus=["1"], environ={}, security_opt=[f"seccomp={profile}"])
    sent = json.loads(json.dumps(request_json.dump(req)))
    profile.unlink()
    assert request_json.load(sent).payload == req.payload  # the profile as the caller read it
    sent["options"]["env_files"] = ["/etc/shadow"]  # a file the caller did not send: the agent opens nothing
    with pytest.raises(UsageError, match="--env-file /etc/shadow: not sent with the run request"):
        request_json.load(sent)


def test_the_environment_sent_is_checked_as_a_run_checks_it() -> None:
    sent = request_json.dump(RunRequest("gpupin:test", gpus=["1"], environ={}))
    sent["options"]["env"] = ["NVIDIA_VISIBLE_DEVICES"]
    sent["environ"] = {"NVIDIA_VISIBLE_DEVICES": "all"}
    with pytest.raises(UsageError, match="hostagent sets NVIDIA_VISIBLE_DEVICES itself"):
        request_json.load(sent)


def serve_once(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A socket pair whose far end reads one request and writes `answer`."""
    near, far = socket.socketpair()

    def reply() -> None:
        far.recv(65536)
        far.sendall(answer)
        far.close()

    t = threading.Thread(target=reply)
    t.start()
    return near, t


@pytest.mark.parametrize(
    "raw",
    [
        b'HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{"Id": "abc"}',
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"Id"\r\n8\r\n: "abc"}\r\n0\r\n\r\n',
        b'HTTP/1.0 200 OK\r\n\r\n{"Id": "abc"}',
    ],
)
def test_an_answer_by_length_chunked_or_to_the_end(raw: bytes) -> None:
    sock, t = serve_once(raw)
    answer = http1.exchange(sock, "POST", "/containers/create", {"Image": "x"})
    assert answer.status == 200 and answer.json() == {"Id": "abc"}
    t.join()


def test_frames_of_a_multiplexed_stream() -> None:
    frames = b"".join(
        bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data
        for kind, data in ((1, b"out\n"), (2, b"err\n"), (1, b""), (1, b"more"))
    )
    sock, t = serve_once(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + frames)
    stream = Stream(http1.exchange(sock, "POST", "/containers/x/attach", headers={"Upgrade": "tcp"}), tty=False)
    assert list(stream.frames()) == [(STDOUT, b"out\n"), (STDERR, b"err\n"), (STDOUT, b"more")]
    stream.close()
    t.join()

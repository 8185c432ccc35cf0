"""`hostagent run`'s command line as docker's: bool flags with =true/=false and in clusters, docker's spellings
(--net, --dns-opt, -h), sizes in every unit, and a dry run that never prints a value read from an env file or
from the environment. No daemon: --dry-run on the simulated host (tests/test_run_parity.py compares with docker
itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupin.hostagent.cli import build_parser, main
from gpupin.hostagent.completion import subcommands
from gpupin.hostagent.run.args import bool_values

GIB = 1024**3


@pytest.fixture
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing reachable: a dry run shows the nvidia driver's form, and a real run could create nothing."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")


def dry_run(capsys: pytest.CaptureFixture[str], *args: str, json_out: bool = False) -> str:
    rc = main(["run", "--dry-run", *(["--json"] if json_out else []), "--gpu", "0", *args, "img:1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.mark.parametrize(
    ("given", "read"),
    [
        (["-itd"], ["--interactive", "--tty", "--detach"]),
        (["-d=true", "-t=false"], ["--detach=true", "--tty=false"]),
        (["-it=false"], ["--interactive", "--tty=false"]),
        (["-ite", "A=1"], ["--interactive", "--tty", "-e", "A=1"]),
        (["-eA=1", "-p8888:8888", "--rm=false"], ["-eA=1", "-p8888:8888", "--rm=false"]),
        (["-dp", "80:80"], ["--detach", "-p", "80:80"]),
    ],
)
def test_short_bool_flags_are_read_in_their_long_form(given: list[str], read: list[str]) -> None:
    assert bool_values(given, subcommands(build_parser())["run"]) == read


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("args", "shown", "absent"),
    [
        (["--rm=true", "-d=true"], ["-d ", "--rm "], []),
        (["--rm", "--rm=false", "--init=0"], ["--rm=false", "--init=false"], ["--rm"]),
        (["--read-only=True", "-P=F"], ["--read-only "], ["-P"]),
        (["--net", "host"], ["--network host"], []),
        (["--net=none"], ["--network none"], []),
        (["-h", "trainer"], ["--hostname trainer"], []),
        (["--dns-opt", "ndots:2"], ["--dns-option ndots:2"], []),
        (["--sig-proxy=false"], ["--sig-proxy=false"], []),  # a bool flag, as docker's: on unless =false
        (["--sig-proxy"], ["--sig-proxy "], []),
    ],
)
def test_docker_spellings(
    capsys: pytest.CaptureFixture[str], args: list[str], shown: list[str], absent: list[str]
) -> None:
    line = dry_run(capsys, *args)
    assert all(s in line for s in shown), line
    assert all(a not in line.split() for a in absent), line


@pytest.mark.usefixtures("no_daemon")
def test_a_bool_flag_given_a_word_that_is_no_bool_is_one_line_64(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", "--gpu", "0", "--rm=yes", "img:1"]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'yes' is not a boolean" in err


@pytest.mark.usefixtures("no_daemon")
def test_sig_proxy_takes_no_word_after_it(capsys: pytest.CaptureFixture[str]) -> None:
    # docker run --sig-proxy false IMG runs the image `false`: the word after a bool flag is not its value.
    assert main(["run", "--dry-run", "--gpu", "0", "--sig-proxy", "false", "img:1"]) == 0
    assert capsys.readouterr().out.split()[-2:] == ["false", "img:1"]


@pytest.mark.usefixtures("no_daemon")
def test_init_false_is_sent_as_docker_sends_it(capsys: pytest.CaptureFixture[str]) -> None:
    host = json.loads(dry_run(capsys, "--init=false", json_out=True))["config"]["HostConfig"]
    assert host["Init"] is False
    host = json.loads(dry_run(capsys, json_out=True))["config"]["HostConfig"]
    assert "Init" not in host and host["RestartPolicy"] == {"Name": "no", "MaximumRetryCount": 0}


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("args", "key", "value"),
    [
        (["--shm-size", "16GB"], "ShmSize", 16 * GIB),
        (["--shm-size", "16GiB"], "ShmSize", 16 * GIB),
        (["--shm-size=8 g"], "ShmSize", 8 * GIB),
        (["-m", "1.5g", "--memory-swap", "-1"], "MemorySwap", -1),
        (["-m", "64G"], "Memory", 64 * GIB),
        (["--memory-reservation", "2048k"], "MemoryReservation", 2 * 1024**2),
        (["--cpus", "0.1"], "NanoCpus", 10**8),
        (["--cpus", "0"], "NanoCpus", 0),
    ],
)
def test_sizes_and_cpus_as_docker_reads_them(
    capsys: pytest.CaptureFixture[str], args: list[str], key: str, value: int
) -> None:
    # 0 CPUs is no limit, the daemon's default: the SDK leaves it out, the CLI sends 0.
    assert json.loads(dry_run(capsys, *args, json_out=True))["config"]["HostConfig"].get(key, 0) == value


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["--shm-size", "16x"], "--shm-size"),
        (["--shm-size", "1e3"], "--shm-size"),
        (["-m", "-1"], "--memory"),
        (["--cpus", "0.0000000001"], "--cpus"),
    ],
)
def test_what_docker_refuses_is_refused_by_option(
    capsys: pytest.CaptureFixture[str], args: list[str], name: str
) -> None:
    assert main(["run", "--dry-run", "--gpu", "0", *args, "img:1"]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"hostagent: ERROR: {name} ")


@pytest.mark.usefixtures("no_daemon")
def test_mounts_as_docker_makes_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    (tmp_path / "profile.json").write_text('{\n  "defaultAction": "SCMP_ACT_ALLOW",\n  "names": ["a b"]\n}\n')
    config = json.loads(
        dry_run(
            capsys,
            "-v",
            "./data:/data:ro",
            "-v",
            ".:/w",
            "-v",
            "../up:/up",
            "-v",
            "/scratch",
            "--mount",
            "type=bind,src=./m,dst=/m",
            "--security-opt",
            "seccomp=profile.json",
            "--security-opt",
            "systempaths=unconfined",
            json_out=True,
        )
    )["config"]
    host = config["HostConfig"]
    # ../up too, as the current docker CLI (28) makes it (CLIs 23 to 27 sent it as a volume name)
    assert host["Binds"] == [f"{tmp_path}/data:/data:ro", f"{tmp_path}:/w", f"{tmp_path.parent}/up:/up"]
    assert config["Volumes"] == {"/scratch": {}}
    assert host["Mounts"][0]["Source"] == f"{tmp_path}/m"
    assert host["SecurityOpt"] == ['seccomp={"defaultAction":"SCMP_ACT_ALLOW","names":["a b"]}']
    assert host["MaskedPaths"] == [] and host["ReadonlyPaths"] == []


@pytest.mark.usefixtures("no_daemon")
def test_a_dry_run_never_prints_a_value_from_a_file_or_the_environment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "secrets.env"
    secrets.write_text("WANDB_API_KEY=wandb-secret-1\nHF_TOKEN\n")
    monkeypatch.setenv("HF_TOKEN", "hf-secret-2")
    monkeypatch.setenv("AWS_SECRET", "aws-secret-3")
    args = ["--env-file", str(secrets), "-e", "AWS_SECRET", "-e", "MODE=offline", "-e", "NOT_SET_HERE"]
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    line = dry_run(capsys, *args)
    assert "secret" not in line.replace(str(secrets), "")
    assert f"--env-file {secrets} -e AWS_SECRET -e MODE=offline -e NOT_SET_HERE " in line
    env = json.loads(dry_run(capsys, *args, json_out=True))["config"]["Env"]
    assert not [e for e in env if "secret-" in e]
    assert env[:5] == [
        f"WANDB_API_KEY=<redacted from {secrets}>",
        f"HF_TOKEN=<redacted from {secrets}>",
        "AWS_SECRET=<redacted from the environment>",
        "MODE=offline",
        "NOT_SET_HERE",
    ]


def test_it_needs_a_terminal_only_in_the_foreground(capsys: pytest.CaptureFixture[str], no_daemon: None) -> None:
    # pytest's stdin is not a terminal. In the foreground -it is refused before anything is asked; detached
    # (-itd), docker starts it, and so does hostagent (here it gets as far as the missing daemon: 69).
    assert main(["run", "-it", "--gpu", "0", "img:1"]) == 64
    assert "needs a terminal" in capsys.readouterr().err
    assert main(["run", "-itd", "--gpu", "0", "img:1"]) == 69
    assert "needs a terminal" not in capsys.readouterr().err


@pytest.mark.usefixtures("no_daemon")
def test_a_dry_run_of_a_busy_card_says_what_a_real_run_would_meet(capsys: pytest.CaptureFixture[str]) -> None:
    # mixed-4's card 2 runs pid 4242 (NVML's process list): the line is printed, and the stop it would meet said.
    assert main(["run", "--dry-run", "--gpu", "2", "img:1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("docker run ") and "is in use by pid 4242" in err
    assert "a real run now would be refused (75)" in err
    assert main(["run", "--dry-run", "--wait", "--via", "nvidia", "--gpu", "2", "img:1"]) == 0
    assert "a real run now would wait for it (--wait)" in capsys.readouterr().err
    assert main(["run", "--dry-run", "--share", "--gpu", "2", "img:1"]) == 0  # a process does not stop a sharer
    assert "a real run" not in capsys.readouterr().err


@pytest.mark.usefixtures("no_daemon")
@pytest.mark.parametrize(
    ("argv", "late", "fixed"),
    [
        (["gpupin:test", "--gpu", "1"], "--gpu 1 comes", "hostagent run --gpu 1 gpupin:test"),
        (["gpupin:test", "--count=2"], "--count=2 comes", "hostagent run --count=2 gpupin:test"),
        (
            ["--rm", "img:1", "-e", "A=1", "--uuid", "GPU-95c6", "python3", "x.py"],
            "-e A=1 --uuid GPU-95c6 come",
            "hostagent run --rm -e A=1 --uuid GPU-95c6 img:1 python3 x.py",
        ),
    ],
)
def test_run_options_after_the_image_are_named_with_the_line_that_works(
    capsys: pytest.CaptureFixture[str], argv: list[str], late: str, fixed: str
) -> None:
    """Issue 23, trap 7: `hostagent run IMAGE --gpu 1` said "say which GPUs", not that options go before IMAGE."""
    assert main(["run", *argv]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "say which GPUs" not in err, err
    image = next(a for a in argv if ":" in a)
    assert f"ERROR: {late} after the image {image}: it is passed to the command" in err, err
    assert err.rstrip("\n").endswith(f"HINT: put run's options before IMAGE: {fixed}"), err


@pytest.mark.usefixtures("no_daemon")
def test_a_commands_own_options_after_its_name_are_not_taken_for_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 23, trap 7: only words right after IMAGE are run's options misplaced; `python3 --gpu 1` is the
    command's, and the refusal stays "say which GPUs"."""
    assert main(["run", "img:1", "python3", "train.py", "--gpu", "1"]) == 64
    err = capsys.readouterr().err
    assert "say which GPUs" in err and "after the image" not in err, err
    assert main(["run", "--gpu", "0", "--dry-run", "img:1", "--gpu", "1"]) == 0  # a GPU given: the rest is CMD
    assert capsys.readouterr().out.split()[-3:] == ["img:1", "--gpu", "1"]


@pytest.mark.parametrize(
    ("words", "wait"),
    [
        (["--wait", "5m"], 300.0),
        (["--wait", "1h30m"], 5400.0),
        (["--wait", "90"], 90.0),
        (["--wait=2h"], 7200.0),
        (["--wait"], float("inf")),
    ],
)
def test_wait_takes_seconds_or_the_durations_for_takes(words: list[str], wait: float) -> None:
    """`--wait 5m` waits five minutes: it is never read as an image named `5m` (and the image stays the image)."""
    from gpupin.hostagent.run.args import parse

    args = parse([*words, "--gpu", "0", "img:1", "true"], build_parser())
    assert args.wait == wait and args.image == "img:1" and args.cmd == ["true"]


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["--for", "-5m"], "argument --for: '-5m' is negative: a duration is more than 0"),
        (["--wait", "-5m"], "argument --wait: '-5m' is negative: a duration is more than 0"),
        (["--wait", "-5"], "argument --wait: '-5' is not a wait"),
        (["--for", "0s"], "is no time at all"),
    ],
)
def test_a_negative_for_or_wait_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], no_daemon: None, words: list[str], says: str
) -> None:
    assert main(["run", *words, "--gpu", "0", "img:1", "true"]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "expected one argument" not in err, err

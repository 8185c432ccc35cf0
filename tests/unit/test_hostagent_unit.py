"""hostagent's pure parts: GPU resolution and placement, the ledger's reading of containers, the request's payload."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupin.core.errors import GpuSpecError, GpuUnavailableError, UsageError
from gpupin.core.identity import BusId
from gpupin.core.nvml import Card, MigDevice
from gpupin.hostagent.cli import build_parser, main
from gpupin.hostagent.completion import subcommands
from gpupin.hostagent.gpus import choose_free, free_cards, resolve_spec, resolve_specs
from gpupin.hostagent.run.args import split_run_argv
from gpupin.hostagent.run.request import ContainerSpec, RunRequest
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

A800, RTX, A800B, A800C = uuids("mixed-4")  # NVML order: 1B, 3B, 86 (busy), AF


@pytest.mark.parametrize(
    "spec", [RTX, RTX.upper().replace("GPU-", "gpu-"), RTX[:8], "1", "3b:00.0", "0000:3B:00.0", "00000000:3b:00.0"]
)
def test_every_spec_form_names_the_same_card(spec: str) -> None:
    p = resolve_spec(spec, scenario_cards())
    assert (p.uuid, str(p.bus_id), p.expect_entry()) == (RTX, "00000000:3B:00.0", f"{RTX}@00000000:3B:00.0")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("4", f"GPU index 4 is out of range: this host has 4 card(s) (0 = {A800} at"),
        ("GPU-6c", "ambiguous"),
        ("GPU-ffff", "no card's UUID starts with"),
        ("5e:00.0", "no card at bus id 00000000:5E:00.0"),
        ("zz:00.0", "malformed PCI bus id"),
        ("fastest", "is not a GPU UUID, index, bus id or MIG device"),
        ("", "empty"),
    ],
)
def test_bad_specs_are_64_with_the_reason(spec: str, says: str) -> None:
    with pytest.raises(UsageError) as e:
        resolve_spec(spec, scenario_cards())
    assert says in e.value.message and e.value.exit_code == 64


def test_a_card_twice_and_a_mig_parent_are_refused() -> None:
    with pytest.raises(GpuSpecError, match="already asked for"):
        resolve_specs(["1", RTX], scenario_cards())
    cards = scenario_cards()
    cards[0].mig_mode = True
    cards[0].mig_devices = [MigDevice("MIG-11111111-2222-3333-4444-555555555555", 1, 0, "3g.40gb")]
    with pytest.raises(GpuSpecError, match="MIG mode"):
        resolve_specs(["0"], cards)
    picks = resolve_specs(["MIG-1111", "1"], cards)
    assert [p.uuid for p in picks] == ["MIG-11111111-2222-3333-4444-555555555555", RTX]
    assert picks[0].bus_id == BusId.parse("1b:00.0")


def test_a_lost_card_is_unavailable() -> None:
    cards = scenario_cards()
    cards[2] = Card(2, error="GPU is lost")
    with pytest.raises(GpuUnavailableError, match="GPU is lost"):
        resolve_spec("2", cards)


def test_count_takes_the_most_free_memory_then_the_least_utilization() -> None:
    picks = choose_free(2, scenario_cards(), held=[])
    assert [p.uuid for p in picks or []] == [A800, A800C]
    assert [c.uuid for c in free_cards(scenario_cards(), [A800])] == [A800C, A800B, RTX]
    # equal free memory: the less busy card first
    cards = scenario_cards()
    cards[3].memory_used, cards[3].utilization_gpu = 0, 50
    cards[0].utilization_gpu = 60
    assert [p.uuid for p in choose_free(1, cards, held=[]) or []] == [A800C]


def test_count_returns_none_when_too_few_are_free_and_refuses_the_impossible() -> None:
    assert choose_free(2, scenario_cards(), held=[A800, RTX, A800B]) is None
    with pytest.raises(GpuSpecError, match="only 4"):
        choose_free(5, scenario_cards(), held=[])
    with pytest.raises(GpuSpecError):
        choose_free(0, scenario_cards(), held=[])


def request(environ: dict[str, str] | None = None, **kw: object) -> RunRequest:
    args: dict[str, object] = {"gpus": ["1"]}
    args.update(kw)
    return RunRequest("img:1", ["python", "train.py"], environ=environ or {}, **args)  # type: ignore[arg-type]


def test_the_container_spec_pins_by_uuid_everywhere() -> None:
    picks = resolve_specs(["1", "0"], scenario_cards())
    spec = ContainerSpec(
        request(
            env=["A=1", "HOME_DIR", "B"],
            rm=True,
            name="job",
            verify="torch",
            labels=["team=ml"],
            environ={"HOME_DIR": "/home/x"},
        ),
        picks,
        "nvidia",
    )
    # docker's: -e B with B unset is passed on bare.
    assert [v.entry() for v in spec.env] == [
        "A=1",
        "HOME_DIR=/home/x",
        "B",
        f"NVIDIA_VISIBLE_DEVICES={RTX},{A800}",
        f"GPUPIN_EXPECT={RTX}@00000000:3B:00.0,{A800}@00000000:1B:00.0",
        "GPUPIN_VERIFY=torch",
    ]
    assert spec.labels == {"team": "ml", "gpupin.devices": f"{RTX},{A800}", "gpupin.shared": "false"}
    assert spec.pin.device_request() == {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": [RTX, A800],
        "Capabilities": [["gpu"]],
        "Options": {},
    }
    line = spec.docker_run_line()
    assert line.startswith(f"docker run --name job --rm --gpus '\"device={RTX},{A800}\"' -e A=1 ")
    assert line.endswith("img:1 python train.py")
    payload = spec.to_dict("1.41")
    assert payload["name"] == "job"
    config = payload["config"]
    assert config["HostConfig"]["AutoRemove"] is True and config["Cmd"] == ["python", "train.py"]
    assert config["HostConfig"]["DeviceRequests"] == [spec.pin.device_request()]
    assert config["Labels"] == spec.labels
    assert config["Env"] == ["A=1", "HOME_DIR=<redacted from the environment>", "B", *(v.entry() for v in spec.env[3:])]


def test_dry_run_json_is_the_create_payload_field_for_field() -> None:
    # One builder: --shm-size, --entrypoint and the rest land in the payload the create call sends.
    spec = ContainerSpec(
        request(
            shm_size="8g",
            entrypoint="",
            ipc="host",
            workdir="/w",
            user="1000:1000",
            volumes=["/data:/data:ro"],
            stop_timeout="30",
        ),
        resolve_specs(["1"], scenario_cards()),
        "nvidia",
    )
    c = spec.config("1.41")
    assert c["HostConfig"]["ShmSize"] == 8 * 1024**3 and c["HostConfig"]["IpcMode"] == "host"
    assert c["HostConfig"]["Binds"] == ["/data:/data:ro"] and c["Entrypoint"] == [""]
    assert (c["WorkingDir"], c["User"], c["StopTimeout"]) == ("/w", "1000:1000", 30)
    line = spec.docker_run_line()
    assert "--shm-size 8g" in line and "--entrypoint ''" in line and "--stop-timeout 30" in line


def test_env_file_then_e_as_docker_orders_them(tmp_path: Path) -> None:
    f = tmp_path / "job.env"
    f.write_text("# comment\nLR=0.1\n\nEPOCHS=3\nFROM_SHELL\n")
    spec = ContainerSpec(
        request(env_files=[str(f)], env=["LR=0.2"], environ={"FROM_SHELL": "yes"}),
        resolve_specs(["1"], scenario_cards()),
        "nvidia",
    )
    # The file's lines as they are, then -e: docker keeps both LRs, and the container sees the last.
    assert [v.entry() for v in spec.env][:4] == ["LR=0.1", "EPOCHS=3", "FROM_SHELL=yes", "LR=0.2"]
    f.write_text("BAD LINE=1\n")
    with pytest.raises(UsageError, match="is not KEY=VALUE"):
        request(env_files=[str(f)])
    with pytest.raises(UsageError, match="No such file"):
        request(env_files=[str(tmp_path / "missing")])
    f.write_bytes(b"OK=1\nBAD=\xff\xfe\n")
    with pytest.raises(UsageError, match=":2: not UTF-8 text"):
        request(env_files=[str(f)])


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"gpus": []}, "say which GPUs"),
        ({"gpus": ["1"], "count": 1}, "say which GPUs"),
        ({"verify": "fast"}, "unknown --verify"),
        ({"pull": "sometimes"}, "--pull sometimes: not one of missing, never, always"),
        ({"wait": -1.0}, "--wait"),
        ({"gpus": [], "count": 0}, "ask for at least one card"),
        ({"stop_timeout": "soon"}, "--stop-timeout"),
        ({"labels": ["gpupin.devices=x"]}, "gpupin.devices is the ledger"),
        ({"labels": ["gpupin.shared=true"]}, "hostagent writes gpupin.shared itself"),
    ],
)
def test_bad_requests_are_64(kw: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError, match=says.replace("-", "\\-")):
        request(**kw)  # type: ignore[arg-type]


def test_owned_variables_cannot_be_set_by_hand() -> None:
    with pytest.raises(UsageError, match="sets GPUPIN_EXPECT itself"):
        request(env=[f"GPUPIN_EXPECT={A800}"])


def _split(*argv: str) -> tuple[list[str], str | None, list[str]]:
    return split_run_argv(list(argv), subcommands(build_parser())["run"])


def test_wait_takes_an_optional_number_without_swallowing_the_image() -> None:
    assert _split("--wait", "img", "cmd") == (["--wait"], "img", ["cmd"])
    assert _split("--wait", "30", "img") == (["--wait", "30"], "img", [])
    assert _split("--gpu", "1", "--wait", "img", "python", "-u", "x.py", "--lr", "3") == (
        ["--gpu", "1", "--wait"],
        "img",
        ["python", "-u", "x.py", "--lr", "3"],
    )


@pytest.mark.parametrize(
    ("argv", "split"),
    [
        # options after IMAGE belong to the command, untouched, as with docker run
        (["--gpu", "1", "img", "app", "--wait", "x"], (["--gpu", "1"], "img", ["app", "--wait", "x"])),
        (["--gpu", "1", "img", "--", "a"], (["--gpu", "1"], "img", ["--", "a"])),
        (["--gpu", "1", "--", "img", "--rm"], (["--gpu", "1"], "img", ["--rm"])),
        (
            ["--gpu=1", "-e", "A=1", "-eB=2", "-dv", "/x:/x", "--rm", "img"],
            (["--gpu=1", "-e", "A=1", "-eB=2", "-dv", "/x:/x", "--rm"], "img", []),
        ),
        (["--count", "2", "--name", "img", "busybox"], (["--count", "2", "--name", "img"], "busybox", [])),
        (["--gpu", "1"], (["--gpu", "1"], None, [])),
    ],
)
def test_run_splits_like_docker_run(argv: list[str], split: tuple[list[str], str | None, list[str]]) -> None:
    assert _split(*argv) == split


def test_an_image_that_looks_like_an_option_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Pasting the dry-run line of `-- --privileged alpine sh` would start a privileged container.
    assert main(["run", "--dry-run", "--gpu", "0", "--", "--privileged", "alpine", "sh"]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "IMAGE '--privileged' begins with '-'" in err


@pytest.mark.parametrize("image", ["Upper/Case", "img name", "img:", ":tag", "a..b"])
def test_malformed_image_references_are_refused_before_any_io(image: str) -> None:
    with pytest.raises(UsageError, match="not a valid image reference"):
        RunRequest(image, gpus=["1"])


@pytest.mark.parametrize(
    "image",
    [
        "gpupin:test",
        "busybox",
        "localhost:5000/team/train:v1.2",
        "Registry.io/a/b",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "img@sha256:" + "a" * 64,
        "3f2a9c01b7d4",
    ],
)
def test_image_references_docker_takes(image: str) -> None:
    assert RunRequest(image, gpus=["1"]).image == image


@pytest.mark.parametrize(
    ("port", "says"),
    [
        ("99999:80", "invalid host port '99999'"),
        ("80:70000", "invalid container port '70000'"),
        ("80-70:80-70", "invalid container port '80-70'"),  # the SDK alone publishes nothing for it, silently
        ("8000-8001:80-82", "don't match in length"),
        ("80/icmp", "Invalid port"),
    ],
)
def test_published_ports_docker_run_refuses_are_refused(port: str, says: str) -> None:
    with pytest.raises(UsageError, match=f"--publish '{port}': .*{says}"):
        ContainerSpec(request(publish=["9000", port]), resolve_specs(["1"], scenario_cards()), "nvidia").config("1.41")


def test_published_ports_land_in_the_payload() -> None:
    spec = ContainerSpec(
        request(publish=["127.0.0.1:18080:80/tcp", "8000-8002:90-92", "[::1]:53:53/udp", "0:7"]),
        resolve_specs(["1"], scenario_cards()),
        "nvidia",
    )
    bindings = spec.config("1.41")["HostConfig"]["PortBindings"]
    assert bindings["80/tcp"] == [{"HostIp": "127.0.0.1", "HostPort": "18080"}]
    assert [bindings[f"{p}/tcp"] for p in (90, 91, 92)] == [
        [{"HostIp": "", "HostPort": str(h)}] for h in (8000, 8001, 8002)
    ]
    assert bindings["53/udp"] == [{"HostIp": "::1", "HostPort": "53"}] and "7/tcp" in bindings


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["rn"],
            "invalid choice: 'rn' (choose from ls, run, completion, compose, swarm, doctor, serve, authz, queue, "
            "policy, extend, usage, setup). HINT: did you mean run? see `hostagent --help`",
        ),
        (["compose", "rendr", "x.yml"], "HINT: did you mean render? see `hostagent compose --help`"),
        (["swarm", "nodeconfig"], "HINT: did you mean node-config? see `hostagent swarm --help`"),
        (["run", "--verify", "cdua", "--gpu", "0", "img"], "HINT: did you mean cuda? see `hostagent run --help`"),
        (
            ["xyzzy"],
            "(choose from ls, run, completion, compose, swarm, doctor, serve, authz, queue, policy, extend, usage, "
            "setup). HINT: see `hostagent --help`",
        ),
    ],
)
def test_a_mistyped_command_or_choice_gets_the_nearest_and_no_hidden_one(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "__complete" not in err, err


def test_log_options_without_a_driver_keep_the_daemons_default_driver() -> None:
    spec = ContainerSpec(request(log_opts=["max-size=10m"]), resolve_specs(["1"], scenario_cards()), "nvidia")
    assert spec.config("1.41")["HostConfig"]["LogConfig"] == {"Type": "", "Config": {"max-size": "10m"}}
    assert "--log-opt max-size=10m" in spec.docker_run_line() and "--log-driver" not in spec.docker_run_line()


def test_options_the_sandbox_cannot_apply_still_land_in_the_payload() -> None:
    # --uts host conflicts with the live test's --domainname; swappiness and the OOM switch need cgroup v1; a
    # storage quota needs xfs with pquota: checked in the create payload, as the daemon would get them.
    spec = ContainerSpec(
        request(
            uts="host",
            cgroup_parent="gpupin.slice",
            cpuset_mems="0",
            memory_swappiness="10",
            oom_kill_disable=True,
            storage_opts=["size=20G"],
        ),
        resolve_specs(["1"], scenario_cards()),
        "nvidia",
    )
    host = spec.config("1.41")["HostConfig"]
    assert (host["UTSMode"], host["CgroupParent"], host["CpusetMems"]) == ("host", "gpupin.slice", "0")
    assert (host["MemorySwappiness"], host["OomKillDisable"], host["StorageOpt"]) == (10, True, {"size": "20G"})
    line = spec.docker_run_line()
    assert all(
        f in line
        for f in (
            "--uts host",
            "--cgroup-parent gpupin.slice",
            "--memory-swappiness 10",
            "--oom-kill-disable",
            "--storage-opt size=20G",
        )
    )

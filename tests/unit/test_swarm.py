"""Docker Swarm with GPUs, without a swarm: generic resources as swarmkit reads them, and `hostagent swarm
node-config` (what a node should advertise, and --check of a node's files) on the simulated hosts.
tests/cluster/test_swarm.py configures a real three-node swarm from what node-config prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.swarm.resources import GenericResourceError, env_var, from_engine, parse_terms
from tests.support.host import HOSTAGENT, hostagent, simhost_env
from tests.support.scenarios import swarm_resources, topology


def node_config(*args: str, scenario_name: str = "mixed-4", **env: str) -> subprocess.CompletedProcess[str]:
    return hostagent("swarm", "node-config", *args, scenario_name=scenario_name, timeout=60, **env)


# --- generic resources as swarmkit reads them ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("terms", "read"),
    [
        (["GPU=GPU-a", " GPU = GPU-b "], [("GPU", "GPU-a", False), ("GPU", "GPU-b", False)]),  # trimmed, in order
        (["GPU=2"], [("GPU", "2", True)]),  # one integer: a count
        (["SSD=1", "GPU=GPU-a"], [("SSD", "1", True), ("GPU", "GPU-a", False)]),
        ([], []),
    ],
)
def test_parse_terms(terms: list[str], read: list[tuple[str, str, bool]]) -> None:
    assert [(r.kind, r.value, r.discrete) for r in parse_terms(terms)] == read


@pytest.mark.parametrize(
    ("terms", "says"),
    [
        (["GPU"], "'GPU' is not KIND=VALUE"),
        (["GPU=a=b"], "'GPU=a=b' is not KIND=VALUE"),
        (["GPU=0", "GPU=1"], "GPU mixes counts and names (0, 1)"),  # indices, the common mistake
        (["GPU=1", "GPU=GPU-a"], "GPU mixes counts and names (1, GPU-a)"),
        (["GPU=-1"], "GPU=-1 is a negative count"),
    ],
)
def test_parse_terms_refuses_what_dockerd_refuses(terms: list[str], says: str) -> None:
    with pytest.raises(GenericResourceError, match=re.escape(says)) as info:
        parse_terms(terms)
    assert info.value.exit_code == 64


def test_engine_spelling_and_variable() -> None:
    described: list[dict[str, Any]] = [
        {"NamedResourceSpec": {"Kind": "GPU", "Value": "GPU-a"}},
        {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 2}},
        {"Other": {}},
    ]
    assert [(r.kind, r.value, r.discrete) for r in from_engine(described)] == [
        ("GPU", "GPU-a", False),
        ("SSD", "2", True),
    ]
    assert from_engine(None) == []
    # swarmkit's EnvFormat upper-cases the whole name: Docker's example kind keeps its dash.
    assert (env_var("GPU"), env_var("nvidia-gpu")) == ("DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_NVIDIA-GPU")


# --- node-config on the simulated hosts (no daemon) -----------------------------------------------------------


@pytest.mark.parametrize("name", ["mixed-4", "dgx-8", "mig"])
def test_node_config_advertises_each_card_or_mig_device_once(fakegpu: Path, name: str) -> None:
    r = node_config("--json", scenario_name=name)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    want = swarm_resources(name)
    assert data["daemon_json"] == {
        "node-generic-resources": [f"GPU={u}" for u in want],
        "default-runtime": "nvidia",
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
    }
    assert data["toolkit_config"] == {"swarm-resource": "DOCKER_RESOURCE_GPU"}
    assert [r["uuid"] for r in data["resources"]] == want and data["skipped"] == []


def test_node_config_names_mig_devices_with_their_parent(fakegpu: Path) -> None:
    data = json.loads(node_config("--json", scenario_name="mig").stdout)
    parent = next(g["uuid"] for g in topology("mig")["gpus"] if (g.get("mig") or {}).get("mode") == 1)
    migs = [r for r in data["resources"] if r["parent"]]
    assert [(r["parent"], r["bus_id"], r["name"]) for r in migs] == [
        (parent, "00000000:07:00.0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb")
    ] * 2


def test_node_config_text_and_kind(fakegpu: Path) -> None:
    r = node_config(
        "--kind",
        "NVIDIA-GPU",
        "--runtime-path",
        "/usr/local/bin/nvidia-container-runtime",
        "--daemon-json",
        "/srv/daemon.json",
    )
    assert r.returncode == 0, r.stderr
    text = r.stdout
    block = json.loads(text[text.index("{") : text.index("}\n# 2.") + 1])
    assert block["node-generic-resources"][0] == f"NVIDIA-GPU={swarm_resources('mixed-4')[0]}"
    assert block["runtimes"] == {"nvidia": {"path": "/usr/local/bin/nvidia-container-runtime"}}
    assert "# 1. Merge into /srv/daemon.json, then restart dockerd:" in text
    assert '\nswarm-resource = "DOCKER_RESOURCE_NVIDIA-GPU"\n' in text
    assert "docker service create --generic-resource NVIDIA-GPU=1" in text


def test_node_config_leaves_a_lost_card_out_and_says_why(fakegpu: Path) -> None:
    data = json.loads(node_config("--json", scenario_name="fault-lost").stdout)
    assert len(data["resources"]) == 3
    assert [(s["index"], s["why"]) for s in data["skipped"]] == [(2, "NVML cannot read it: GPU is lost")]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--kind", "GPU=1"], 64, "'GPU=1' is not a usable generic resource kind"),
        (["--kind", ""], 64, "'' is not a usable generic resource kind"),
        (["--check", "--runtime-path", "/x"], 64, "--runtime-path goes with printing the settings"),
        (["--bogus"], 64, "unrecognized arguments: --bogus"),
    ],
)
def test_node_config_bad_usage_is_one_line(fakegpu: Path, args: list[str], code: int, says: str) -> None:
    r = node_config(*args)
    assert (r.returncode, r.stdout) == (code, "")
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("hostagent: ERROR: ") and says in r.stderr
    assert "HINT: " in r.stderr


def test_swarm_without_a_subcommand_is_64(fakegpu: Path) -> None:
    r = subprocess.run([HOSTAGENT, "swarm"], env=simhost_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 64
    assert r.stderr == (
        "hostagent: ERROR: hostagent swarm needs a subcommand. HINT: hostagent swarm node-config [--check]\n"
    )


def test_node_config_without_nvml_is_69(fakegpu: Path) -> None:
    r = node_config(scenario_name="fault-nvml-unknown")
    assert r.returncode == 69 and "Failed to initialize NVML: Unknown Error" in r.stderr
    assert "Traceback" not in r.stderr


def test_node_config_without_cards_is_69(fakegpu: Path, tmp_path: Path) -> None:
    (tmp_path / "none.json").write_text('{"gpus": []}')
    r = node_config(FAKEGPU_TOPOLOGY=str(tmp_path / "none.json"))
    assert (r.returncode, r.stdout) == (69, "")
    assert r.stderr.startswith("hostagent: ERROR: this host has no card to advertise to Swarm (NVML lists no card)")


# --- node-config --check on files (no daemon) -----------------------------------------------------------------


@dataclass
class NodeFiles:
    daemon_json: Path
    toolkit_config: Path

    def write(self, daemon: dict[str, Any] | str | None, toolkit: str | None) -> NodeFiles:
        for path, content in ((self.daemon_json, daemon), (self.toolkit_config, toolkit)):
            if content is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(content if isinstance(content, str) else json.dumps(content))
        return self

    def check(self, *args: str, scenario_name: str = "mixed-4") -> subprocess.CompletedProcess[str]:
        return node_config(
            "--check",
            "--daemon-json",
            str(self.daemon_json),
            "--toolkit-config",
            str(self.toolkit_config),
            *args,
            scenario_name=scenario_name,
        )


def good(name: str = "mixed-4", kind: str = "GPU") -> dict[str, Any]:
    return {
        "node-generic-resources": [f"{kind}={u}" for u in swarm_resources(name)],
        "default-runtime": "nvidia",
        "runtimes": {"nvidia": {"path": "/bin/true"}},
        "log-level": "warn",
    }


def advertising(terms: list[str], name: str = "mixed-4") -> dict[str, Any]:
    return dict(good(name), **{"node-generic-resources": terms})


GOOD_TOML = (
    '#accept-nvidia-visible-devices-as-volume-mounts = false\nswarm-resource = "DOCKER_RESOURCE_GPU"\n'
    "[nvidia-container-cli]\nload-kmods = true\n"
)


@pytest.fixture
def files(tmp_path: Path) -> NodeFiles:
    return NodeFiles(tmp_path / "daemon.json", tmp_path / "config.toml")


def test_check_a_node_configured_as_node_config_says_is_clean(fakegpu: Path, files: NodeFiles) -> None:
    for name in ("mixed-4", "mig"):
        printed = json.loads(node_config("--json", "--runtime-path", "/bin/true", scenario_name=name).stdout)
        files.write(printed["daemon_json"], 'swarm-resource = "DOCKER_RESOURCE_GPU"\n')
        r = files.check(scenario_name=name)
        assert r.returncode == 0, r.stdout
        n = len(swarm_resources(name))
        assert r.stdout == (
            f"{files.daemon_json}, {files.toolkit_config}: OK: {n} GPU resource(s); tasks get them "
            "as DOCKER_RESOURCE_GPU, which the nvidia runtime reads\n"
        )
        data = json.loads(files.check("--json", scenario_name=name).stdout)
        assert data["ok"] is True and data["findings"] == []
        assert [r["card"]["uuid"] for r in data["resources"]] == swarm_resources(name)


def lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    return r.stdout.splitlines()


A800, RTX, A800B, A800C = swarm_resources("mixed-4")
DGX0 = swarm_resources("dgx-8")[0]  # a card of another node


@pytest.mark.parametrize(
    ("daemon", "toolkit", "says"),
    [
        # The trap: Docker's example kind, the toolkit's default variable.
        (
            good(kind="NVIDIA-GPU"),
            GOOD_TOML,
            'config.toml: swarm-resource = "DOCKER_RESOURCE_GPU", but this node '
            "advertises its cards as NVIDIA-GPU (tasks get DOCKER_RESOURCE_NVIDIA-GPU): the runtime ignores "
            "DOCKER_RESOURCE_NVIDIA-GPU and falls back to NVIDIA_VISIBLE_DEVICES, "
            "`all` in CUDA images: every task sees "
            'every card. HINT: advertise the kind it reads ("GPU=<UUID>") or set swarm-resource = '
            '"DOCKER_RESOURCE_NVIDIA-GPU"',
        ),
        (
            good(),
            '#swarm-resource = "DOCKER_RESOURCE_GPU"\n',
            "config.toml: swarm-resource is unset: the runtime ignores DOCKER_RESOURCE_GPU",
        ),
        (good(), None, "config.toml: swarm-resource is unset (no such file: the toolkit's defaults)"),
        (
            good(),
            GOOD_TOML.replace("[", "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n["),
            "config.toml: accept-nvidia-visible-devices-envvar-when-unprivileged = false: the hook ignores device "
            "variables in unprivileged containers, so no Swarm task gets a card",
        ),
        (good(), 'swarm-resource = "DOCKER_RESOURCE_GPU\n', "config.toml: is not valid TOML"),
        (
            advertising(["GPU=4"]),
            GOOD_TOML,
            "daemon.json: GPU=4 is a count, not a "
            "card: each task then gets DOCKER_RESOURCE_GPU=<its count>, which the runtime reads as a card index",
        ),
        (
            advertising(["GPU=0", "GPU=1"]),
            GOOD_TOML,
            "daemon.json: node-generic-resources: GPU mixes counts and names (0, 1), so dockerd refuses to start",
        ),
        (advertising([f"GPU={A800}", "GPU=gpu1"]), GOOD_TOML, "daemon.json: GPU=gpu1 names no card by UUID"),
        (
            advertising([f"GPU={A800[:12]}"]),
            GOOD_TOML,
            f"daemon.json: GPU={A800[:12]} is a UUID prefix: the runtime takes only full UUIDs",
        ),
        (
            advertising([*good()["node-generic-resources"], f"GPU={DGX0}"]),
            GOOD_TOML,
            f"daemon.json: GPU={DGX0}: no such card or MIG device on this host",
        ),
        (
            advertising([*good()["node-generic-resources"], f"GPU={RTX.upper()}"]),
            GOOD_TOML,
            f"daemon.json: {RTX} is advertised twice: Swarm can give it to two tasks at once",
        ),
        (
            {k: v for k, v in good().items() if k != "default-runtime"},
            GOOD_TOML,
            "daemon.json: default-runtime is unset (runc): a Swarm task cannot ask for --gpus",
        ),
        (
            dict(good(), **{"default-runtime": "nvidia-cdi"}),
            GOOD_TOML,
            "daemon.json: default-runtime 'nvidia-cdi' is not in runtimes, so dockerd refuses to start",
        ),
        (
            dict(good(), runtimes={"nvidia": {"path": "/nonexistent/nvidia-container-runtime"}}),
            GOOD_TOML,
            "daemon.json: runtimes.nvidia.path /nonexistent/nvidia-container-runtime is not an executable on this host",
        ),
        ('{"node-generic-resources": [', GOOD_TOML, "daemon.json: is not valid JSON"),
        (None, GOOD_TOML, "daemon.json: no such file: this node advertises no GPU to Swarm"),
        ({"log-level": "warn"}, GOOD_TOML, "daemon.json: advertises no GPU to Swarm"),
    ],
)
def test_check_finds_each_mistake(
    fakegpu: Path, files: NodeFiles, daemon: dict[str, Any] | str | None, toolkit: str | None, says: str
) -> None:
    r = files.write(daemon, toolkit).check()
    assert r.returncode == 64, r.stdout
    found = [line for line in lines(r) if says in line]
    assert found, f"{says!r} not in:\n{r.stdout}"
    assert all(" HINT: " in line for line in lines(r)), r.stdout
    assert "OK:" not in r.stdout
    data = json.loads(files.check("--json").stdout)
    assert data["ok"] is False and any(f["severity"] == "error" for f in data["findings"])


def test_check_an_unreadable_file(fakegpu: Path, files: NodeFiles, tmp_path: Path) -> None:
    files.write(None, GOOD_TOML)
    r = node_config("--check", "--daemon-json", str(tmp_path), "--toolkit-config", str(files.toolkit_config))
    assert r.returncode == 64
    assert lines(r) == [f"{tmp_path}: it is a directory, not a regular file. HINT: point it at the file itself"]


def test_check_refuses_a_fifo_or_a_device_at_once(fakegpu: Path, files: NodeFiles, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    files.write(good(), GOOD_TOML)
    for daemon, toolkit, kind in (
        ("/dev/zero", str(files.toolkit_config), "a character device"),
        (str(fifo), str(files.toolkit_config), "a FIFO"),
        (str(files.daemon_json), str(fifo), "a FIFO"),
    ):
        r = node_config("--check", "--daemon-json", daemon, "--toolkit-config", toolkit)
        assert r.returncode == 64 and "Traceback" not in r.stderr, r
        assert any(
            ln.startswith(f"{daemon if kind != 'a FIFO' or daemon == str(fifo) else toolkit}: it is {kind}")
            for ln in lines(r)
        ), r


@pytest.mark.parametrize(
    ("daemon", "says"),
    [
        (dict(good(), **{"default-runtime": ["nvidia"]}), "default-runtime is a list, not a runtime's name"),
        (dict(good(), **{"default-runtime": 5}), "default-runtime is int, not a runtime's name"),
        ("[" * 100000 + "]" * 100000, "nests too deeply to be read"),
        ('{"a": ' * 100000 + "1" + "}" * 100000, "nests too deeply to be read"),
    ],
)
def test_check_a_daemon_json_of_the_wrong_shape_is_one_line(
    fakegpu: Path, files: NodeFiles, daemon: dict[str, Any] | str, says: str
) -> None:
    r = files.write(daemon, GOOD_TOML).check()
    assert r.returncode == 64 and "Traceback" not in r.stderr, r
    assert any(says in ln for ln in lines(r)), r


def test_check_mig_cards(fakegpu: Path, files: NodeFiles) -> None:
    parent = next(g["uuid"] for g in topology("mig")["gpus"] if (g.get("mig") or {}).get("mode") == 1)
    migs = swarm_resources("mig")[:2]
    whole = advertising([f"GPU={parent}", *good("mig")["node-generic-resources"][2:]], "mig")
    out = lines(files.write(whole, GOOD_TOML).check(scenario_name="mig"))
    assert any(
        f"GPU={parent} is a card in MIG mode, which is no CUDA device: a task given it sees none of its MIG "
        f"devices ({', '.join(migs)})" in line
        for line in out
    ), out
    both = advertising([f"GPU={parent}", *good("mig")["node-generic-resources"]], "mig")
    out = lines(files.write(both, GOOD_TOML).check(scenario_name="mig"))
    assert any(
        f"both {parent} and its MIG device {migs[0]} are advertised: two tasks would share the card" in line
        for line in out
    ), out


def test_check_a_lost_card(fakegpu: Path, files: NodeFiles) -> None:
    out = lines(files.write(good(), GOOD_TOML).check(scenario_name="fault-lost"))
    assert any(
        line.endswith(
            f"GPU={A800B}: no such card or MIG device on this host (cards: {A800}, {RTX}, {A800C})"
            ". HINT: NVML cannot read index 2 (GPU is lost): it may be that card; see `nvidia-smi`"
        )
        for line in out
    ), out
    assert any("warning: the card at index 2 is not usable: NVML cannot read it: GPU is lost" in line for line in out)


def test_check_warns_of_cards_left_out_and_of_another_kind(fakegpu: Path, files: NodeFiles) -> None:
    three = advertising(good()["node-generic-resources"][:3])
    r = files.write(three, GOOD_TOML).check()
    assert r.returncode == 0, r.stdout
    assert lines(r)[0] == (
        f"{files.daemon_json}: warning: {A800C} (index 3, 00000000:AF:00.0, NVIDIA "
        "A800-SXM4-80GB) is not advertised: Swarm never gives it to a task. HINT: add "
        f'"GPU={A800C}" unless it is kept out on purpose'
    )
    assert lines(r)[1].endswith(
        "OK: 3 GPU resource(s); tasks get them as DOCKER_RESOURCE_GPU, which the nvidia runtime reads (1 warning(s))"
    )
    # A node consistent in another kind is fine, unless services ask for the kind given with --kind.
    files.write(good(kind="gpu.nvidia"), 'swarm-resource = "DOCKER_RESOURCE_GPU.NVIDIA"\n')
    assert files.check().returncode == 0
    r = files.check("--kind", "GPU")
    assert (
        r.returncode == 64
        and "advertises its cards as gpu.nvidia, not GPU: services asking --generic-resource GPU=1 get no task here"
        in r.stdout
    )

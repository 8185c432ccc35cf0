"""Docker Swarm with GPUs: `hostagent swarm node-config` on the simulated hosts, and a real three-node swarm
(tests/sandbox/swarm.sh: manager mixed-4, worker1 dgx-8, worker2 mig) whose nodes are configured from what
node-config prints. Swarm's own accounting gives each card to one task, each task gets its own
DOCKER_RESOURCE_GPU, the NVIDIA runtime (faked at its boundary) exposes just that card, and gpupin-entrypoint
proves it; the NVIDIA-GPU naming trap is reproduced on one node and diagnosed by --check."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupin.core.identity import BusId
from gpupin.hostagent.swarm.resources import GenericResourceError, env_var, from_engine, parse_terms
from tests.conftest import HOSTAGENT, REPO, TEST_IMAGE, Sandboxes, simhost_env, topology

SWARM_SCRIPT = REPO / "tests" / "sandbox" / "swarm.sh"
TRAPPED = "worker1"
CUDA_LIKE = "gpupin:all-cards"  # gpupin:test with a CUDA image's NVIDIA_VISIBLE_DEVICES=all


def expected_resources(name: str) -> list[str]:
    """What a node with this topology should advertise, read from the scenario file itself: in NVML (bus) order,
    each whole card, or the MIG devices of a card in MIG mode."""
    out: list[str] = []
    for g in sorted(topology(name)["gpus"], key=lambda g: BusId.parse(g["bus_id"]).key()):
        mig = g.get("mig") or {}
        out += [d["uuid"] for d in mig.get("devices", [])] if mig.get("mode") == 1 else [g["uuid"]]
    return out


def node_config(*args: str, scenario_name: str = "mixed-4", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HOSTAGENT, "swarm", "node-config", *args], env=simhost_env(scenario_name, **env),
                          capture_output=True, text=True, timeout=60)


# --- generic resources as swarmkit reads them ------------------------------------------------------------------


@pytest.mark.parametrize(("terms", "read"), [
    (["GPU=GPU-a", " GPU = GPU-b "], [("GPU", "GPU-a", False), ("GPU", "GPU-b", False)]),  # trimmed, in order
    (["GPU=2"], [("GPU", "2", True)]),  # one integer: a count
    (["SSD=1", "GPU=GPU-a"], [("SSD", "1", True), ("GPU", "GPU-a", False)]),
    ([], []),
])
def test_parse_terms(terms: list[str], read: list[tuple[str, str, bool]]) -> None:
    assert [(r.kind, r.value, r.discrete) for r in parse_terms(terms)] == read


@pytest.mark.parametrize(("terms", "says"), [
    (["GPU"], "'GPU' is not KIND=VALUE"),
    (["GPU=a=b"], "'GPU=a=b' is not KIND=VALUE"),
    (["GPU=0", "GPU=1"], "GPU mixes counts and names (0, 1)"),  # indices, the common mistake
    (["GPU=1", "GPU=GPU-a"], "GPU mixes counts and names (1, GPU-a)"),
    (["GPU=-1"], "GPU=-1 is a negative count"),
])
def test_parse_terms_refuses_what_dockerd_refuses(terms: list[str], says: str) -> None:
    with pytest.raises(GenericResourceError, match=re.escape(says)) as info:
        parse_terms(terms)
    assert info.value.exit_code == 64


def test_engine_spelling_and_variable() -> None:
    described: list[dict[str, Any]] = [{"NamedResourceSpec": {"Kind": "GPU", "Value": "GPU-a"}},
                 {"DiscreteResourceSpec": {"Kind": "SSD", "Value": 2}}, {"Other": {}}]
    assert [(r.kind, r.value, r.discrete) for r in from_engine(described)] == [
        ("GPU", "GPU-a", False), ("SSD", "2", True)]
    assert from_engine(None) == []
    # swarmkit's EnvFormat upper-cases the whole name: Docker's example kind keeps its dash.
    assert (env_var("GPU"), env_var("nvidia-gpu")) == ("DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_NVIDIA-GPU")


# --- node-config on the simulated hosts (no daemon) -----------------------------------------------------------


@pytest.mark.parametrize("name", ["mixed-4", "dgx-8", "mig"])
def test_node_config_advertises_each_card_or_mig_device_once(fakegpu: Path, name: str) -> None:
    r = node_config("--json", scenario_name=name)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    want = expected_resources(name)
    assert data["daemon_json"] == {"node-generic-resources": [f"GPU={u}" for u in want],
                                   "default-runtime": "nvidia",
                                   "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
    assert data["toolkit_config"] == {"swarm-resource": "DOCKER_RESOURCE_GPU"}
    assert [r["uuid"] for r in data["resources"]] == want and data["skipped"] == []


def test_node_config_names_mig_devices_with_their_parent(fakegpu: Path) -> None:
    data = json.loads(node_config("--json", scenario_name="mig").stdout)
    parent = next(g["uuid"] for g in topology("mig")["gpus"] if (g.get("mig") or {}).get("mode") == 1)
    migs = [r for r in data["resources"] if r["parent"]]
    assert [(r["parent"], r["bus_id"], r["name"]) for r in migs] == [
        (parent, "00000000:07:00.0", "NVIDIA A100-SXM4-40GB MIG 3g.20gb")] * 2


def test_node_config_text_and_kind(fakegpu: Path) -> None:
    r = node_config("--kind", "NVIDIA-GPU", "--runtime-path", "/usr/local/bin/nvidia-container-runtime",
                    "--daemon-json", "/srv/daemon.json")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    block = json.loads(text[text.index("{"):text.index("}\n# 2.") + 1])
    assert block["node-generic-resources"][0] == f"NVIDIA-GPU={expected_resources('mixed-4')[0]}"
    assert block["runtimes"] == {"nvidia": {"path": "/usr/local/bin/nvidia-container-runtime"}}
    assert "# 1. Merge into /srv/daemon.json, then restart dockerd:" in text
    assert '\nswarm-resource = "DOCKER_RESOURCE_NVIDIA-GPU"\n' in text
    assert "docker service create --generic-resource NVIDIA-GPU=1" in text


def test_node_config_leaves_a_lost_card_out_and_says_why(fakegpu: Path) -> None:
    data = json.loads(node_config("--json", scenario_name="fault-lost").stdout)
    assert len(data["resources"]) == 3
    assert [(s["index"], s["why"]) for s in data["skipped"]] == [(2, "NVML cannot read it: GPU is lost")]


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--kind", "GPU=1"], 64, "'GPU=1' is not a usable generic resource kind"),
    (["--kind", ""], 64, "'' is not a usable generic resource kind"),
    (["--check", "--runtime-path", "/x"], 64, "--runtime-path goes with printing the settings"),
    (["--bogus"], 64, "unrecognized arguments: --bogus"),
])
def test_node_config_bad_usage_is_one_line(fakegpu: Path, args: list[str], code: int, says: str) -> None:
    r = node_config(*args)
    assert (r.returncode, r.stdout) == (code, "")
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("hostagent: ERROR: ") and says in r.stderr
    assert "HINT: " in r.stderr


def test_swarm_without_a_subcommand_is_64(fakegpu: Path) -> None:
    r = subprocess.run([HOSTAGENT, "swarm"], env=simhost_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 64
    assert r.stderr == ("hostagent: ERROR: hostagent swarm needs a subcommand. HINT: hostagent swarm node-config "
                        "[--check]\n")


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
        return node_config("--check", "--daemon-json", str(self.daemon_json), "--toolkit-config",
                           str(self.toolkit_config), *args, scenario_name=scenario_name)


def good(name: str = "mixed-4", kind: str = "GPU") -> dict[str, Any]:
    return {"node-generic-resources": [f"{kind}={u}" for u in expected_resources(name)],
            "default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "/bin/true"}}, "log-level": "warn"}


def advertising(terms: list[str], name: str = "mixed-4") -> dict[str, Any]:
    return dict(good(name), **{"node-generic-resources": terms})


GOOD_TOML = '#accept-nvidia-visible-devices-as-volume-mounts = false\nswarm-resource = "DOCKER_RESOURCE_GPU"\n' \
            '[nvidia-container-cli]\nload-kmods = true\n'


@pytest.fixture
def files(tmp_path: Path) -> NodeFiles:
    return NodeFiles(tmp_path / "daemon.json", tmp_path / "config.toml")


def test_check_a_node_configured_as_node_config_says_is_clean(fakegpu: Path, files: NodeFiles) -> None:
    for name in ("mixed-4", "mig"):
        printed = json.loads(node_config("--json", "--runtime-path", "/bin/true", scenario_name=name).stdout)
        files.write(printed["daemon_json"], 'swarm-resource = "DOCKER_RESOURCE_GPU"\n')
        r = files.check(scenario_name=name)
        assert r.returncode == 0, r.stdout
        n = len(expected_resources(name))
        assert r.stdout == (f"{files.daemon_json}, {files.toolkit_config}: OK: {n} GPU resource(s); tasks get them "
                            "as DOCKER_RESOURCE_GPU, which the nvidia runtime reads\n")
        data = json.loads(files.check("--json", scenario_name=name).stdout)
        assert data["ok"] is True and data["findings"] == []
        assert [r["card"]["uuid"] for r in data["resources"]] == expected_resources(name)


def lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    return r.stdout.splitlines()


A800, RTX, A800B, A800C = expected_resources("mixed-4")
DGX0 = expected_resources("dgx-8")[0]  # a card of another node


@pytest.mark.parametrize(("daemon", "toolkit", "says"), [
    # The trap: Docker's example kind, the toolkit's default variable.
    (good(kind="NVIDIA-GPU"), GOOD_TOML, 'config.toml: swarm-resource = "DOCKER_RESOURCE_GPU", but this node '
     "advertises its cards as NVIDIA-GPU (tasks get DOCKER_RESOURCE_NVIDIA-GPU): the runtime ignores "
     "DOCKER_RESOURCE_NVIDIA-GPU and falls back to NVIDIA_VISIBLE_DEVICES, `all` in CUDA images: every task sees "
     'every card. HINT: advertise the kind it reads ("GPU=<UUID>") or set swarm-resource = '
     '"DOCKER_RESOURCE_NVIDIA-GPU"'),
    (good(), '#swarm-resource = "DOCKER_RESOURCE_GPU"\n', "config.toml: swarm-resource is unset: the runtime "
     "ignores DOCKER_RESOURCE_GPU"),
    (good(), None, "config.toml: swarm-resource is unset (no such file: the toolkit's defaults)"),
    (good(), GOOD_TOML.replace("[", "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n["),
     "config.toml: accept-nvidia-visible-devices-envvar-when-unprivileged = false: the hook ignores device "
     "variables in unprivileged containers, so no Swarm task gets a card"),
    (good(), 'swarm-resource = "DOCKER_RESOURCE_GPU\n', "config.toml: is not valid TOML"),
    (advertising(["GPU=4"]), GOOD_TOML, "daemon.json: GPU=4 is a count, not a "
     "card: each task then gets DOCKER_RESOURCE_GPU=<its count>, which the runtime reads as a card index"),
    (advertising(["GPU=0", "GPU=1"]), GOOD_TOML, "daemon.json: "
     "node-generic-resources: GPU mixes counts and names (0, 1), so dockerd refuses to start"),
    (advertising([f"GPU={A800}", "GPU=gpu1"]), GOOD_TOML,
     "daemon.json: GPU=gpu1 names no card by UUID"),
    (advertising([f"GPU={A800[:12]}"]), GOOD_TOML,
     f"daemon.json: GPU={A800[:12]} is a UUID prefix: the runtime takes only full UUIDs"),
    (advertising([*good()["node-generic-resources"], f"GPU={DGX0}"]), GOOD_TOML,
     f"daemon.json: GPU={DGX0}: no such card or MIG device on this host"),
    (advertising([*good()["node-generic-resources"], f"GPU={RTX.upper()}"]),
     GOOD_TOML, f"daemon.json: {RTX} is advertised twice: Swarm can give it to two tasks at once"),
    ({k: v for k, v in good().items() if k != "default-runtime"}, GOOD_TOML, "daemon.json: default-runtime is "
     "unset (runc): a Swarm task cannot ask for --gpus"),
    (dict(good(), **{"default-runtime": "nvidia-cdi"}), GOOD_TOML,
     "daemon.json: default-runtime 'nvidia-cdi' is not in runtimes, so dockerd refuses to start"),
    (dict(good(), runtimes={"nvidia": {"path": "/nonexistent/nvidia-container-runtime"}}), GOOD_TOML,
     "daemon.json: runtimes.nvidia.path /nonexistent/nvidia-container-runtime is not an executable on this host"),
    ('{"node-generic-resources": [', GOOD_TOML, "daemon.json: is not valid JSON"),
    (None, GOOD_TOML, "daemon.json: no such file: this node advertises no GPU to Swarm"),
    ({"log-level": "warn"}, GOOD_TOML, "daemon.json: advertises no GPU to Swarm"),
])
def test_check_finds_each_mistake(fakegpu: Path, files: NodeFiles, daemon: dict[str, Any] | str | None,
                                  toolkit: str | None, says: str) -> None:
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
    assert lines(r) == [f"{tmp_path}: cannot be read (Is a directory). HINT: run the check as root, or point it at "
                        "a readable copy"]


def test_check_mig_cards(fakegpu: Path, files: NodeFiles) -> None:
    parent = next(g["uuid"] for g in topology("mig")["gpus"] if (g.get("mig") or {}).get("mode") == 1)
    migs = expected_resources("mig")[:2]
    whole = advertising([f"GPU={parent}", *good("mig")["node-generic-resources"][2:]], "mig")
    out = lines(files.write(whole, GOOD_TOML).check(scenario_name="mig"))
    assert any(f"GPU={parent} is a card in MIG mode, which is no CUDA device: a task given it sees none of its MIG "
               f"devices ({', '.join(migs)})" in line for line in out), out
    both = advertising([f"GPU={parent}", *good("mig")["node-generic-resources"]], "mig")
    out = lines(files.write(both, GOOD_TOML).check(scenario_name="mig"))
    assert any(f"both {parent} and its MIG device {migs[0]} are advertised: two tasks would share the card" in line
               for line in out), out


def test_check_a_lost_card(fakegpu: Path, files: NodeFiles) -> None:
    out = lines(files.write(good(), GOOD_TOML).check(scenario_name="fault-lost"))
    assert any(line.endswith(f"GPU={A800B}: no such card or MIG device on this host (cards: {A800}, {RTX}, {A800C})"
                             ". HINT: NVML cannot read index 2 (GPU is lost): it may be that card; see `nvidia-smi`")
               for line in out), out
    assert any("warning: the card at index 2 is not usable: NVML cannot read it: GPU is lost" in line for line in out)


def test_check_warns_of_cards_left_out_and_of_another_kind(fakegpu: Path, files: NodeFiles) -> None:
    three = advertising(good()["node-generic-resources"][:3])
    r = files.write(three, GOOD_TOML).check()
    assert r.returncode == 0, r.stdout
    assert lines(r)[0] == (f"{files.daemon_json}: warning: {A800C} (index 3, 00000000:AF:00.0, NVIDIA "
                           "A800-SXM4-80GB) is not advertised: Swarm never gives it to a task. HINT: add "
                           f'"GPU={A800C}" unless it is kept out on purpose')
    assert lines(r)[1].endswith("OK: 3 GPU resource(s); tasks get them as DOCKER_RESOURCE_GPU, which the nvidia "
                                "runtime reads (1 warning(s))")
    # A node consistent in another kind is fine, unless services ask for the kind given with --kind.
    files.write(good(kind="gpu.nvidia"), 'swarm-resource = "DOCKER_RESOURCE_GPU.NVIDIA"\n')
    assert files.check().returncode == 0
    r = files.check("--kind", "GPU")
    assert r.returncode == 64 and "advertises its cards as gpu.nvidia, not GPU: services asking " \
        "--generic-resource GPU=1 get no task here" in r.stdout


# --- the cluster ----------------------------------------------------------------------------------------------


@dataclass
class Node:
    name: str
    host: str
    topology: str
    address: str
    kind: str

    @property
    def run_dir(self) -> Path:
        return Path(self.host.removeprefix("unix://")).parent

    def check(self, *args: str) -> subprocess.CompletedProcess[str]:
        return node_config("--check", "--daemon-json", str(self.run_dir / "daemon.json"), "--toolkit-config",
                           str(self.run_dir / "nvidia-container-runtime" / "config.toml"), *args,
                           scenario_name=self.topology)


class Cluster:
    """The swarm of tests/sandbox/swarm.sh, driven by the real docker CLI against each node's own socket."""

    def __init__(self, image_source: str, docker_cli: str) -> None:
        self.image_source = image_source
        self.docker_cli = docker_cli
        self.nodes: dict[str, Node] = {}
        self.up_seconds = 0.0

    def up(self, trap: str = "") -> None:
        env = dict(os.environ, GPUPIN_SWARM_IMAGE_SOURCE=self.image_source, GPUPIN_SWARM_TRAP=trap)
        start = time.monotonic()
        r = subprocess.run([str(SWARM_SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=600)
        self.up_seconds = time.monotonic() - start
        if r.returncode != 0:
            pytest.fail(f"swarm.sh up failed ({r.returncode}):\n{r.stderr}", pytrace=False)
        self.nodes = {}
        for line in r.stdout.splitlines():
            name, host, topo, address, kind = line.split()
            self.nodes[name] = Node(name, host, Path(topo).stem, address, kind)

    def down(self) -> None:
        subprocess.run([str(SWARM_SCRIPT), "down"], capture_output=True, timeout=300)

    def docker(self, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([self.docker_cli, "-H", self.nodes[node].host, *args], capture_output=True, text=True,
                           timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:3])} on {node}: {r.stderr.strip()}")
        return r

    def manager(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.docker("manager", *args, check=check)

    def tasks(self, service: str, every: bool = False) -> list[dict[str, str]]:
        """The service's current tasks (desired state running; `every`: its history too), as `docker service ps`
        reports them."""
        current = () if every else ("--filter", "desired-state=running")
        out = self.manager("service", "ps", service, "--no-trunc", *current, "--format", "{{json .}}").stdout
        return [json.loads(line) for line in out.splitlines()]

    def printed(self, service: str, running: bool = True) -> list[tuple[str, dict[str, Any]]]:
        """Every JSON line the service's containers (running ones, or all) have printed so far, with the node."""
        found = []
        for node in self.nodes:
            ids = self.docker(node, "ps", "-q", *(() if running else ("-a",)), "--filter",
                              f"label=com.docker.swarm.service.name={service}").stdout
            for cid in ids.split():
                logs = self.docker(node, "logs", cid)
                found += [(node, json.loads(x)) for x in (logs.stdout + logs.stderr).splitlines() if x.startswith("{")]
        return found

    def probes(self, service: str) -> list[tuple[str, dict[str, Any]]]:
        """What each running task of the service has printed so far (PROBE's JSON line), with its node."""
        return [(node, x) for node, x in self.printed(service) if "env" in x]

    def reports(self, service: str) -> list[tuple[str, dict[str, Any]]]:
        """gpupin-entrypoint's --json report of each running task (on stderr, as it is given a command)."""
        return [(node, x) for node, x in self.printed(service) if "level" in x and "devices" in x]

    def hostagent(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """hostagent on the manager's host, talking to the manager (whose cards NVML sees: mixed-4)."""
        r = subprocess.run([HOSTAGENT, *args], env=simhost_env(self.nodes["manager"].topology,
                                                               DOCKER_HOST=self.nodes["manager"].host),
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"hostagent {' '.join(args)}: {r.returncode}: {r.stderr.strip()}")
        return r

    def ls(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.hostagent("ls", "--swarm", "--json").stdout)
        return data

    def node_op(self, op: str, node: str) -> None:
        """swarm.sh stop-node|start-node NODE."""
        subprocess.run([str(SWARM_SCRIPT), op, node], check=True, capture_output=True, timeout=120)

    def containers_gone(self, label: str, timeout: float = 60) -> None:
        wait_until(lambda: not any(self.docker(n, "ps", "-aq", "--filter", f"label={label}").stdout.strip()
                                   for n in self.nodes if self.docker(n, "version", check=False).returncode == 0),
                   timeout, f"the containers labelled {label} to go")

    @contextmanager
    def stack(self, name: str, source: str, *render_args: str, tmp: Path) -> Iterator[str]:
        """`hostagent compose render --swarm` of `source` (a compose file's text), then `docker stack deploy` of the
        rendered file on the manager, removed afterwards. Yields the rendered file's path."""
        (tmp / f"{name}.yml").write_text(source)
        rendered = tmp / f"{name}.stack.yml"
        self.hostagent("compose", "render", "--swarm", *render_args, str(tmp / f"{name}.yml"), "-o", str(rendered))
        self.manager("stack", "deploy", "--resolve-image", "never", "-c", str(rendered), name)
        try:
            yield str(rendered)
        finally:
            self.manager("stack", "rm", name, check=False)
            self.containers_gone(f"com.docker.stack.namespace={name}")

    @contextmanager
    def service(self, name: str, *args: str) -> Iterator[str]:
        self.manager("service", "create", "-d", "--name", name, "--restart-condition", "none",
                     "--no-resolve-image", *args)
        try:
            yield name
        finally:
            self.manager("service", "rm", name, check=False)
            self.containers_gone(f"com.docker.swarm.service.name={name}")


def wait_until(ready: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


# What a task reports of itself: Swarm's and the runtime's variables, and the cards and MIG devices its NVML sees.
PROBE = """
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
out = {"env": {k: v for k, v in os.environ.items() if k.startswith(("DOCKER_RESOURCE_", "NVIDIA_", "CUDA_", "SWARM_"))}}
try:
    import pynvml as n
    n.nvmlInit()
    out["cards"], out["migs"] = [], []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        out["cards"].append(n.nvmlDeviceGetUUID(h))
        if n.nvmlDeviceGetMigMode(h)[0]:
            for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    out["migs"].append(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
                except n.NVMLError:
                    pass
except Exception as e:
    out["error"] = str(e)
print(json.dumps(out), flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="session")
def swarm(sandboxes: Sandboxes) -> Iterator[Cluster]:
    """The three-node swarm of Debian 12 daemons, started once (gpupin:test comes from the 20.10 sandbox) and
    stopped at the end."""
    source = sandboxes.get("20.10")
    cluster = Cluster(source.host, source.docker_cli)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def all_resources(cluster: Cluster) -> dict[str, str]:
    """Every card of the swarm: advertised value -> node."""
    return {u: node.name for node in cluster.nodes.values() for u in expected_resources(node.topology)}


def parent_of(uuid: str, topology_name: str) -> str:
    return next(str(g["uuid"]) for g in topology(topology_name)["gpus"]
                if uuid == g["uuid"] or uuid in [d["uuid"] for d in (g.get("mig") or {}).get("devices", [])])


def test_three_nodes_joined_with_their_generic_resources(swarm: Cluster) -> None:
    assert swarm.up_seconds < 120, f"swarm.sh up took {swarm.up_seconds:.1f} s"
    rows = [json.loads(x) for x in swarm.manager("node", "ls", "--format", "{{json .}}").stdout.splitlines()]
    assert sorted((r["Hostname"], r["Status"], r["ManagerStatus"]) for r in rows) == [
        ("manager", "Ready", "Leader"), ("worker1", "Ready", ""), ("worker2", "Ready", "")]
    for node in swarm.nodes.values():
        described = json.loads(swarm.manager("node", "inspect", node.name, "--format",
                                             "{{json .Description.Resources.GenericResources}}").stdout)
        assert [(r.kind, r.value, r.discrete) for r in from_engine(described)] == [
            ("GPU", u, False) for u in expected_resources(node.topology)], node.name
    # The nodes joined at the addresses the setup made inside their namespaces; the host's own namespace has none.
    for node in swarm.nodes.values():
        assert swarm.manager("node", "inspect", node.name, "--format", "{{.Status.Addr}}").stdout.strip() == \
            node.address
        host_addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
        assert f" {node.address}/" not in host_addresses


def compose_source(service: str, replicas: int, body: str = "x-gpupin: {count: 1}", command: str = PROBE,
                   entrypoint: tuple[str, ...] = ("gpupin-entrypoint", "--json"),
                   environment: dict[str, str] | None = None) -> str:
    """A compose file as a user writes it for the swarm: x-gpupin asks for a count, replicas for more tasks. Its
    tasks use the host's network (the sandboxed daemons make no overlay network), are not restarted, and know their
    task ID (a service template the daemon fills in)."""
    svc: dict[str, Any] = {
        "image": TEST_IMAGE, "entrypoint": list(entrypoint), "command": ["python3", "-c", command],
        "environment": {"SWARM_TASK_ID": "{{.Task.ID}}", **(environment or {})},
        "deploy": {"replicas": replicas, "restart_policy": {"condition": "none"}}, "networks": ["hostnet"]}
    svc.update(yaml.safe_load(body) or {})
    doc = {"services": {service: svc}, "networks": {"hostnet": {"external": True, "name": "host"}}}
    return str(yaml.safe_dump(doc, sort_keys=False))


STACK = "gp"


def test_ls_swarm_from_a_worker_is_69_in_one_line(swarm: Cluster) -> None:
    worker = swarm.nodes["worker1"]
    r = subprocess.run([HOSTAGENT, "ls", "--swarm"], env=simhost_env(worker.topology, DOCKER_HOST=worker.host),
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (69, "")
    assert r.stderr.startswith(f"hostagent: ERROR: the Docker daemon at {worker.host} is not a swarm manager: it is "
                               "a worker of a swarm (node ")
    assert r.stderr.endswith("HINT: point DOCKER_HOST at a manager of the swarm (`docker node ls` works there)\n")
    assert r.stderr.count("\n") == 1


@pytest.fixture(scope="class")
def every_card(swarm: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`hostagent compose render --swarm` of a compose file with one replica per card of the swarm (x-gpupin
    count 1), deployed with `docker stack deploy`; each task runs PROBE behind gpupin-entrypoint --json."""
    n = len(all_resources(swarm))
    tmp = tmp_path_factory.mktemp("every-card")
    with swarm.stack(STACK, compose_source("every-card", n), tmp=tmp):
        name = f"{STACK}_every-card"
        wait_until(lambda: sum(t["CurrentState"].startswith("Running") for t in swarm.tasks(name)) == n
                   and len(swarm.probes(name)) == n, 180, f"{n} running tasks")
        yield name, n


class TestEveryCard:
    """A rendered stack with one replica per card of the swarm (torn down before the trap reconfigures a node)."""

    def test_the_rendered_stack_reserves_one_card_per_task(self, swarm: Cluster, every_card: tuple[str, int]) -> None:
        name, n = every_card
        spec = json.loads(swarm.manager("service", "inspect", name, "--format", "{{json .Spec}}").stdout)
        task = spec["TaskTemplate"]
        assert task["Resources"]["Reservations"]["GenericResources"] == [
            {"DiscreteResourceSpec": {"Kind": "GPU", "Value": 1}}]
        assert spec["Mode"] == {"Replicated": {"Replicas": n}}
        assert "GPUPIN_REQUIRE=1" in task["ContainerSpec"]["Env"]

    def test_each_task_gets_its_own_card_and_sees_only_it(self, swarm: Cluster, every_card: tuple[str, int]) -> None:
        name, n = every_card
        cards = all_resources(swarm)
        probes = swarm.probes(name)
        given = [p["env"].get("DOCKER_RESOURCE_GPU") for _, p in probes]
        assert sorted(given) == sorted(cards), "each card to exactly one task"
        for node, p in probes:
            uuid = p["env"]["DOCKER_RESOURCE_GPU"]
            assert cards[uuid] == node, f"{uuid} is a card of {cards[uuid]}, its task ran on {node}"
            topo = swarm.nodes[node].topology
            if uuid.startswith("MIG-"):
                assert (p["cards"], p["migs"]) == ([parent_of(uuid, topo)], [uuid]), p
            else:
                assert (p["cards"], p["migs"]) == ([uuid], []), p
            # gpupin-entrypoint took the expectation from DOCKER_RESOURCE_GPU, proved cuda:0 and let the task run.
            assert p["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "NVIDIA_VISIBLE_DEVICES" not in p["env"], p
        assert len(probes) == n

    def test_each_task_proves_its_card_from_inside(self, swarm: Cluster, every_card: tuple[str, int]) -> None:
        """The entrypoint's own report (--json) in every task: the CUDA driver under the final environment said
        cuda:0 is the card Swarm gave the task."""
        name, n = every_card
        reports = swarm.reports(name)
        assert len(reports) == n
        proved = set()
        for node, r in reports:
            assert (r["level"], r["source"]) == ("cuda", "DOCKER_RESOURCE_GPU"), r
            (dev,) = r["devices"]
            assert (dev["cuda"], dev["uuid"]) == ("cuda:0", r["expectation"].split("@")[0]), r
            assert all_resources(swarm)[dev["uuid"]] == node
            proved.add(dev["uuid"])
        assert proved == set(all_resources(swarm))

    def test_ls_swarm_shows_every_card_held_and_agrees_with_docker(self, swarm: Cluster,
                                                                  every_card: tuple[str, int]) -> None:
        name, n = every_card
        data = swarm.ls()
        assert data["summary"] == {"nodes": 3, "resources": n, "held": n, "free": 0, "pending": 0}
        holders = {(nd["hostname"], r["value"]): r["held_by"] for nd in data["nodes"] for r in nd["resources"]}
        # The same facts from the docker CLI: `docker node ls` for the nodes, `docker service ps` for the tasks.
        nodes = {json.loads(x)["Hostname"] for x in swarm.manager("node", "ls", "--format", "{{json .}}")
                 .stdout.splitlines()}
        assert {nd["hostname"] for nd in data["nodes"]} == nodes
        running = {(t["Name"], t["Node"]) for t in swarm.tasks(name) if t["CurrentState"].startswith("Running")}
        assert {(h["name"], h["node"]) for h in holders.values() if h} == running
        # Each holder is the task that says, from inside, that it has that card.
        inside = {p["env"]["SWARM_TASK_ID"]: p["env"]["DOCKER_RESOURCE_GPU"] for _, p in swarm.probes(name)}
        assert {h["id"]: value for (_, value), h in holders.items() if h} == inside
        # The manager's own cards are resolved through NVML; the workers' are shown by UUID.
        manager = next(nd for nd in data["nodes"] if nd["hostname"] == "manager")
        assert manager["self"] and [r["card"]["bus_id"] for r in manager["resources"]] == [
            "00000000:1B:00.0", "00000000:3B:00.0", "00000000:86:00.0", "00000000:AF:00.0"]
        text = swarm.hostagent("ls", "--swarm").stdout
        assert text.splitlines()[-1] == f"3 node(s), {n} advertised resource(s): {n} held, 0 free; 0 task(s) pending"

    def test_hostagent_run_on_a_node_does_not_take_a_card_a_task_holds(self, swarm: Cluster,
                                                                          every_card: tuple[str, int]) -> None:
        """The node's own ledger (`hostagent ls`, `run`) counts what Swarm gave its tasks (DOCKER_RESOURCE_GPU under
        the nvidia runtime): a local run on a busy swarm node waits or refuses, it never shares a task's card."""
        name, _ = every_card
        data = json.loads(swarm.hostagent("ls", "--json").stdout)
        held = {g["uuid"]: [(gr["form"], h["name"]) for h in g["holders"] for gr in h["grants"]] for g in data["gpus"]}
        assert all(len(v) == 1 and v[0][0] == "swarm-resource" and v[0][1].startswith(f"{name}.")
                   for v in held.values()), held
        r = swarm.hostagent("run", "--dry-run", "--count", "1", TEST_IMAGE, "true", check=False)
        assert r.returncode == 75, r.stderr
        assert "--count 1: 0 of 4 card(s) are free" in r.stderr

    def test_one_replica_more_than_cards_stays_pending(self, swarm: Cluster, every_card: tuple[str, int],
                                                        tmp_path: Path) -> None:
        name, n = every_card
        before = sorted(p["env"]["DOCKER_RESOURCE_GPU"] for _, p in swarm.probes(name))
        # Rendered again with N + 1 replicas: render says one will wait, and the stack is updated in place.
        (tmp_path / "more.yml").write_text(compose_source("every-card", n + 1))
        r = swarm.hostagent("compose", "render", "--swarm", str(tmp_path / "more.yml"), "-o", str(tmp_path / "s.yml"))
        assert f"warning: asks for {n + 1} replica(s) x 1 GPU, but the nodes it may run on now hold {n} such task(s) " \
               "at a time" in r.stderr
        swarm.manager("stack", "deploy", "--resolve-image", "never", "-c", str(tmp_path / "s.yml"), STACK)

        def pending() -> list[dict[str, str]]:
            return [t for t in swarm.tasks(name) if t["CurrentState"].startswith("Pending")
                    and "insufficient resources on 3 nodes" in t["Error"]]

        (extra,) = wait_until(pending, 60, "the extra task to be refused for want of resources")
        assert extra["Node"] == ""
        time.sleep(2)  # the scheduler retries; the task must stay pending and no card may be given twice
        assert len(pending()) == 1
        running = [t for t in swarm.tasks(name) if t["CurrentState"].startswith("Running")]
        assert len(running) == n
        assert sorted(p["env"]["DOCKER_RESOURCE_GPU"] for _, p in swarm.probes(name)) == before
        # ls --swarm says which task waits and why, in Swarm's words.
        data = swarm.ls()
        assert [(p["name"], p["reserves"]) for p in data["pending"]] == [(extra["Name"], ["GPU=1"])]
        assert "no suitable node (insufficient resources on 3 nodes)" in data["pending"][0]["why"]
        assert data["summary"]["free"] == 0 and data["summary"]["pending"] == 1
        text = swarm.hostagent("ls", "--swarm").stdout
        assert f"PENDING  {extra['Name']} ({extra['ID'][:12]}) (reserves GPU=1): no suitable node (insufficient " \
               "resources on 3 nodes)" in text
        swarm.manager("service", "scale", "-d", f"{name}={n}")


# A task that logs, every 0.2 s until it is stopped, which card Swarm gave it and which cards its NVML sees, to a
# file of its own in a folder every node mounts (the nodes share the host's file system and clock).
HOLDER = """
import json, os, signal, sys, time
import pynvml as n
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
n.nvmlInit()
seen = []
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    if not n.nvmlDeviceGetMigMode(h)[0]:
        seen.append(n.nvmlDeviceGetUUID(h))
        continue
    for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            seen.append(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)))
        except n.NVMLError:
            pass
task, gpu = os.environ["SWARM_TASK_ID"], os.environ["DOCKER_RESOURCE_GPU"]
with open(f"/holds/{task}.jsonl", "a", buffering=1) as f:
    while True:
        f.write(json.dumps({"t": time.time(), "task": task, "node": os.environ["SWARM_NODE"], "gpu": gpu,
                            "seen": seen}) + "\\n")
        time.sleep(0.2)
"""


class Hold:
    """One task's holding of its card, as the task logged it from inside."""

    def __init__(self, ticks: list[dict[str, Any]]) -> None:
        self.task = ticks[0]["task"]
        self.node = ticks[0]["node"]
        self.gpu = ticks[0]["gpu"]
        self.seen = {u for t in ticks for u in t["seen"]}
        self.start = ticks[0]["t"]
        self.end = ticks[-1]["t"]


def holds(folder: Path) -> list[Hold]:
    out = []
    for f in sorted(folder.glob("*.jsonl")):
        ticks = [json.loads(line) for line in f.read_text().splitlines() if line.endswith("}")]
        if ticks:
            out.append(Hold(ticks))
    return out


def running_on(swarm: Cluster, name: str) -> dict[str, int]:
    """How many of the service's tasks run on each node, as Swarm reports them."""
    out: dict[str, int] = {}
    for t in swarm.tasks(name):
        if t["CurrentState"].startswith("Running"):
            out[t["Node"]] = out.get(t["Node"], 0) + 1
    return out


def test_a_drained_then_stopped_worker_and_a_stopped_one_never_put_two_tasks_on_one_card(
        swarm: Cluster, tmp_path: Path) -> None:
    """Four tasks of one GPU each. A worker with tasks is drained (they move to free cards elsewhere), then its
    daemon is stopped; then the other worker's daemon is stopped without a drain (Swarm reschedules its tasks once
    it marks the node down). Every task logs, from inside, the card it was given and the cards its NVML sees: no
    task ever sees another card than its own, and no card has two tasks logging at once over the whole run."""
    folder = tmp_path / "holds"
    folder.mkdir()
    folder.chmod(0o777)
    source = compose_source("hold", 4, command=HOLDER, entrypoint=("gpupin-entrypoint", "--quiet"),
                            environment={"SWARM_NODE": "{{.Node.Hostname}}"})
    doc = yaml.safe_load(source)
    svc = doc["services"]["hold"]
    svc["volumes"] = [f"{folder}:/holds"]
    svc["deploy"]["restart_policy"] = {"condition": "any", "delay": "0s"}  # a service meant to keep running
    stopped: list[str] = []
    name = "holds_hold"

    def ticking(n: int) -> bool:
        return sum(1 for h in holds(folder) if h.end > time.time() - 2) == n

    try:
        with swarm.stack("holds", yaml.safe_dump(doc, sort_keys=False), tmp=tmp_path):
            wait_until(lambda: sum(running_on(swarm, name).values()) == 4 and ticking(4), 120, "4 tasks holding")
            placed = running_on(swarm, name)
            drained = max(("worker1", "worker2"), key=lambda w: placed.get(w, 0))
            other = "worker2" if drained == "worker1" else "worker1"
            assert placed.get(drained), f"no task on a worker to move: {placed}"
            swarm.manager("node", "update", "--availability", "drain", drained)
            wait_until(lambda: drained not in running_on(swarm, name) and sum(running_on(swarm, name).values()) == 4
                       and ticking(4), 120, f"the tasks of {drained} to move to other cards")
            swarm.node_op("stop-node", drained)
            stopped.append(drained)
            wait_until(lambda: swarm.manager("node", "inspect", drained, "--format", "{{.Status.State}}")
                       .stdout.strip() == "down", 60, f"{drained} to be down")
            listing = {n["hostname"]: n for n in swarm.ls()["nodes"]}
            assert (listing[drained]["state"], listing[drained]["availability"]) == ("down", "drain")
            assert not any(r["held_by"] for r in listing[drained]["resources"])
            on_other = running_on(swarm, name).get(other, 0)
            swarm.node_op("stop-node", other)  # no drain: Swarm learns of it from the missed heartbeats
            stopped.append(other)
            wait_until(lambda: running_on(swarm, name).get("manager", 0) == 4 and ticking(4), 120,
                       f"the {on_other} task(s) of {other} to be rescheduled on the manager")
            listing = {n["hostname"]: n for n in swarm.ls()["nodes"]}
            assert sum(1 for r in listing["manager"]["resources"] if r["held_by"]) == 4
            # What the stopped node ran (and did not report stopped before it went) is shown as it last reported it,
            # marked so in the text.
            assert listing[other]["state"] == "down"
            last = sum(1 for r in listing[other]["resources"] if r["held_by"])
            stale = [ln for ln in swarm.hostagent("ls", "--swarm").stdout.splitlines() if "[node down" in ln]
            assert len(stale) == last <= on_other, stale
            time.sleep(1)
    finally:
        for node in stopped:
            swarm.node_op("start-node", node)
        swarm.manager("node", "update", "--availability", "active", "worker1", check=False)
        swarm.manager("node", "update", "--availability", "active", "worker2", check=False)
        wait_until(lambda: all(swarm.manager("node", "inspect", w, "--format", "{{.Status.State}}")
                               .stdout.strip() == "ready" for w in ("worker1", "worker2")), 60, "the workers back")
    found = holds(folder)
    assert len(found) >= 4 + placed[drained] + on_other, [(h.task, h.node) for h in found]
    cards = all_resources(swarm)
    for h in found:
        assert h.seen == {h.gpu}, f"task {h.task} on {h.node} was given {h.gpu} but saw {h.seen}"
        assert cards[h.gpu] == h.node
    for gpu in {h.gpu for h in found}:
        spans = sorted((h.start, h.end, h.task) for h in found if h.gpu == gpu)
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            assert start > end, f"{gpu}: task {b} logged from {start:.2f} while task {a} logged until {end:.2f}"


def test_check_on_a_good_node(swarm: Cluster) -> None:
    for node in swarm.nodes.values():
        r = node.check()
        assert r.returncode == 0, r.stdout
        assert r.stdout.endswith(f"OK: {len(expected_resources(node.topology))} GPU resource(s); tasks get them as "
                                 "DOCKER_RESOURCE_GPU, which the nvidia runtime reads\n"), r.stdout


def test_docker_run_gpus_on_a_node_gets_the_hook_once(swarm: Cluster) -> None:
    """`--gpus` on a node whose default runtime is nvidia: Docker adds the hook, the runtime sees it there and adds
    none, so the card is exposed once, as asked."""
    uuid = expected_resources("mixed-4")[1]
    listing = ("import pynvml as n; n.nvmlInit(); "
               "print([n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) for i in range(n.nvmlDeviceGetCount())])")
    cid = swarm.docker("manager", "run", "-d", "--gpus", f"device={uuid}", "--entrypoint", "python3", TEST_IMAGE,
                       "-c", listing).stdout.strip()
    try:
        assert swarm.docker("manager", "wait", cid).stdout.strip() == "0"
        assert swarm.docker("manager", "logs", cid).stdout.strip() == repr([uuid])
        assert swarm.docker("manager", "inspect", cid, "--format", "{{.HostConfig.Runtime}}").stdout.strip() == "nvidia"
        log = (swarm.nodes["manager"].run_dir / "hook.log").read_text().splitlines()
        calls = [e for e in map(json.loads, log) if e["container_id"] == cid]
        assert [(e["source"], e["exposed"]) for e in calls] == [("NVIDIA_VISIBLE_DEVICES", [uuid])]
    finally:
        swarm.docker("manager", "rm", "-f", cid, check=False)


@pytest.fixture
def trapped(swarm: Cluster) -> Iterator[Node]:
    """worker1 advertises its cards as Docker's example does (NVIDIA-GPU=<UUID>) while its runtime reads
    DOCKER_RESOURCE_GPU; the cluster is restored afterwards."""
    swarm.up(trap=TRAPPED)
    try:
        yield swarm.nodes[TRAPPED]
    finally:
        swarm.up()


def test_the_nvidia_gpu_trap_exposes_every_card(swarm: Cluster, trapped: Node, tmp_path: Path) -> None:
    assert trapped.kind == "NVIDIA-GPU"
    cards = expected_resources(trapped.topology)
    # A CUDA image's NVIDIA_VISIBLE_DEVICES=all, and no gpupin-entrypoint: what the runtime alone gives the task.
    with swarm.service("trap", "--replicas", "2", "--generic-resource", "NVIDIA-GPU=1",
                       "-e", "NVIDIA_VISIBLE_DEVICES=all", "--entrypoint", "python3", TEST_IMAGE, "-c", PROBE) as name:
        probes = wait_until(lambda: len(swarm.probes(name)) == 2 and swarm.probes(name), 120, "2 trapped tasks")
        given = sorted(p["env"]["DOCKER_RESOURCE_NVIDIA-GPU"] for _, p in probes)
        assert len(set(given)) == 2 and set(given) <= set(cards), "Swarm still accounts each card to one task"
        for node, p in probes:
            assert node == TRAPPED and p["cards"] == cards, "every task sees every card"
    r = trapped.check()
    assert r.returncode == 64
    assert 'swarm-resource = "DOCKER_RESOURCE_GPU", but this node advertises its cards as NVIDIA-GPU (tasks get ' \
           "DOCKER_RESOURCE_NVIDIA-GPU)" in r.stdout
    # With gpupin-entrypoint (the image's ENTRYPOINT) the same task is refused before its command runs, and says why.
    # The image sets NVIDIA_VISIBLE_DEVICES=all, as CUDA's base images do (built on the trapped node, offline).
    subprocess.run([swarm.docker_cli, "-H", trapped.host, "build", "-q", "-t", CUDA_LIKE, "-"], check=True,
                   input=f"FROM {TEST_IMAGE}\nENV NVIDIA_VISIBLE_DEVICES=all\n", capture_output=True, text=True,
                   timeout=120)
    source = compose_source("trap", 1, command="print('the workload ran')", entrypoint=("gpupin-entrypoint",),
                            body=f"x-gpupin: {{count: 1}}\nimage: '{CUDA_LIKE}'")
    with swarm.stack("trapgp", source, "--kind", "NVIDIA-GPU", tmp=tmp_path):
        name = "trapgp_trap"
        (task,) = wait_until(lambda: [t for t in swarm.tasks(name, every=True)
                                      if t["CurrentState"].startswith("Failed")], 120, "the trapped task to be refused")
        assert task["Node"] == TRAPPED and "non-zero exit (78)" in task["Error"], task
        (cid,) = swarm.docker(TRAPPED, "ps", "-aq", "--filter",
                              f"label=com.docker.swarm.service.name={name}").stdout.split()
        logs = swarm.docker(TRAPPED, "logs", cid)
        assert "the workload ran" not in logs.stdout
        (line,) = [ln for ln in logs.stderr.splitlines() if "ERROR:" in ln]
        assert line.startswith("gpupin-entrypoint: ERROR: DOCKER_RESOURCE_NVIDIA-GPU reserves GPU-"), line
        assert f"but it also sees {len(cards) - 1} device(s) it did not reserve" in line
        assert "HINT: the NVIDIA runtime did not read DOCKER_RESOURCE_NVIDIA-GPU: the node advertises NVIDIA-GPU " \
               "resources, but its runtime's swarm-resource does not name DOCKER_RESOURCE_NVIDIA-GPU, so it fell " \
               "back to NVIDIA_VISIBLE_DEVICES (NVIDIA_VISIBLE_DEVICES='all' here); run `hostagent swarm " \
               "node-config --check` on that node" in line


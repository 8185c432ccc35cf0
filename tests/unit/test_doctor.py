"""`hostagent doctor` on the simulated host: each trap planted (a root with /dev, /etc planted, a topology) gives one
line with a HINT and exit 1, what cannot be asked is a finding, not a traceback. With the sandbox's daemon:
tests/docker/test_doctor.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent import doctor
from tests.support.host import HOSTAGENT, doctor_on, simhost_env
from tests.support.planted import plant_hostile_specs
from tests.support.scenarios import cards, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")
NVIDIA_MAJOR = 195


def mknod(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(major, minor))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A host root with nothing planted: /dev without NVIDIA nodes, no CDI spec, no toolkit config."""
    for d in ("dev", "etc", "sys"):
        (tmp_path / d).mkdir()
    return tmp_path


# --- the traps, one by one (pure) -----------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_dev_char_links_are_needed_only_under_the_systemd_driver(root: Path) -> None:
    mknod(root / "dev" / "nvidia0", NVIDIA_MAJOR, 0)
    mknod(root / "dev" / "nvidia1", NVIDIA_MAJOR, 1)
    mknod(root / "dev" / "nvidiactl", NVIDIA_MAJOR, 255)
    (root / "dev" / "char").mkdir()
    os.symlink("../nvidia0", root / "dev" / "char" / "195:0")
    os.symlink("../nvidia9", root / "dev" / "char" / "195:255")  # dangling: as bad as none
    host = doctor.HostFiles(str(root))
    assert doctor.check_dev_char(host, "cgroupfs") == []
    (finding,) = doctor.check_dev_char(host, "systemd")
    line = finding.line()
    assert "195:1 (nvidia1)" in line and "195:255 (nvidiactl)" in line and "195:0" not in line
    assert f"HINT: run `{doctor.CREATE_DEV_CHAR}`" in line
    os.symlink("../nvidia1", root / "dev" / "char" / "195:1")
    os.remove(root / "dev" / "char" / "195:255")
    os.symlink("../nvidiactl", root / "dev" / "char" / "195:255")
    assert doctor.check_dev_char(host, "systemd") == []


def test_persistence_mode_off_is_a_warning_naming_the_card() -> None:
    box = cards("mixed-4")
    (finding,) = doctor.check_persistence(box, {c.index: c.index != 2 for c in box})
    assert f"2 ({box[2].uuid})" in finding.line() and "nvidia-persistenced" in finding.line()
    assert doctor.check_persistence(box, {c.index: None for c in box}) == []  # unknown is not "off"


def test_a_cdi_spec_that_names_other_cards_than_nvml(root: Path) -> None:
    box = cards("mixed-4")
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0"},
            {"name": "7"},
            {"name": box[0].uuid},
            {"name": "GPU-0bad0bad-0000-4000-8000-000000000000"},
        ],
    }
    (root / "etc" / "cdi").mkdir()
    (root / "etc" / "cdi" / "nvidia.json").write_text(json.dumps(spec))
    (finding,) = doctor.check_cdi(doctor.HostFiles(str(root)), None, box)
    line = finding.line()
    assert "names GPU-0bad0bad-0000-4000-8000-000000000000, 7, which NVML does not have" in line
    assert all(str(c.uuid) in line for c in box[1:]) and "nvidia-ctk cdi generate" in line
    spec["devices"] = [{"name": str(i)} for i in range(4)] + [{"name": c.uuid} for c in box]
    (root / "etc" / "cdi" / "nvidia.json").write_text(json.dumps(spec))
    assert doctor.check_cdi(doctor.HostFiles(str(root)), None, box) == []


def discovered(*names: str | None) -> dict[str, object]:
    return {"DiscoveredDevices": [{"Source": "cdi", "ID": f"nvidia.com/gpu={n}"} for n in names]}


def test_the_devices_the_daemon_discovered_against_nvmls_cards() -> None:
    box = cards("mixed-4")
    same = discovered("all", *(str(c.index) for c in box), *(c.uuid for c in box))
    assert doctor.check_discovered(same, box) == []
    # a card replaced since the spec was written: NVML's new card undiscovered, the old one discovered: a line each
    stale = "GPU-0bad0bad-0000-4000-8000-000000000000"
    lines = [f.line() for f in doctor.check_discovered(discovered("0", "1", box[0].uuid, stale), box)]
    assert len(lines) == 4, lines
    assert all(
        f"no nvidia.com/gpu device for card {c.index} ({c.uuid}), which NVML has" in lines[i]
        for i, c in enumerate(box[1:])
    )
    assert f"discovers nvidia.com/gpu={stale}, which NVML does not have" in lines[3]
    assert all(" HINT: regenerate the CDI spec" in ln for ln in lines)
    # the index strategy alone (plain or type-index): matched by index
    assert doctor.check_discovered(discovered("gpu0", "gpu1", "gpu2", "gpu3"), box) == []
    (extra,) = doctor.check_discovered(discovered("0", "1", "2", "3", "7"), box)
    assert "nvidia.com/gpu=7, which NVML does not have" in extra.line()
    # no list (Engine < 28.2, CDI off) or no NVIDIA device: nothing to compare
    assert doctor.check_discovered({}, box) == doctor.check_discovered(discovered(), box) == []


@pytest.mark.timeout(60)
def test_a_planted_cdi_spec_is_a_warning_never_a_hang(root: Path) -> None:
    box = cards("mixed-4")
    folder = root / "etc" / "cdi"
    folder.mkdir()
    spec = {"kind": "nvidia.com/gpu", "devices": [{"name": str(i)} for i in range(4)] + [{"name": c.uuid} for c in box]}
    (folder / "nvidia.json").write_text(json.dumps(spec))
    plant_hostile_specs(folder)
    lines = sorted(f.line() for f in doctor.check_cdi(doctor.HostFiles(str(root)), None, box))
    hint = "HINT: remove it, or regenerate it with `nvidia-ctk cdi generate`"
    assert lines == [
        f"{folder}/fifo.yaml: warning: the CDI spec is not read: it is a FIFO, not a regular file. {hint}",
        f"{folder}/huge.json: warning: the CDI spec is not read: it is larger than 1 MiB, the limit for this file. "
        + hint,
        f"{folder}/zero.json: warning: the CDI spec is not read: it is a character device, not a regular file. {hint}",
    ]


def test_what_the_daemon_and_a_spec_folder_say_is_shown_escaped(root: Path) -> None:
    """The daemon's words on the summary line, and a planted spec file's name, through the one rule: one line each,
    no terminal escape obeyed."""
    host = doctor.HostFiles(str(root))
    assert doctor.cgroup_line({"CgroupDriver": "systemd\x1b[2J\nok", "CgroupVersion": "2"}, host) == (
        "cgroup v2 with the 'systemd\\x1b[2J\\nok' driver"
    )
    (root / "etc" / "cdi").mkdir()
    os.mkfifo(root / "etc" / "cdi" / "evil\x1b[2J\n.yaml")
    (finding,) = doctor.check_cdi(host, None, cards("mixed-4"))
    assert "\x1b" not in finding.line() and "/evil\\x1b[2J\\n.yaml: warning: " in finding.line()


def test_a_swarm_node_needs_the_nvidia_runtime_as_its_default(root: Path) -> None:
    host = doctor.HostFiles(str(root))
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / doctor.HOOK).write_text("")
    swarm = {"LocalNodeState": "active"}
    (f,) = doctor.check_runtime({"Swarm": swarm, "Runtimes": {"runc": {}}}, host, cdi_served=False)
    assert "no nvidia runtime" in f.line()
    (f,) = doctor.check_runtime(
        {"Swarm": swarm, "Runtimes": {"runc": {}, "nvidia": {}}, "DefaultRuntime": "runc"}, host, cdi_served=False
    )
    assert "default runtime is runc" in f.line() and '"default-runtime": "nvidia"' in f.line()
    assert (
        doctor.check_runtime(
            {"Swarm": swarm, "Runtimes": {"nvidia": {}}, "DefaultRuntime": "nvidia"}, host, cdi_served=False
        )
        == []
    )
    # Not a Swarm node: the default runtime is no trap.
    assert doctor.check_runtime({"Runtimes": {"runc": {}}}, host, cdi_served=False) == []


def test_no_hook_no_runtime_no_cdi_means_gpus_cannot_work(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(root / "nowhere"))
    (f,) = doctor.check_runtime({"Runtimes": {"runc": {}}}, doctor.HostFiles(str(root)), cdi_served=False)
    assert "could not select device driver" in f.line()
    assert doctor.check_runtime({"Runtimes": {"runc": {}}}, doctor.HostFiles(str(root)), cdi_served=True) == []


def test_a_swarm_node_without_swarm_resource_in_the_toolkit(root: Path) -> None:
    box = cards("mixed-4")
    (root / "etc" / "docker").mkdir()
    (root / "etc" / "docker" / "daemon.json").write_text(
        json.dumps(
            {
                "default-runtime": "nvidia",
                "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
                "node-generic-resources": [f"GPU={c.uuid}" for c in box],
            }
        )
    )
    (root / "etc" / "nvidia-container-runtime").mkdir()
    (root / "etc" / "nvidia-container-runtime" / "config.toml").write_text("[nvidia-container-runtime]\n")
    findings = doctor.check_swarm_resource({"Swarm": {"LocalNodeState": "active"}}, doctor.HostFiles(str(root)), box)
    assert any("swarm-resource" in f.line() for f in findings), [f.line() for f in findings]
    assert doctor.check_swarm_resource({}, doctor.HostFiles(str(root)), box) == []


# --- the command on the simulated host --------------------------------------------------------------------


def test_what_cannot_be_asked_is_a_finding_not_a_traceback(root: Path) -> None:
    r = doctor_on(root, "unix:///nonexistent/docker.sock")
    assert r.returncode == doctor.EX_FINDINGS and "Traceback" not in r.stderr + r.stdout
    assert any(ln.startswith("docker: ") and "HINT:" in ln for ln in r.stdout.splitlines()), r.stdout
    r = subprocess.run(
        [HOSTAGENT, "doctor", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=simhost_env("fault-nvml-unknown", DOCKER_HOST="unix:///nonexistent/docker.sock"),
    )
    assert r.returncode == doctor.EX_FINDINGS and "Traceback" not in r.stderr + r.stdout
    assert any(ln.startswith("NVML: ") for ln in r.stdout.splitlines()), r.stdout


def test_a_root_that_is_not_a_folder_is_64(tmp_path: Path) -> None:
    r = subprocess.run(
        [HOSTAGENT, "doctor", "--root", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        env=simhost_env("mixed-4"),
        timeout=60,
    )
    assert r.returncode == 64 and r.stderr.count("\n") == 1 and "--root" in r.stderr, r


def _nvidia_spec(version: str, driver: str) -> dict[str, Any]:
    """The shape `nvidia-ctk cdi generate` writes: the driver's libraries mounted by their versioned names."""
    lib = "/usr/lib/x86_64-linux-gnu"
    return {
        "cdiVersion": version,
        "kind": "nvidia.com/gpu",
        "devices": [{"name": c.uuid, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}} for c in cards()],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [
                {"hostPath": f"{lib}/{n}.so.{driver}", "containerPath": f"{lib}/{n}.so.{driver}", "options": ["ro"]}
                for n in ("libnvidia-ml", "libcuda")
            ],
        },
    }


def test_a_cdi_spec_generated_for_another_driver(root: Path) -> None:
    """A driver upgraded without nvidia-cdi-refresh: the spec mounts the old driver's libraries."""
    (root / "etc" / "cdi").mkdir()
    spec = root / "etc" / "cdi" / "nvidia.json"
    spec.write_text(json.dumps(_nvidia_spec("0.5.0", "550.54.15")))
    host = doctor.HostFiles(str(root))
    (f,) = doctor.check_cdi_versions(host, None, "580.159.04")
    assert f.line().startswith(
        f"{spec}: the nvidia.com/gpu spec was generated for driver 550.54.15, older than the loaded driver 580.159.04"
    ), f.line()
    assert "nvidia-cdi-refresh" in f.line() and f"nvidia-ctk cdi generate --output={spec}" in f.line()
    assert doctor.check_cdi_versions(host, None, "550.54.15") == []
    assert doctor.check_cdi_versions(host, None, None) == []  # NVML unread: nothing to compare


def test_a_cdi_07_spec_on_an_engine_before_26_1(root: Path) -> None:
    (root / "etc" / "cdi").mkdir()
    (root / "etc" / "cdi" / "nvidia.yaml").write_text(json.dumps(_nvidia_spec("0.7.0", "580.159.04")))  # JSON is YAML
    host = doctor.HostFiles(str(root))
    info: dict[str, Any] = {"ServerVersion": "26.0.2", "CDISpecDirs": ["/etc/cdi"]}
    (f,) = doctor.check_cdi_versions(host, info, "580.159.04")
    assert "is CDI 0.7.0 (toolkit 1.19.1 writes 0.7.0 by default), which Engine 26.0.2 cannot read" in f.line()
    assert "upgrade Docker Engine to 26.1 or later" in f.line()
    for fine in (
        {**info, "ServerVersion": "26.1.0"},
        {**info, "ServerVersion": "28.5.2+dfsg1"},
        {"ServerVersion": "20.10.24"},
    ):
        assert doctor.check_cdi_versions(host, fine, "580.159.04") == [], fine
    (root / "etc" / "cdi" / "nvidia.yaml").write_text(json.dumps(_nvidia_spec("0.6.0", "580.159.04")))
    assert doctor.check_cdi_versions(host, info, "580.159.04") == []


def test_the_fake_toolkits_spec_names_the_simulated_driver(tmp_path: Path) -> None:
    """What the sandbox's Engine 26 reads: the fake nvidia-ctk mounts the libraries by the topology's driver version,
    as the real one does, so a clean sandbox has no finding and a planted stale spec is one."""
    from tests.support.host import FAKEGPU
    from tests.support.scenarios import scenario

    out = tmp_path / "nvidia.json"
    env = {"PATH": "/usr/bin:/bin", "FAKEGPU_TOPOLOGY": str(scenario("mixed-4"))}
    subprocess.run(
        [str(FAKEGPU / "bin" / "nvidia-ctk"), "cdi", "generate", f"--output={out}"], env=env, check=True, timeout=60
    )
    assert doctor.spec_driver_version(json.loads(out.read_text())) == "580.159.04"


def test_a_policy_with_mistakes_is_a_finding(root: Path) -> None:
    """doctor names each mistake of the host's policy file, which the agent would not take (docs/policy.md)."""
    host = doctor.HostFiles(str(root))
    assert doctor.check_policy(host) == []  # no file: nothing enforced, nothing to say
    policy = root / "etc/gpupin/policy.toml"
    policy.parent.mkdir(parents=True)
    policy.write_text("[quota]\ncard = 2\n")
    (finding,) = doctor.check_policy(host)
    assert finding.about == str(policy) and finding.is_error
    assert finding.problem.startswith(f"the policy has a mistake: {policy}:2: quota.card: unknown key")
    policy.write_text("[quota]\ncards = 2\n")
    assert doctor.check_policy(host) == []
    policy.write_text("[quota]\ncards = 2\n[quota.user.a-student-who-left]\ncards = 4\n")  # good, and said
    (said,) = doctor.check_policy(host)
    assert not said.is_error and "quota.user.a-student-who-left: no such user on this host" in said.problem


# --- the authorization plugin (docs/authz.md) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "cves"),
    [
        ("18.09.0", ["the 2018 bypass (no CVE)", "CVE-2026-34040"]),
        ("18.09.9", ["CVE-2026-34040"]),  # 18.09.1 fixed the 2018 bypass; 19.03 lost the fix
        ("19.03.0", ["CVE-2024-41110", "CVE-2026-34040"]),
        ("20.10.27", ["CVE-2024-41110", "CVE-2026-34040"]),  # the 20.10 line had no upstream release with the fix
        ("23.0.15", ["CVE-2026-34040"]),
        ("24.0.7", ["CVE-2024-41110", "CVE-2026-34040"]),
        ("26.1.4", ["CVE-2024-41110", "CVE-2026-34040"]),
        ("26.1.5", ["CVE-2026-34040"]),
        ("27.1.0", ["CVE-2024-41110", "CVE-2026-34040"]),
        ("28.5.2", ["CVE-2026-34040"]),
        ("29.3.1", []),
        ("5.4.2", ["the 2018 bypass (no CVE)", "CVE-2026-34040"]),  # podman's is never asked: the table is Docker's
        ("dev", []),
    ],
)
def test_the_authz_bypass_advisories_by_engine_version(root: Path, version: str, cves: list[str]) -> None:
    assert [cve for cve, _ in doctor.authz_advisories(version, doctor.HostFiles(str(root)))] == cves


def plant_changelog(root: Path, first_line: str, *fixed: str) -> None:
    import gzip

    path = root / doctor.DEBIAN_CHANGELOG.lstrip("/")
    path.parent.mkdir(parents=True)
    body = "".join(f"  * Fix {cve}\n" for cve in fixed)
    with gzip.open(path, "wt") as f:
        f.write(f"{first_line}\n\n{body}\n -- Someone <someone@debian.org>  Sat, 12 Oct 2024 15:19:49 +0000\n")


def test_a_debian_build_counts_the_fixes_its_own_changelog_names(root: Path) -> None:
    host = doctor.HostFiles(str(root))
    plant_changelog(root, "docker.io (20.10.24+dfsg1-1+deb12u1) bookworm; urgency=high", "CVE-2024-41110")
    assert [c for c, _ in doctor.authz_advisories("20.10.24+dfsg1", host)] == ["CVE-2026-34040"]
    # Another build's changelog (the daemon is not this package's) proves nothing.
    assert [c for c, _ in doctor.authz_advisories("20.10.23+dfsg1", host)] == ["CVE-2024-41110", "CVE-2026-34040"]
    # Upstream's own build is never Debian's.
    assert [c for c, _ in doctor.authz_advisories("20.10.24", host)] == ["CVE-2024-41110", "CVE-2026-34040"]


def test_a_bypass_is_a_finding_only_while_an_authorization_plugin_is_on(root: Path) -> None:
    host = doctor.HostFiles(str(root))
    info = {"ServerVersion": "26.1.4"}
    assert doctor.check_authz(info, "off", [], host) == []  # "If you don't use AuthZ plugins, you are not affected"
    lines = [f.line() for f in doctor.check_authz(info, "on", [], host)]
    assert lines == [
        "docker: Engine 26.1.4 has the AuthZ bypass CVE-2024-41110: a request with Content-Length 0 reaches the "
        "plugin without its body. HINT: update the engine (docs/authz.md lists the fixed releases); gpupin's plugin "
        "refuses a create it gets without its body, other plugins may not",
        "docker: Engine 26.1.4 has the AuthZ bypass CVE-2026-34040: a request with an oversized body reaches the "
        "plugin without it. HINT: update the engine (docs/authz.md lists the fixed releases); gpupin's plugin "
        "refuses a create it gets without its body, other plugins may not",
    ]
    assert len(doctor.check_authz(info, "off", ["opa"], host)) == 2  # another plugin is as exposed


def test_a_plugin_that_does_not_answer_is_the_whole_daemon_refused(root: Path) -> None:
    (f,) = doctor.check_authz({"ServerVersion": "29.3.1"}, "down", [], doctor.HostFiles(str(root)))
    assert f.line().startswith(
        "docker: the daemon asks the authorization plugin gpupin, which does not answer: the daemon refuses every "
        "request until it does. HINT: start it"
    )


@pytest.mark.parametrize(
    ("state", "others", "line"),
    [
        ("on", [], "authz: gpupin on"),
        ("off", ["opa", "x\x1b[2J"], "authz: gpupin off, other plugins opa, 'x\\x1b[2J'"),
        ("down", [], "authz: gpupin on but not answering"),
        ("podman", [], "authz: none (podman has no authorization plugins)"),
    ],
)
def test_the_summary_says_the_plugins_state(state: str, others: list[str], line: str) -> None:
    assert doctor.authz_line(state, others) == line


def test_a_silent_daemon_whose_daemon_json_lists_gpupin_is_said_to_be_locked_out(root: Path) -> None:
    from gpupin.core.errors import DockerUnavailableError

    err = DockerUnavailableError("timed out", "the daemon's hint")
    assert doctor.locked_out(doctor.HostFiles(str(root)), err) == "the daemon's hint"
    (root / "etc" / "docker").mkdir(parents=True)
    (root / "etc" / "docker" / "daemon.json").write_text('{"authorization-plugins": ["gpupin"]}')
    hint = doctor.locked_out(doctor.HostFiles(str(root)), err)
    assert hint is not None and "the daemon refuses every request until it does" in hint

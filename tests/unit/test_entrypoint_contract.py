"""Black-box tests of gpupin-entrypoint's contract, in every mode (as dumb-init's tests do).

Here on the simulated host (bare metal: NVML sees all four mixed-4 cards). The tests that take `ep` run again in a
container on each engine (tests/docker/test_entrypoint_contract.py): the same contract, both ways
(tests/support/entrypoint.py). The tests that take `fakegpu` instead are bare-metal ones.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import dra
from tests.support.entrypoint import Entrypoint, Result, device, one_error_line
from tests.support.host import ENTRYPOINT, saw, simhost_env
from tests.support.scenarios import topology, uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")


# --- the pin is proved, and the workload sees the asked card --------------------------------------------------


def test_aligned_card_execs_and_the_workload_sees_it(ep: Entrypoint) -> None:
    r = ep.run("{py}", "-m", "gpupin.entrypoint", env={"GPUPIN_EXPECT": f"{RTX}@3b:00.0"}, gpus=device(RTX))
    assert r.rc == 0, r
    assert f"cuda:0 = {RTX} at 00000000:3B:00.0 (NVIDIA GeForce RTX 4090), as expected" in r.out
    assert f"cuda:0  {RTX}  00000000:3B:00.0  NVIDIA GeForce RTX 4090  (local rank 0)" in r.err
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in r.err


def test_reversed_two_card_expectation_puts_each_card_at_its_rank(ep: Entrypoint) -> None:
    r = ep.run("{py}", "-m", "gpupin.entrypoint", env={"GPUPIN_EXPECT": f"{A800C},{RTX}"}, gpus=device(RTX, A800C))
    assert r.rc == 0, r
    assert r.out.splitlines() == [
        f"cuda:0 = {A800C} at 00000000:AF:00.0 (NVIDIA A800-SXM4-80GB), as expected",
        f"cuda:1 = {RTX} at 00000000:3B:00.0 (NVIDIA GeForce RTX 4090), as expected",
    ]
    want = "CUDA_VISIBLE_DEVICES=1,0" if ep.mode == "container" else "CUDA_VISIBLE_DEVICES=3,1"
    assert want in r.err


def test_an_inherited_cuda_visible_devices_is_overridden_and_reported(ep: Entrypoint) -> None:
    r = ep.run(
        "sh",
        "-c",
        'echo "CVD=$CUDA_VISIBLE_DEVICES ORDER=$CUDA_DEVICE_ORDER"',
        env={"GPUPIN_EXPECT": RTX, "CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
        gpus=device(RTX, A800B),
    )
    assert r.rc == 0, r
    want = "0" if ep.mode == "container" else "1"
    assert r.out.strip() == f"CVD={want} ORDER=PCI_BUS_ID"
    assert "overrode CUDA_VISIBLE_DEVICES=2" in r.err and "overrode CUDA_DEVICE_ORDER=FASTEST_FIRST" in r.err


@pytest.mark.needs("nvidia-runtime")
def test_nvidia_visible_devices_uuids_are_the_expectation(ep: Entrypoint) -> None:
    env = {} if ep.mode == "container" else {"NVIDIA_VISIBLE_DEVICES": f"{A800B},{A800}"}
    r = ep.run("{py}", "-m", "gpupin.entrypoint", env=env, gpus=device(A800B, A800))
    assert r.rc == 0, r
    assert "expectation from NVIDIA_VISIBLE_DEVICES" in r.err
    assert r.out.splitlines()[0].startswith(f"cuda:0 = {A800B} at 00000000:86:00.0")
    assert r.out.splitlines()[1].startswith(f"cuda:1 = {A800} at 00000000:1B:00.0")


def test_a_swarm_task_that_sees_more_cards_than_it_reserved_is_refused(ep: Entrypoint) -> None:
    """The NVIDIA-GPU trap: the runtime ignored DOCKER_RESOURCE_NVIDIA-GPU and exposed every card. The task is
    refused, with why; GPUPIN_EXPECT beside it (bare metal, `--gpus all`) keeps selecting the card instead. (A task
    that sees just its card runs: tests/cluster/test_swarm.py, on a real swarm, where nothing else names the card.)"""
    env = {"DOCKER_RESOURCE_NVIDIA-GPU": A800C, "NVIDIA_VISIBLE_DEVICES": "all"}
    r = ep.run("sh", "-c", "echo ran", env=env, gpus="all")
    assert (r.rc, r.out) == (78, ""), r
    line = one_error_line(r.err)
    assert line.startswith(
        f"gpupin-entrypoint: ERROR: DOCKER_RESOURCE_NVIDIA-GPU reserves {A800C} for this task, "
        f"but it also sees 3 device(s) it did not reserve ({A800}, {RTX}, {A800B}), which the "
        "scheduler gives to other tasks. HINT: the NVIDIA runtime did not read "
        "DOCKER_RESOURCE_NVIDIA-GPU: the node advertises NVIDIA-GPU resources"
    ), line
    assert line.endswith(
        'set swarm-resource = "DOCKER_RESOURCE_NVIDIA-GPU" in its /etc/nvidia-container-runtime/config.toml'
    ), line
    r = ep.run("sh", "-c", "echo ran", env=dict(env, GPUPIN_EXPECT=A800C), gpus="all")
    assert (r.rc, r.out) == (0, "ran\n"), r
    assert "expectation from GPUPIN_EXPECT" in r.err and "NVML sees 4 cards" in r.err


@pytest.mark.needs("nvidia-runtime")
def test_nvidia_visible_devices_indices_are_the_expectation(ep: Entrypoint) -> None:
    """`--gpus device=3,1` gives the container NVIDIA_VISIBLE_DEVICES=3,1 and the two cards, renumbered 0 and 1 in
    bus order; on the host the indices are NVML's own. Either way cuda:0 is index 3 and cuda:1 index 1."""
    env = {} if ep.mode == "container" else {"NVIDIA_VISIBLE_DEVICES": "3,1"}
    r = ep.run("{py}", "-m", "gpupin.entrypoint", env=env, gpus=device("3", "1"))
    assert r.rc == 0 and saw(r.out) == [A800C, RTX], r
    how = "renumbered by the runtime" if ep.mode == "container" else "as NVML numbers this host's cards"
    assert "expectation from NVIDIA_VISIBLE_DEVICES=3,1 (indices " in r.err and how in r.err


@pytest.mark.needs("nvidia-runtime")
@pytest.mark.parametrize("ids", [(A800C, RTX), ("3", "1")], ids=["uuid-strategy", "index-strategy"])
def test_the_device_plugins_volume_mounts_are_the_expectation(
    ep: Entrypoint, tmp_path: Path, ids: tuple[str, str]
) -> None:
    """The Kubernetes device plugin's volume-mounts strategy, as the plugin sets it up: NVIDIA_VISIBLE_DEVICES
    names the folder and /dev/null is mounted there under each device id; the runtime (the fake toolkit, with
    accept-nvidia-visible-devices-as-volume-mounts) exposes those devices."""
    folder = "/var/run/nvidia-container-devices"
    env = {"NVIDIA_VISIBLE_DEVICES": folder}
    docker_args: tuple[str, ...] = ()
    if ep.mode == "container":
        docker_args = ("--runtime", "nvidia", *(a for i in ids for a in ("-v", f"/dev/null:{folder}/{i}")))
    else:  # the folder moved (GPUPIN_DEVICE_LIST_DIR): tests never write to the host's /var/run
        folder = str(tmp_path / "nvidia-container-devices")
        os.mkdir(folder)
        for i in ids:
            Path(folder, i).touch()
        env["GPUPIN_DEVICE_LIST_DIR"] = folder
    r = ep.run("{py}", "-m", "gpupin.entrypoint", env=env, gpus=None, docker_args=docker_args)
    assert r.rc == 0 and saw(r.out) == [RTX, A800C], r  # a folder has no order: the cards' bus order
    assert f"expectation from {folder}" in r.err


def _dra(ep: Entrypoint, tmp_path: Path, text: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """A claim's DRA device metadata where the container sees it: bind-mounted read-only at the KEP-5304 path, as
    the kubelet plugin's CDI spec mounts it (container), or in a folder GPUPIN_DRA_METADATA_DIR names (host)."""
    if ep.mode == "container":
        src = tmp_path / "metadata.json"
        src.write_text(text)
        src.chmod(0o644)
        tmp_path.chmod(0o755)
        return {}, ("-v", f"{src}:{dra.path(dra.ROOT)}:ro")
    dra.plant(tmp_path / "dra", text)
    return {"GPUPIN_DRA_METADATA_DIR": str(tmp_path / "dra")}, ()


def test_a_dra_claims_gpus_are_the_expectation(ep: Entrypoint, tmp_path: Path) -> None:
    """NVIDIA's DRA driver records each allocated GPU (KEP-5304): one by UUID and bus id, one by bus id alone.
    They are pinned in bus order (a claim has no order the workload sees), each proved to be its cuda:k."""
    text = dra.record([dra.gpu(A800C, "0000:af:00.0", "gpu-3"), dra.gpu(None, "0000:3b:00.0", "gpu-1")])
    env, args = _dra(ep, tmp_path, text)
    r = ep.run("{py}", "-m", "gpupin.entrypoint", env=env, gpus=device(RTX, A800C), docker_args=args)
    assert r.rc == 0 and saw(r.out) == [RTX, A800C], r
    assert "expectation from DRA device metadata (gpu-claim/gpu; NVML's order)" in r.err


def test_a_dra_claim_for_another_card_is_refused_with_78(ep: Entrypoint, tmp_path: Path) -> None:
    """The container was given another card than its claim allocated: refused as GPUPIN_EXPECT would be."""
    absent = "GPU-00000000-1111-2222-3333-444444444444"
    want = A800 if ep.mode == "container" else absent
    env, args = _dra(ep, tmp_path, dra.record([dra.gpu(want)]))
    r = ep.run(*STARTED, env=env, gpus=device(A800B), docker_args=args)
    assert r.rc == 78, r
    assert "WORKLOAD-STARTED" not in r.out
    line = one_error_line(r.err)
    assert line.startswith(f"gpupin-entrypoint: ERROR: the DRA claim gpu-claim/gpu asks for {want} at cuda:0"), line
    assert A800B in line


def test_without_an_expectation_it_sets_the_order_reports_and_runs(ep: Entrypoint) -> None:
    r = ep.run("sh", "-c", "echo ran; echo ORDER=$CUDA_DEVICE_ORDER", gpus="all")
    assert r.rc == 0, r
    assert r.out.split() == ["ran", "ORDER=PCI_BUS_ID"]
    assert "running unpinned" in r.err
    # the unpinned mapping is the driver's own answer under PCI_BUS_ID order, which is nvidia-smi's order
    assert f"cuda:1  {RTX}  00000000:3B:00.0" in r.err


def test_quiet_prints_nothing_on_success(ep: Entrypoint) -> None:
    r = ep.run("--quiet", "true", env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX))
    assert (r.rc, r.err) == (0, "")
    r = ep.run("true", env={"GPUPIN_EXPECT": RTX, "GPUPIN_QUIET": "1"}, gpus=device(RTX))
    assert (r.rc, r.err) == (0, "")


def test_check_mode_json_report_on_stdout(ep: Entrypoint) -> None:
    r = ep.run("--json", env={"GPUPIN_EXPECT": f"{A800},{RTX}"}, gpus=device(A800, RTX))
    assert r.rc == 0, r
    report = json.loads(r.out)
    assert [(d["cuda"], d["uuid"], d["bus_id"]) for d in report["devices"]] == [
        ("cuda:0", A800, "00000000:1B:00.0"),
        ("cuda:1", RTX, "00000000:3B:00.0"),
    ]
    assert report["level"] == "cuda" and report["source"] == "GPUPIN_EXPECT"
    assert report["set"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# --- refusals: one line, the documented code, and nothing started ---------------------------------------------

STARTED = ["sh", "-c", "echo WORKLOAD-STARTED"]


def test_uuid_of_one_card_with_the_bus_id_of_another_is_refused_with_78(ep: Entrypoint) -> None:
    r = ep.run(*STARTED, env={"GPUPIN_EXPECT": f"{RTX}@00000000:86:00.0"}, gpus=device(RTX))
    assert r.rc == 78, r
    assert "WORKLOAD-STARTED" not in r.out
    line = one_error_line(r.err)
    assert RTX in line and "00000000:86:00.0" in line and "00000000:3B:00.0" in line and "HINT:" in line


def test_an_expected_card_that_is_not_there_is_refused_with_78(ep: Entrypoint) -> None:
    absent = "GPU-00000000-1111-2222-3333-444444444444"
    want = RTX if ep.mode == "container" else absent
    r = ep.run(*STARTED, env={"GPUPIN_EXPECT": want}, gpus=device(A800B))
    assert r.rc == 78, r
    assert "WORKLOAD-STARTED" not in r.out
    line = one_error_line(r.err)
    assert want in line and A800B in line


@pytest.mark.parametrize("value", ["", "GPU-nothex", f"{RTX},", f"{RTX}@3b:00", "0", f"{RTX},{RTX}"])
def test_a_malformed_expectation_is_refused_with_64(ep: Entrypoint, value: str) -> None:
    r = ep.run(*STARTED, env={"GPUPIN_EXPECT": value}, gpus="all")
    if value == f"{RTX}@3b:00":  # a bus id without its function is still a valid short form
        assert r.rc == 0, r
        return
    assert r.rc == 64, r
    assert "WORKLOAD-STARTED" not in r.out
    assert "GPUPIN_EXPECT" in one_error_line(r.err)


def test_require_refuses_a_missing_expectation(ep: Entrypoint) -> None:
    r = ep.run("--require", *STARTED, gpus="all")
    assert r.rc == 78, r
    assert "WORKLOAD-STARTED" not in r.out and "expectation is required" in one_error_line(r.err)
    r = ep.run(*STARTED, env={"GPUPIN_REQUIRE": "1"}, gpus="all")
    assert r.rc == 78, r


def test_bad_usage_is_64(ep: Entrypoint) -> None:
    r = ep.run("--verify", "fast", *STARTED, gpus="all")
    assert r.rc == 64 and "fast" in one_error_line(r.err)
    r = ep.run("--frobnicate", *STARTED, gpus="all")
    assert r.rc == 64 and "--frobnicate" in one_error_line(r.err)


def test_torch_level_without_torch_is_refused_with_69(ep: Entrypoint) -> None:
    r = ep.run("--verify", "torch", *STARTED, env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX))
    assert r.rc == 69, r
    assert "torch" in one_error_line(r.err) and "WORKLOAD-STARTED" not in r.out


# --- the workload is exec'd: same PID, its exit codes and signals ---------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 2, 42, 64, 69, 78, 125, 126, 127, 255])
def test_the_workload_exit_code_passes_through(ep: Entrypoint, code: int) -> None:
    r = ep.run("--quiet", "sh", "-c", f"exit {code}", env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX))
    assert r.rc == code, r


def test_the_workload_replaces_the_entrypoint_same_pid(ep: Entrypoint) -> None:
    argv, env = ep.argv(["--quiet", "sh", "-c", "echo $$"], {"GPUPIN_EXPECT": RTX}, device(RTX))
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    assert int(out) == (p.pid if ep.mode == "host" else 1)


def test_a_signal_reaches_the_workload(ep: Entrypoint, tmp_path: Path) -> None:
    trap = "trap 'exit 42' TERM; echo ready; while :; do sleep 0.1; done"
    if ep.mode == "host":
        argv, env = ep.argv(["--quiet", "sh", "-c", trap], {"GPUPIN_EXPECT": RTX}, device(RTX))
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 42
        return
    assert ep.sandbox is not None
    argv, env = ep.argv(["--quiet", "sh", "-c", trap], {"GPUPIN_EXPECT": RTX}, device(RTX), detach=True)
    cid = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()
    try:
        sb = ep.sandbox
        wait_for(lambda: "ready" in sb.docker("logs", cid).stdout, 30, "the workload to start")
        ep.sandbox.docker("kill", "-s", "TERM", cid, check=True)
        assert ep.sandbox.docker("wait", cid, check=True).stdout.strip() == "42"
    finally:
        ep.sandbox.docker("rm", "-f", cid)


def test_a_workload_killed_by_a_signal_ends_in_128_plus_signal(ep: Entrypoint) -> None:
    # In a container the shell is not PID 1 only with --init (tini), which reports 128+signal as Docker does.
    r = ep.run("--quiet", "sh", "-c", "kill -TERM $$", env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX), init=True)
    assert r.rc == (-signal.SIGTERM if ep.mode == "host" else 128 + signal.SIGTERM), r


def test_a_missing_command_ends_in_127_with_one_line(ep: Entrypoint) -> None:
    r = ep.run("no-such-workload", "--epochs", "3", env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX))
    assert r.rc == 127, r
    assert "no-such-workload" in one_error_line(r.err) and "no such file" in r.err


def test_a_command_that_cannot_be_executed_ends_in_126(ep: Entrypoint, tmp_path: Path) -> None:
    if ep.mode == "host":
        script = tmp_path / "train.sh"
        script.write_text("#!/bin/sh\necho hi\n")
        script.chmod(0o644)
        target, directory = str(script), str(tmp_path)
    else:
        target, directory = "/etc/hostname", "/etc"
    for cmd in (target, directory):
        r = ep.run(cmd, env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX))
        assert r.rc == 126, r
        assert cmd in one_error_line(r.err)


def test_options_after_the_command_belong_to_the_workload(ep: Entrypoint) -> None:
    r = ep.run(
        "--quiet",
        "--",
        "sh",
        "-c",
        'echo "$@"',
        "x",
        "--verify",
        "bogus",
        "--quiet",
        env={"GPUPIN_EXPECT": RTX},
        gpus=device(RTX),
    )
    assert r.rc == 0 and r.out.strip() == "--verify bogus --quiet", r


# --- no usable GPU: 69 with a cause and a hint ------------------------------------------------------------------


def test_no_driver_library_is_69_with_a_hint(ep: Entrypoint) -> None:
    if ep.mode == "host":
        argv, env = ep.argv([*STARTED], {"GPUPIN_EXPECT": RTX}, None)
        env.pop("LD_LIBRARY_PATH")
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        r = Result(p.returncode, p.stdout, p.stderr)
    else:
        r = ep.run(*STARTED, env={"GPUPIN_EXPECT": RTX}, gpus=None)  # no --gpus at all
    assert r.rc == 69, r
    line = one_error_line(r.err)
    assert "NVML" in line and "HINT:" in line and "--gpus" in line
    assert "WORKLOAD-STARTED" not in r.out


def test_verify_nvml_does_not_touch_the_cuda_driver(fakegpu: Path, tmp_path: Path) -> None:
    broken = topology("mixed-4")
    broken.setdefault("faults", {})["cuda_init"] = 999
    path = tmp_path / "cuda-broken.json"
    path.write_text(json.dumps(broken))
    env = simhost_env("mixed-4", GPUPIN_EXPECT=RTX, FAKEGPU_TOPOLOGY=str(path))
    p = subprocess.run([ENTRYPOINT, "--verify", "nvml", "true"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "verified at level nvml" in p.stderr, p.stderr
    p = subprocess.run([ENTRYPOINT, "true"], env=env, capture_output=True, text=True)
    assert p.returncode == 69, p.stderr
    assert "cuInit failed with CUDA_ERROR_UNKNOWN (999)" in one_error_line(p.stderr)


@pytest.mark.parametrize(
    ("name", "expect", "says"),
    [
        ("fault-nvml-unknown", RTX, "Failed to initialize NVML: Unknown Error"),
        # fault-lost: card 2 (A800B) is lost. Asked for, by UUID or by index, it stops the workload (69).
        ("fault-lost", A800B, "NVML cannot read the card at index 2 (GPU is lost)"),
    ],
)
def test_nvml_faults_are_69_with_the_cause_and_a_hint(fakegpu: Path, name: str, expect: str, says: str) -> None:
    env = simhost_env(name, GPUPIN_EXPECT=expect)
    p = subprocess.run([ENTRYPOINT, *STARTED], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 69, p.stderr
    line = one_error_line(p.stderr)
    assert says in line and "HINT:" in line
    assert "WORKLOAD-STARTED" not in p.stdout


@pytest.mark.parametrize("card", [RTX, A800C])
def test_a_lost_card_stops_only_what_asked_for_it(fakegpu: Path, card: str) -> None:
    """On a host (Slurm, bare metal) NVML lists every card: one that fell off the bus must not stop the jobs pinned
    to the others. CUDA does not enumerate it, so indices after it shift (A800C is CUDA's 2nd PCI device, NVML's
    3rd): the pin is by UUID, and proved."""
    p = subprocess.run(
        [ENTRYPOINT, "sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"],
        env=simhost_env("fault-lost", GPUPIN_EXPECT=card),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"CVD={card}"
    by_index = subprocess.run(
        [ENTRYPOINT, *STARTED],
        env=simhost_env("fault-lost", NVIDIA_VISIBLE_DEVICES="2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert by_index.returncode == 69 and "WORKLOAD-STARTED" not in by_index.stdout
    assert "names the card at NVML index 2, which NVML cannot read (GPU is lost)" in one_error_line(by_index.stderr)


def test_mig_expectation_selects_the_mig_device_by_uuid(fakegpu: Path) -> None:
    mig_card = next(g for g in topology("mig")["gpus"] if g.get("mig"))
    mig_uuid = mig_card["mig"]["devices"][1]["uuid"]
    env = simhost_env("mig", GPUPIN_EXPECT=mig_uuid)
    p = subprocess.run(
        [ENTRYPOINT, "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == mig_uuid
    assert mig_uuid in p.stderr


def test_bare_metal_picks_two_of_eight_identical_cards_by_uuid(fakegpu: Path) -> None:
    cards = uuids("dgx-8")
    env = simhost_env("dgx-8", GPUPIN_EXPECT=f"{cards[6]},{cards[2]}")
    p = subprocess.run(
        [ENTRYPOINT, "--quiet", sys.executable, "-m", "gpupin.entrypoint"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert [ln.split()[2] for ln in p.stdout.splitlines()] == [cards[6], cards[2]]


def test_the_python_api_refuses_a_rewritten_cuda_visible_devices(fakegpu: Path) -> None:
    # What a launcher that rewrites CUDA_VISIBLE_DEVICES after the entrypoint does: assert_pinned() catches it.
    code = (
        "from gpupin.entrypoint import assert_pinned\n"
        "try:\n    assert_pinned()\nexcept Exception as e:\n    print(type(e).__name__, e.exit_code)\n"
    )
    env = simhost_env("mixed-4", GPUPIN_EXPECT=RTX)
    p = subprocess.run(
        [ENTRYPOINT, "--quiet", "sh", "-c", f"CUDA_VISIBLE_DEVICES=0 {shlex.quote(sys.executable)} -c '{code}'"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.strip() == "MisalignedError 78", p

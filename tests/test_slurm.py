"""`srun gpupin-entrypoint ...` against a real Slurm (tests/sandbox/slurm.sh: Debian's slurm-wlm 22.05, one node whose
gres are device files for the simulated cards). Slurm itself sets CUDA_VISIBLE_DEVICES and SLURM_*_GPUS; the node's
TaskProlog gives every task the fake driver, so the test's own environment carries no GPU variable at all.

The box is slurm-shuffled: /dev/nvidia0..3 are 5E (H100), 1B, AF (RTX 4090), 3B, so minor-number order, PCI order
and CUDA's default FASTEST_FIRST order all differ, and Slurm's CUDA_VISIBLE_DEVICES alone lands on the wrong card.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ENTRYPOINT, REPO, TEST_IMAGE, Sandbox, docker_required, scenario, topology

pytestmark = pytest.mark.slurm

SCRIPT = REPO / "tests" / "sandbox" / "slurm.sh"
PYTHON = sys.executable
BY_MINOR = {g["minor_number"]: g["uuid"] for g in topology("slurm-shuffled")["gpus"]}


class Slurm:
    """The cluster, driven by the real Slurm clients; remembers the allocations a test holds and releases them."""

    def __init__(self) -> None:
        self.conf = ""
        self.topology = ""
        self.held: list[str] = []

    def up(self, name: str) -> None:
        if self.topology == name:
            return
        env = dict(os.environ, FAKEGPU_TOPOLOGY=str(scenario(name)))
        t0 = time.monotonic()
        done = subprocess.run([str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"slurm.sh up failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.conf = done.stdout.strip().rpartition("SLURM_CONF=")[2]
        self.topology = name
        sys.stderr.write(f"slurm: up with {name} in {time.monotonic() - t0:.1f} s\n")

    @property
    def env(self) -> dict[str, str]:
        # What a user's shell on the login node has: no fake driver, no GPU variable; the node supplies those.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CUDA_", "GPUPIN_", "NVIDIA_", "SLURM_", "FAKEGPU_")) and k != "LD_LIBRARY_PATH"}
        env["SLURM_CONF"] = self.conf
        return env

    def run(self, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
        if args[0] in ("srun", "sbatch", "salloc"):
            self.settle()
        return subprocess.run(list(args), env={**self.env, **extra}, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)

    def settle(self) -> None:
        """Wait for the jobs that just ended to leave the node: a job submitted while the last one is still
        completing waits for Slurm's next scheduling pass (2.5 s here), not for the cards."""
        for _ in range(100):
            done = subprocess.run(["squeue", "-h", "-t", "CG"], env=self.env, capture_output=True, text=True)
            if not done.stdout.strip():
                return
            time.sleep(0.05)

    def hold(self, gpus: int) -> str:
        """Allocate `gpus` cards and keep them (salloc --no-shell); Slurm gives the lowest free gres first."""
        done = self.run("salloc", "--no-shell", f"--gres=gpu:{gpus}", "--job-name=gpupin-hold")
        m = re.search(r"Granted job allocation (\d+)", done.stderr)
        assert m, done.stderr
        self.held.append(m.group(1))
        return m.group(1)

    def release(self, job: str) -> None:
        self.run("scancel", job)
        self.held.remove(job)
        for _ in range(100):  # until Slurm has taken the cards back
            if not self.run("squeue", "-h", "-j", job, "-t", "R").stdout.strip():
                break
            time.sleep(0.05)
        self.settle()

    def release_all(self) -> None:
        for job in list(self.held):
            self.release(job)


@pytest.fixture(scope="session")
def slurm_cluster(fakegpu: Path) -> Iterator[Slurm]:
    """The cluster for this session; always stopped at its end (by the PIDs slurm.sh recorded), even after a
    failed test. A cluster that does not come up skips, except under CI / `make test`, where it fails."""
    cluster = Slurm()
    try:
        if os.geteuid() != 0:
            raise RuntimeError("the Slurm daemons need root")
        cluster.up("slurm-shuffled")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120)
        if docker_required():
            pytest.fail(f"the test Slurm cluster is required here (CI): {err}", pytrace=False)
        pytest.skip(f"no test Slurm cluster: {err}")
    try:
        yield cluster
    finally:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120)


@pytest.fixture
def slurm(slurm_cluster: Slurm) -> Iterator[Slurm]:
    slurm_cluster.up("slurm-shuffled")
    yield slurm_cluster
    slurm_cluster.release_all()


# A workload that proves, in its own process, what each cuda:k is (the CUDA driver, by UUID and bus id) and says
# which Slurm task it is.
PROVE = ("import json, os; from gpupin.entrypoint import assert_pinned; "
         "b = assert_pinned(); print(json.dumps({'rank': os.environ['SLURM_LOCALID'], "
         "'step_gpus': os.environ.get('SLURM_STEP_GPUS'), 'cvd': os.environ['CUDA_VISIBLE_DEVICES'], "
         "'order': os.environ.get('CUDA_DEVICE_ORDER'), 'cuda': [x.uuid for x in b]}))")


def by_rank(out: str) -> dict[str, dict[str, object]]:
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {str(r["rank"]): r for r in rows}


def test_the_cluster_is_real_and_sets_the_gpu_variables_itself(slurm: Slurm) -> None:
    done = slurm.run("srun", "--gres=gpu:2", "sh", "-c",
                     "echo $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS ${CUDA_DEVICE_ORDER:-unset} $SLURM_LOCALID")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0,1", "0,1", "unset", "0"]
    gres = (Path(slurm.conf).parent / "gres.conf").read_text()
    assert [int(m) for m in re.findall(r"File=\S+/nvidia(\d+)", gres)] == [0, 1, 2, 3]


def test_srun_gres_2_proves_the_two_allocated_cards_in_slurms_order(slurm: Slurm) -> None:
    done = slurm.run("srun", "--gres=gpu:2", ENTRYPOINT, PYTHON, "-c", PROVE)
    assert done.returncode == 0, done.stderr
    row = by_rank(done.stdout)["0"]
    assert row["cuda"] == [BY_MINOR[0], BY_MINOR[1]]  # /dev/nvidia0 (5E, H100), /dev/nvidia1 (1B)
    assert row["order"] == "PCI_BUS_ID" and row["cvd"] == "2,0"  # their PCI positions, in Slurm's order
    assert "expectation from SLURM_STEP_GPUS=0,1 and CUDA_VISIBLE_DEVICES=0,1 (Slurm local rank 0)" in done.stderr
    assert "(Slurm local rank 0, minor number 1)" in done.stderr


def test_without_the_entrypoint_slurms_cuda_visible_devices_lands_on_the_wrong_card(slurm: Slurm) -> None:
    # The same step, bare: CUDA numbers FASTEST_FIRST, so cuda:1 is the RTX 4090 (/dev/nvidia2), not /dev/nvidia1.
    done = slurm.run("srun", "--gres=gpu:2", PYTHON, "-c", PROVE)
    assert done.returncode != 0
    assert "MisalignedError: cuda:1 is " + BY_MINOR[2] in done.stderr
    assert f"SLURM_STEP_GPUS expects {BY_MINOR[1]}" in done.stderr


def test_gpus_per_task_each_task_proves_its_own_card(slurm: Slurm) -> None:
    done = slurm.run("srun", "-n2", "--gres=gpu:2", "--gpus-per-task=1", ENTRYPOINT, "--json", PYTHON, "-c", PROVE)
    assert done.returncode == 0, done.stderr
    rows = by_rank(done.stdout)
    assert rows["0"]["cuda"] == [BY_MINOR[0]] and rows["1"]["cuda"] == [BY_MINOR[1]]
    assert (rows["0"]["step_gpus"], rows["1"]["step_gpus"]) == ("0", "1")
    # The entrypoints' own reports (JSON on stderr, as a CMD follows): each task, its card and minor number.
    reports = sorted((json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")),
                     key=lambda r: r["source_detail"])
    assert [(r["source"], r["source_detail"]) for r in reports] == [
        ("SLURM_STEP_GPUS", "SLURM_STEP_GPUS=0 and CUDA_VISIBLE_DEVICES=0 (Slurm local rank 0)"),
        ("SLURM_STEP_GPUS", "SLURM_STEP_GPUS=1 and CUDA_VISIBLE_DEVICES=1 (Slurm local rank 1)")]
    assert [(d["cuda"], d["uuid"], d["minor_number"], d["note"]) for r in reports for d in r["devices"]] == [
        ("cuda:0", BY_MINOR[0], 0, "Slurm local rank 0, minor number 0"),
        ("cuda:0", BY_MINOR[1], 1, "Slurm local rank 1, minor number 1")]


def test_an_allocation_of_cards_3_and_1_rank_0_proves_1_and_rank_1_proves_3(slurm: Slurm) -> None:
    slurm.hold(1)  # /dev/nvidia0
    middle = slurm.hold(1)  # /dev/nvidia1
    slurm.hold(1)  # /dev/nvidia2
    slurm.release(middle)  # free: 1 and 3
    done = slurm.run("srun", "-n2", "--gres=gpu:2", "--gpus-per-task=1", ENTRYPOINT, PYTHON, "-c", PROVE)
    assert done.returncode == 0, done.stderr
    rows = by_rank(done.stdout)
    assert (rows["0"]["step_gpus"], rows["1"]["step_gpus"]) == ("1", "3")
    assert rows["0"]["cuda"] == [BY_MINOR[1]] and rows["1"]["cuda"] == [BY_MINOR[3]]
    assert "(Slurm local rank 0, minor number 1)" in done.stderr
    assert "(Slurm local rank 1, minor number 3)" in done.stderr


def test_a_job_script_that_sets_cuda_visible_devices_0_after_slurm_gave_card_2_is_refused_with_78(
        slurm: Slurm, tmp_path: Path) -> None:
    slurm.hold(2)  # /dev/nvidia0 and 1
    out = tmp_path / "job.out"
    job = tmp_path / "job.sh"
    job.write_text(f"""#!/bin/sh
export CUDA_VISIBLE_DEVICES=0
{ENTRYPOINT} true; echo "direct rc=$?"
srun {ENTRYPOINT} --quiet sh -c 'echo "srun rc=0 SLURM_STEP_GPUS=$SLURM_STEP_GPUS"'
""")
    done = slurm.run("sbatch", "--wait", "--gres=gpu:1", f"--output={out}", str(job))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "direct rc=78" in text
    errors = [line for line in text.splitlines() if "ERROR:" in line]
    assert len(errors) == 1
    assert errors[0].startswith(
        "gpupin-entrypoint: ERROR: Slurm local rank 0 was allocated minor number 2 (SLURM_JOB_GPUS=2), but "
        f"CUDA_VISIBLE_DEVICES=0 names /dev/nvidia0 ({BY_MINOR[0]} at 00000000:5E:00.0), outside the allocation. "
        "HINT: ")
    # A step inside the same job gets Slurm's own CUDA_VISIBLE_DEVICES back (measured), and is proven.
    assert "srun rc=0 SLURM_STEP_GPUS=2" in text


LAUNCHER = """import os, subprocess, sys
# torchrun-style: one Slurm task, one child per card, each with its own LOCAL_RANK and the task's SLURM_LOCALID.
code = ("import os; from gpupin.entrypoint import assert_pinned; r = int(os.environ[sys.argv[1]]); "
        "print(os.environ['LOCAL_RANK'], assert_pinned(local_rank=r)[0].uuid)")
procs = [subprocess.run([sys.executable, "-c", "import sys; " + code, sys.argv[1]], capture_output=True, text=True,
                        env=dict(os.environ, LOCAL_RANK=str(k))) for k in range(2)]
for p in procs:
    print(p.stdout.strip() or "failed: " + p.stderr.strip().splitlines()[-1])
"""


def test_assert_pinned_under_a_torchrun_style_launcher_inside_a_step(slurm: Slurm, tmp_path: Path) -> None:
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    done = slurm.run("srun", "--gres=gpu:2", ENTRYPOINT, "--quiet", PYTHON, str(launcher), "LOCAL_RANK")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [f"0 {BY_MINOR[0]}", f"1 {BY_MINOR[1]}"]
    # SLURM_LOCALID is 0 in both children: child 1 would check cuda:0, the card it does not use.
    done = slurm.run("srun", "--gres=gpu:2", ENTRYPOINT, "--quiet", PYTHON, str(launcher), "SLURM_LOCALID")
    assert done.stdout.split("\n")[:2] == [f"0 {BY_MINOR[0]}", f"1 {BY_MINOR[0]}"]


def test_with_one_card_per_task_slurm_localid_is_not_the_cuda_index(slurm: Slurm) -> None:
    code = ("import os; from gpupin.entrypoint import assert_pinned; "
            "assert_pinned(local_rank=int(os.environ['SLURM_LOCALID'])); print('ok', os.environ['SLURM_LOCALID'])")
    done = slurm.run("srun", "-n2", "--gres=gpu:2", "--gpus-per-task=1", ENTRYPOINT, "--quiet", PYTHON, "-c", code)
    assert done.returncode != 0
    assert "ok 0" in done.stdout and "ok 1" not in done.stdout
    assert "MisalignedError: local rank 1 has no expected card: GPUPIN_EXPECT lists 1" in done.stderr


def in_container(sandbox: Sandbox) -> str:
    """The job starts a container on the sandboxed daemon, passing Slurm's variables in; GPUS is the --gpus value."""
    return (f'exec {sandbox.docker_cli} run --rm --gpus "$GPUS" -e SLURM_STEP_GPUS -e CUDA_VISIBLE_DEVICES '
            f'-e SLURM_LOCALID {TEST_IMAGE} "$@"')


def test_inside_a_container_the_job_starts(slurm: Slurm, sandbox: Sandbox) -> None:
    sandbox.use("slurm-shuffled")  # the runtime hook must see the same cards as the node
    IN_CONTAINER = in_container(sandbox)
    try:
        # Every card in, Slurm's variables in: pinned to the allocation as on bare metal.
        done = slurm.run("srun", "--gres=gpu:2", "sh", "-c", 'GPUS=all; ' + IN_CONTAINER, "sh", "python3", "-c",
                         PROVE, DOCKER_HOST=sandbox.host)
        assert done.returncode == 0, done.stderr
        assert by_rank(done.stdout)["0"]["cuda"] == [BY_MINOR[0], BY_MINOR[1]]
        # The trap: Slurm's numbers given to the runtime, which reads NVML indices: other cards. Refused.
        done = slurm.run("srun", "--gres=gpu:2", "sh", "-c", 'GPUS="\\"device=$CUDA_VISIBLE_DEVICES\\""; '
                         + IN_CONTAINER, "sh", "true", DOCKER_HOST=sandbox.host)
        assert done.returncode == 78, done.stderr
        assert ("ERROR: Slurm local rank 0 was allocated minor numbers 0, 1 (SLURM_STEP_GPUS=0,1), but no card "
                "this process can see has minor number 0") in done.stderr
    finally:
        sandbox.use("mixed-4")

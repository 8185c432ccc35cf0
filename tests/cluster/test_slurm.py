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
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.host import ENTRYPOINT, REPO, required
from tests.support.sandbox import TEST_IMAGE, Sandbox, Sandboxes, engines_under_test
from tests.support.scenarios import cards, scenario, topology
from tests.support.wait import wait_for

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

    def up(self, name: str | Path) -> None:
        """Run the cluster for a shipped scenario (by name) or a topology file."""
        if self.topology == str(name):
            return
        env = dict(os.environ, FAKEGPU_TOPOLOGY=str(name if isinstance(name, Path) else scenario(name)))
        t0 = time.monotonic()
        done = subprocess.run([str(SCRIPT), "up"], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"slurm.sh up failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.conf = done.stdout.strip().rpartition("SLURM_CONF=")[2]
        self.topology = str(name)
        sys.stderr.write(f"slurm: up with {name} in {time.monotonic() - t0:.1f} s\n")

    @property
    def env(self) -> dict[str, str]:
        # What a user's shell on the login node has: no fake driver, no GPU variable; the node supplies those.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CUDA_", "GPUPIN_", "NVIDIA_", "SLURM_", "FAKEGPU_")) and k != "LD_LIBRARY_PATH"
        }
        env["SLURM_CONF"] = self.conf
        return env

    def run(self, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
        if args[0] in ("srun", "sbatch", "salloc"):
            self.settle()
        return subprocess.run(
            list(args), env={**self.env, **extra}, capture_output=True, text=True, timeout=timeout, cwd=REPO
        )

    def settle(self) -> None:
        """Wait for the jobs that just ended to leave the node: a job submitted while the last one is still
        completing waits for Slurm's next scheduling pass (2.5 s here), not for the cards."""
        wait_for(
            lambda: (
                not subprocess.run(
                    ["squeue", "-h", "-t", "CG"], env=self.env, capture_output=True, text=True
                ).stdout.strip()
            ),
            60,
            "the jobs that ended to leave the node",
        )

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
        wait_for(
            lambda: not self.run("squeue", "-h", "-j", job, "-t", "R").stdout.strip(),
            60,
            f"Slurm to take the cards of job {job} back",
        )
        self.settle()

    def release_all(self) -> None:
        for job in list(self.held):
            self.release(job)

    @property
    def run_dir(self) -> Path:
        return Path(self.conf).parent.parent

    def slurmd_devices(self) -> list[str]:
        """Slurm's own numbering of the node's gpu device files: slurmd logs them in gres_device->index order
        (DebugFlags=Gres, common_node_config_load)."""
        log = (self.run_dir / "log" / "slurmd.log").read_text()
        return re.findall(r"gpu device number -?\d+\((.*?)\):", log)


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
        if required():
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
PROVE = (
    "import json, os; from gpupin.entrypoint import assert_pinned; "
    "b = assert_pinned(); print(json.dumps({'rank': os.environ['SLURM_LOCALID'], "
    "'step_gpus': os.environ.get('SLURM_STEP_GPUS'), 'cvd': os.environ['CUDA_VISIBLE_DEVICES'], "
    "'order': os.environ.get('CUDA_DEVICE_ORDER'), 'cuda': [x.uuid for x in b]}))"
)


def by_rank(out: str) -> dict[str, dict[str, object]]:
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {str(r["rank"]): r for r in rows}


def test_the_cluster_is_real_and_sets_the_gpu_variables_itself(slurm: Slurm) -> None:
    done = slurm.run(
        "srun",
        "--gres=gpu:2",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES $SLURM_STEP_GPUS ${CUDA_DEVICE_ORDER:-unset} $SLURM_LOCALID",
    )
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
    assert f"(Slurm local rank 0, Slurm's GPU 1 = {slurm.run_dir}/dev/nvidia1)" in done.stderr


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
    reports = sorted(
        (json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")),
        key=lambda r: r["source_detail"],
    )
    gres = f"GPU numbers are positions in {slurm.run_dir}/etc/gres.conf"
    assert [(r["source"], r["source_detail"]) for r in reports] == [
        ("SLURM_STEP_GPUS", f"SLURM_STEP_GPUS=0 and CUDA_VISIBLE_DEVICES=0 (Slurm local rank 0); {gres}"),
        ("SLURM_STEP_GPUS", f"SLURM_STEP_GPUS=1 and CUDA_VISIBLE_DEVICES=1 (Slurm local rank 1); {gres}"),
    ]
    dev = slurm.run_dir / "dev"
    assert [(d["cuda"], d["uuid"], d["minor_number"], d["note"]) for r in reports for d in r["devices"]] == [
        ("cuda:0", BY_MINOR[0], 0, f"Slurm local rank 0, Slurm's GPU 0 = {dev}/nvidia0"),
        ("cuda:0", BY_MINOR[1], 1, f"Slurm local rank 1, Slurm's GPU 1 = {dev}/nvidia1"),
    ]


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
    assert f"(Slurm local rank 0, Slurm's GPU 1 = {slurm.run_dir}/dev/nvidia1)" in done.stderr
    assert f"(Slurm local rank 1, Slurm's GPU 3 = {slurm.run_dir}/dev/nvidia3)" in done.stderr


def test_a_job_script_that_sets_cuda_visible_devices_0_after_slurm_gave_card_2_is_refused_with_78(
    slurm: Slurm, tmp_path: Path
) -> None:
    slurm.hold(2)  # /dev/nvidia0 and 1
    out = tmp_path / "job.out"
    job = tmp_path / "job.sh"
    job.write_text(f"""#!/bin/sh
export CUDA_VISIBLE_DEVICES=0
{shlex.quote(ENTRYPOINT)} true; echo "direct rc=$?"
srun {shlex.quote(ENTRYPOINT)} --quiet sh -c 'echo "srun rc=0 SLURM_STEP_GPUS=$SLURM_STEP_GPUS"'
""")
    done = slurm.run("sbatch", "--wait", "--gres=gpu:1", f"--output={out}", str(job))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "direct rc=78" in text
    errors = [line for line in text.splitlines() if "ERROR:" in line]
    assert len(errors) == 1
    dev, etc = slurm.run_dir / "dev", slurm.run_dir / "etc"
    assert errors[0].startswith(
        f"gpupin-entrypoint: ERROR: Slurm local rank 0 was allocated GPU 2 (SLURM_JOB_GPUS=2: {dev}/nvidia2 by "
        f"{etc}/gres.conf), but CUDA_VISIBLE_DEVICES=0 names {dev}/nvidia0 ({BY_MINOR[0]} at 00000000:5E:00.0), "
        "outside the allocation. HINT: "
    )
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
    code = (
        "import os; from gpupin.entrypoint import assert_pinned; "
        "assert_pinned(local_rank=int(os.environ['SLURM_LOCALID'])); print('ok', os.environ['SLURM_LOCALID'])"
    )
    done = slurm.run("srun", "-n2", "--gres=gpu:2", "--gpus-per-task=1", ENTRYPOINT, "--quiet", PYTHON, "-c", code)
    assert done.returncode != 0
    assert "ok 0" in done.stdout and "ok 1" not in done.stdout
    assert "MisalignedError: local rank 1 has no expected card: GPUPIN_EXPECT lists 1" in done.stderr


def in_container(sandbox: Sandbox) -> str:
    """The job starts a container on the sandboxed daemon, passing Slurm's variables in; GPUS is the --gpus value."""
    return (
        f'exec {shlex.quote(sandbox.docker_cli)} run --rm --gpus "$GPUS" -e SLURM_STEP_GPUS -e CUDA_VISIBLE_DEVICES '
        f'-e SLURM_LOCALID {TEST_IMAGE} "$@"'
    )


def test_inside_a_container_the_job_starts(slurm: Slurm, sandbox: Sandbox) -> None:
    sandbox.use("slurm-shuffled")  # the runtime hook must see the same cards as the node
    IN_CONTAINER = in_container(sandbox)
    try:
        # Every card in, Slurm's variables in: pinned to the allocation as on bare metal.
        done = slurm.run(
            "srun",
            "--gres=gpu:2",
            "sh",
            "-c",
            "GPUS=all; " + IN_CONTAINER,
            "sh",
            "python3",
            "-c",
            PROVE,
            DOCKER_HOST=sandbox.host,
        )
        assert done.returncode == 0, done.stderr
        assert by_rank(done.stdout)["0"]["cuda"] == [BY_MINOR[0], BY_MINOR[1]]
        # The trap: Slurm's numbers given to the runtime, which reads NVML indices: other cards. Refused.
        done = slurm.run(
            "srun",
            "--gres=gpu:2",
            "sh",
            "-c",
            'GPUS="\\"device=$CUDA_VISIBLE_DEVICES\\""; ' + IN_CONTAINER,
            "sh",
            "true",
            DOCKER_HOST=sandbox.host,
        )
        assert done.returncode == 78, done.stderr
        assert (
            "ERROR: Slurm local rank 0 was allocated minor numbers 0, 1 (SLURM_STEP_GPUS=0,1), but no card "
            "this process can see has minor number 0"
        ) in done.stderr
    finally:
        sandbox.use("mixed-4")


# --- gres.conf out of minor order: Slurm's numbers are positions in gres.conf, not minor numbers ---------------------
# (tests/fakegpu/scenarios/slurm-gres-order.json: eight cards; gres.conf lists nvidia7, nvidia3, nvidia[5,1],
# nvidia[0,2,4,6] on four lines.) These tests start the cluster with other topologies, so they come last.

GRES_ORDER = {g.get("minor_number", i): g["uuid"] for i, g in enumerate(topology("slurm-gres-order")["gpus"])}


def test_srun_on_a_gres_conf_out_of_minor_order_proves_the_cards_slurm_gave(slurm_cluster: Slurm) -> None:
    slurm = slurm_cluster
    slurm.up("slurm-gres-order")
    dev = slurm.run_dir / "dev"
    # Slurm's own numbering (slurmd's log): GPU 0 is /dev/nvidia7, GPU 1 /dev/nvidia3.
    assert slurm.slurmd_devices() == [f"{dev}/nvidia{m}" for m in (7, 3, 5, 1, 0, 2, 4, 6)]
    done = slurm.run("srun", "--gres=gpu:2", ENTRYPOINT, PYTHON, "-c", PROVE)
    assert done.returncode == 0, done.stderr
    row = by_rank(done.stdout)["0"]
    assert row["step_gpus"] == "0,1"
    assert row["cuda"] == [GRES_ORDER[7], GRES_ORDER[3]]
    assert f"GPU numbers are positions in {slurm.run_dir}/etc/gres.conf" in done.stderr
    assert f"(Slurm local rank 0, Slurm's GPU 0 = {dev}/nvidia7)" in done.stderr
    # The old reading (the number as the minor number), which is what is left where gres.conf cannot be read:
    # it proves /dev/nvidia0 and /dev/nvidia1 instead, cards the job was not given, and says how it read them.
    done = slurm.run(
        "srun",
        "--gres=gpu:2",
        "sh",
        "-c",
        'SLURM_CONF=/nonexistent/slurm.conf exec "$@"',
        "sh",
        ENTRYPOINT,
        PYTHON,
        "-c",
        PROVE,
    )
    assert done.returncode == 0, done.stderr
    old = by_rank(done.stdout)["0"]["cuda"]
    assert old == [GRES_ORDER[0], GRES_ORDER[1]] and not set(old) & {GRES_ORDER[7], GRES_ORDER[3]}
    assert (
        "GPU numbers read as minor numbers: no readable /nonexistent/gres.conf here (No such file or directory)"
    ) in done.stderr


def test_gpus_per_task_on_a_gres_conf_out_of_minor_order(slurm_cluster: Slurm) -> None:
    slurm = slurm_cluster
    slurm.up("slurm-gres-order")
    slurm.hold(2)  # Slurm's GPUs 0 and 1: /dev/nvidia7 and /dev/nvidia3
    done = slurm.run("srun", "-n2", "--gres=gpu:2", "--gpus-per-task=1", ENTRYPOINT, PYTHON, "-c", PROVE)
    slurm.release_all()
    assert done.returncode == 0, done.stderr
    rows = by_rank(done.stdout)
    assert (rows["0"]["step_gpus"], rows["1"]["step_gpus"]) == ("2", "3")
    assert rows["0"]["cuda"] == [GRES_ORDER[5]] and rows["1"]["cuda"] == [GRES_ORDER[1]]


def _variant(tmp: Path, name: str, base: str, slurm: dict[str, object]) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({**topology(base), "slurm": slurm}))
    return path


# Each: (base scenario, the topology's "slurm" object). Every rule of gpupin.entrypoint.gresconf, against slurmd.
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "name-records-before-nodename-records": (
        "dgx-8",
        {
            "gres_conf": [
                "NodeName={node} Name=gpu File={dev}/nvidia7",
                "Name=gpu File={dev}/nvidia3",
                "NodeName=other,{node} Name=gpu File={dev}/nvidia[5,1]",
                "Name=gpu File={dev}/nvidia[0,2,4,6]",
                "NodeName=other Name=gpu File={dev}/nvidia[0-3]",
            ]
        },
    ),
    "types-in-slurm-conf-order": (
        "dgx-8",
        {
            "node_gres": "gpu:bb:4,gpu:a:4",
            "gres_conf": [
                "Name=gpu Type=a File={dev}/nvidia[7,3]",
                "Name=gpu Type=bb File={dev}/nvidia[5,1]",
                "Name=gpu Type=a File={dev}/nvidia[0,2]",
                "Name=gpu Type=bb File={dev}/nvidia[4,6]",
            ],
        },
    ),
    "syntax": (
        "dgx-8",
        {
            "gres_conf": [
                "# comment",
                "NodeName={node} Name=gpu \\",
                "   File={dev}/nvidia6,{dev}/nvidia[4-5] # trailing comment",
                'nodename={node} name=gpu file="{dev}/nvidia[3,2,1,0,7]"',
            ]
        },
    ),
    "a-path-that-is-no-device-takes-no-number": (
        "slurm-shuffled",
        {
            "node_gres": "gpu:5",
            "gres_conf": [
                "Name=gpu File={dev}/nvidia3",
                "Name=gpu File={dev}/../etc/task_prolog.sh",
                "Name=gpu File={dev}/nvidia[1,0,2]",
            ],
        },
    ),
    "autodetect-nvml-on-a-slurm-without-nvml": (
        "slurm-shuffled",
        {"gres_conf": ["AutoDetect=nvml", "Name=gpu File={dev}/nvidia[2,0,3,1]"]},
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpupin_reads_gres_conf_as_slurmd_does(
    slurm_cluster: Slurm, variant: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from gpupin.entrypoint import gresconf

    base, spec = VARIANTS[variant]
    slurm_cluster.up(_variant(tmp_path_factory.mktemp("gres"), variant, base, spec))
    slurmd = slurm_cluster.slurmd_devices()
    assert slurmd, "slurmd listed no gpu device file"
    _, devices = gresconf.read({"SLURM_CONF": slurm_cluster.conf, "SLURMD_NODENAME": "gpupin"})
    assert [d.files[0] for d in devices] == slurmd
    done = slurm_cluster.run("srun", f"--gres=gpu:{len(slurmd)}", "sh", "-c", "echo $SLURM_STEP_GPUS")
    assert done.stdout.split() == [",".join(map(str, range(len(slurmd))))], done.stderr


def test_autodetect_nvml_numbers_the_cards_in_nvml_order(
    slurm_cluster: Slurm, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Slurm's own AutoDetect merge, fed by its fake_gpus.conf test hook as gpu/nvml would feed it: each card with
    # -1 at its own NVML index in its link matrix (slurm-shuffled: NVML 0..3 are minors 1, 3, 0, 2).
    by_index = sorted(cards("slurm-shuffled"), key=lambda c: c.index)
    links = [",".join("-1" if j == i else "0" for j in range(4)) for i in range(4)]
    fake = [f"(null)|8|0-7|{links[c.index]}|{{dev}}/nvidia{c.minor_number}|(null)|nvidia_gpu_env" for c in by_index]
    path = _variant(
        tmp_path_factory.mktemp("gres"),
        "autodetect",
        "slurm-shuffled",
        {"gres_conf": ["AutoDetect=nvml"], "fake_gpus_conf": fake},
    )
    slurm_cluster.up(path)
    dev = slurm_cluster.run_dir / "dev"
    assert slurm_cluster.slurmd_devices() == [f"{dev}/nvidia{c.minor_number}" for c in by_index]
    done = slurm_cluster.run("srun", "--gres=gpu:2", ENTRYPOINT, PYTHON, "-c", PROVE)
    assert done.returncode == 0, done.stderr
    assert by_rank(done.stdout)["0"]["cuda"] == [by_index[0].uuid, by_index[1].uuid]  # minors 1 and 3
    assert "GPU numbers in NVML's order (AutoDetect=nvml in " in done.stderr


def test_inside_a_container_given_the_nodes_gres_conf(slurm_cluster: Slurm, sandboxes: Sandboxes) -> None:
    # Every card in, Slurm's variables and the node's gres.conf in (as docs/slurm.md says): the container has none
    # of the node's device files, so each file's minor number comes from its name, and the cards Slurm gave are
    # proven. One engine is enough: what is tested is the entrypoint's reading, not the engine.
    sandbox = sandboxes.get(engines_under_test()[0]).use("slurm-gres-order")
    slurm_cluster.up("slurm-gres-order")
    etc = slurm_cluster.run_dir / "etc"
    run = (
        f"exec {shlex.quote(sandbox.docker_cli)} run --rm --gpus all -e SLURM_STEP_GPUS -e CUDA_VISIBLE_DEVICES "
        "-e SLURM_LOCALID "
        f'-e SLURM_CONF -e SLURMD_NODENAME -v {etc}:{etc}:ro {TEST_IMAGE} "$@"'
    )
    try:
        done = slurm_cluster.run(
            "srun", "--gres=gpu:2", "sh", "-c", run, "sh", "python3", "-c", PROVE, DOCKER_HOST=sandbox.host
        )
        assert done.returncode == 0, done.stderr
        assert by_rank(done.stdout)["0"]["cuda"] == [GRES_ORDER[7], GRES_ORDER[3]]
        assert (
            f"Slurm's GPU 0 = {slurm_cluster.run_dir}/dev/nvidia7 (minor number from its name: no such file or "
            "directory here)"
        ) in done.stderr
    finally:
        sandbox.use("mixed-4")

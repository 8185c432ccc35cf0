"""Slurm's allocation as the expectation (gpupin.entrypoint.slurm), pure: the environments Slurm 22.05 writes
(measured by tests/cluster/test_slurm.py), and what a job script or launcher makes of them, over the slurm-shuffled box
(minor numbers neither in PCI nor in FASTEST_FIRST order); and the node's gres.conf as slurmd reads it
(gpupin.entrypoint.gresconf), which says which card each of Slurm's GPU numbers is.

The tests of the allocation's order run where no gres.conf can be read (a container without the node's), where the
number is read as the minor number; the gres.conf tests write one into tmp_path and point SLURM_CONF at it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupin.core.errors import ExpectationError, MisalignedError
from gpupin.core.expectation import Expectation
from gpupin.core.nvml import Card
from gpupin.entrypoint import gresconf, slurmconf
from gpupin.entrypoint.sources import find
from tests.support.scenarios import cards

BOX = cards("slurm-shuffled")  # NVML (PCI) order: 1B minor 1, 3B minor 3, 5E minor 0 (H100), AF minor 2 (4090)
BY_MINOR = {c.minor_number: str(c.uuid) for c in BOX}


NO_CONF = "/nonexistent/gpupin-test/slurm.conf"  # unless a test says otherwise, no gres.conf can be read
FALLBACK = (
    "GPU numbers read as minor numbers: no readable /nonexistent/gpupin-test/gres.conf here (No such file or directory)"
)


def expect(env: dict[str, str], box: list[Card] = BOX) -> Expectation:
    found = find({"SLURM_CONF": NO_CONF, **env}, cards=lambda: box)
    assert found.expectation is not None, found.why_unpinned()
    return found.expectation


def refusal(env: dict[str, str], box: list[Card] = BOX) -> str:
    with pytest.raises(MisalignedError) as e:
        find({"SLURM_CONF": NO_CONF, **env}, cards=lambda: box)
    assert e.value.exit_code == 78 and e.value.hint
    return e.value.message


def test_the_scenario_keeps_minor_pci_and_fastest_first_orders_apart() -> None:
    assert [c.minor_number for c in BOX] == [1, 3, 0, 2]  # NVML index 0..3 are minors 1, 3, 0, 2
    assert [c.compute_capability for c in BOX] == ["8.0", "8.0", "9.0", "8.9"]


@pytest.mark.parametrize("var", ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS"])
def test_slurms_own_values_give_the_allocated_minor_numbers_in_its_order(var: str) -> None:
    e = expect({var: "1,3", "CUDA_VISIBLE_DEVICES": "1,3", "SLURM_LOCALID": "0"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[1], BY_MINOR[3]]
    assert e.source == var
    assert e.detail == f"{var}=1,3 and CUDA_VISIBLE_DEVICES=1,3 (Slurm local rank 0); {FALLBACK}"
    assert [c.note for c in e.cards] == ["Slurm local rank 0, minor number 1", "Slurm local rank 0, minor number 3"]
    assert [str(c.bus_id) for c in e.cards] == ["00000000:1B:00.0", "00000000:3B:00.0"]


def test_the_step_wins_over_the_job_inside_srun() -> None:
    e = expect({"SLURM_JOB_GPUS": "0,1,2", "SLURM_STEP_GPUS": "2", "CUDA_VISIBLE_DEVICES": "2"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[2]] and e.source == "SLURM_STEP_GPUS"


def test_each_gpus_per_task_task_gets_its_own_card() -> None:
    ranks = [
        expect({"SLURM_STEP_GPUS": str(m), "CUDA_VISIBLE_DEVICES": str(m), "SLURM_LOCALID": str(r)})
        for r, m in enumerate([0, 1])
    ]
    assert [e.cards[0].uuid for e in ranks] == [BY_MINOR[0], BY_MINOR[1]]
    assert ranks[1].cards[0].note == "Slurm local rank 1, minor number 1"


def test_a_launcher_may_reorder_or_pick_within_the_allocation() -> None:
    e = expect({"SLURM_STEP_GPUS": "0,1,2", "CUDA_VISIBLE_DEVICES": "2,0"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[2], BY_MINOR[0]]
    e = expect({"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": f"{BY_MINOR[1]},0"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[1], BY_MINOR[0]]


def test_unset_cuda_visible_devices_means_the_allocation_in_slurms_order() -> None:
    e = expect({"SLURM_JOB_GPUS": "3,0"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[3], BY_MINOR[0]]
    assert e.detail == f"SLURM_JOB_GPUS=3,0 and CUDA_VISIBLE_DEVICES unset (the Slurm job); {FALLBACK}"


def test_a_job_script_that_sets_cuda_visible_devices_outside_the_allocation_is_refused() -> None:
    msg = refusal({"SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": "0", "SLURM_LOCALID": "0"})
    assert msg == (
        f"Slurm local rank 0 was allocated minor number 2 (SLURM_JOB_GPUS=2), but CUDA_VISIBLE_DEVICES=0 "
        f"names /dev/nvidia0 ({BY_MINOR[0]} at 00000000:5E:00.0), outside the allocation"
    )


@pytest.mark.parametrize(
    ("cvd", "says"),
    [
        ("1,7", "names /dev/nvidia7, which is not here, outside the allocation"),
        ("", "hides every card"),
        ("1,1", "names a card twice"),
        (f"1,{BY_MINOR[1]}", "names a card twice"),
        ("bogus", "'bogus' names no card"),
        ("GPU-ffff", "no card's UUID starts with 'GPU-ffff'"),
    ],
)
def test_what_no_slurm_wrote_is_refused_naming_rank_minors_and_both_values(cvd: str, says: str) -> None:
    msg = refusal({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": cvd, "SLURM_LOCALID": "1"})
    assert msg.startswith(
        f"Slurm local rank 1 was allocated minor numbers 1, 3 (SLURM_STEP_GPUS=1,3), but CUDA_VISIBLE_DEVICES={cvd}"
    )
    assert says in msg


def test_a_uuid_outside_the_allocation_is_refused() -> None:
    msg = refusal({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": BY_MINOR[0]})
    assert f"names {BY_MINOR[0]} (/dev/nvidia0), outside the allocation" in msg


def test_local_numbering_where_only_the_allocation_is_visible() -> None:
    # ConstrainDevices=yes, or a container started with the job's cards: NVML sees only them, and
    # CUDA_VISIBLE_DEVICES counts within the allocation (Slurm then writes 0..n-1).
    only = [c for c in BOX if c.minor_number in (1, 3)]
    e = expect({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1"}, only)
    assert [c.uuid for c in e.cards] == [BY_MINOR[1], BY_MINOR[3]]
    e = expect({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "1"}, only)
    assert [c.uuid for c in e.cards] == [BY_MINOR[3]]
    # Slurm's own numbers passed into such a container still mean the allocated cards.
    e = expect({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "3,1"}, only)
    assert [c.uuid for c in e.cards] == [BY_MINOR[3], BY_MINOR[1]]
    assert "outside the allocation" in refusal({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,5"}, only)


def test_an_allocated_card_this_process_cannot_see_is_refused() -> None:
    only = [c for c in BOX if c.minor_number == 1]
    msg = refusal({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "1,3"}, only)
    assert "no card this process can see has minor number 3" in msg


@pytest.mark.parametrize("value", ["", "NoDevFiles"])
def test_an_allocation_without_device_files_names_no_card(value: str) -> None:
    found = find({"SLURM_JOB_GPUS": value, "SLURM_CONF": NO_CONF}, cards=lambda: BOX)
    assert found.expectation is None
    assert f"SLURM_JOB_GPUS={value} names no card" in found.why_unpinned()


@pytest.mark.parametrize("value", ["0,x", "1,1", "-1", "0, 1 2"])
def test_a_malformed_allocation_is_64(value: str) -> None:
    with pytest.raises(ExpectationError) as e:
        find({"SLURM_STEP_GPUS": value, "SLURM_CONF": NO_CONF}, cards=lambda: BOX)
    assert e.value.exit_code == 64 and "SLURM_STEP_GPUS" in e.value.message


def test_every_earlier_source_wins_over_slurm() -> None:
    env = {"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert expect({**env, "GPUPIN_EXPECT": BY_MINOR[0]}).source == "GPUPIN_EXPECT"
    assert expect({**env, "NVIDIA_VISIBLE_DEVICES": BY_MINOR[0]}).source == "NVIDIA_VISIBLE_DEVICES"


def test_outside_slurm_nothing_slurm_is_imported_or_read() -> None:
    code = (
        "import sys; from gpupin.entrypoint.sources import find; "
        "f = find({'SLURM_LOCALID': '0', 'SLURM_JOB_ID': '7'}, cards=list); "
        "print(f.expectation, 'gpupin.entrypoint.slurm' in sys.modules, 'gpupin.entrypoint.gresconf' in "
        "sys.modules, f.why_unpinned())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == (
        "None False False GPUPIN_EXPECT, NVIDIA_VISIBLE_DEVICES, DOCKER_RESOURCE_*, "
        "SLURM_STEP_GPUS/SLURM_JOB_GPUS unset"
    )


def test_the_help_lists_slurm_as_a_source() -> None:
    from gpupin.entrypoint.cli import HELP

    sources = HELP.split("comes from, in this order:")[1].split("The workload gets")[0]
    assert [line.split()[0] for line in sources.splitlines() if line[:3].strip()] == [
        "GPUPIN_EXPECT",
        "/var/run/kubernetes.io/dra-device-attributes",
        "NVIDIA_VISIBLE_DEVICES",
        "/var/run/nvidia-container-devices",
        "DOCKER_RESOURCE_*",
        "SLURM_STEP_GPUS",
    ]
    assert "SLURM_JOB_GPUS in a batch script" in sources and "refused (78)" in sources


# --- gres.conf as slurmd reads it (gpupin.entrypoint.gresconf; tests/cluster/test_slurm.py asks slurmd itself) --


def gres_env(tmp: Path, gres: str, slurm_conf: str | None = None, node: str = "node3") -> dict[str, str]:
    """An environment whose SLURM_CONF points at a directory holding this gres.conf (and slurm.conf)."""
    (tmp / "gres.conf").write_text(gres.replace("{dev}", str(tmp / "dev")))
    if slurm_conf is not None:
        (tmp / "slurm.conf").write_text(slurm_conf)
    return {"SLURM_CONF": str(tmp / "slurm.conf"), "SLURMD_NODENAME": node}


def files(env: dict[str, str]) -> list[str]:
    """The device files of Slurm's GPUs 0, 1, ... (names only, relative to the test's dev directory)."""
    _, devices = gresconf.read(env)
    return [",".join(Path(f).name for f in d.files) for d in devices]


@pytest.mark.parametrize(
    ("hostlist", "names"),
    [
        ("/dev/nvidia[7,3]", ["/dev/nvidia7", "/dev/nvidia3"]),
        ("/dev/nvidia[0-3,5]", ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidia5"]),
        ("/dev/nvidia6,/dev/nvidia[4-5]", ["/dev/nvidia6", "/dev/nvidia4", "/dev/nvidia5"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("node[1-2] gpu7", ["node1", "node2", "gpu7"]),
        ("rack[1-2]-n[0-1]", ["rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1"]),
        ("plain", ["plain"]),
    ],
)
def test_host_lists_expand_in_the_order_written(hostlist: str, names: list[str]) -> None:
    assert slurmconf.expand(hostlist) == names


@pytest.mark.parametrize("bad", ["/dev/nvidia[3-1]", "/dev/nvidia[a]", "/dev/nvidia[1]x", "/dev/nvidia[1"])
def test_a_malformed_host_list_is_an_error(bad: str) -> None:
    with pytest.raises(slurmconf.GresConfError):
        slurmconf.expand(bad)


def test_slurms_config_syntax_comments_continuations_quotes_escapes_and_include(tmp_path: Path) -> None:
    (tmp_path / "more.conf").write_text("Name=gpu File={dev}/nvidia9\n")
    env = gres_env(
        tmp_path,
        "# a comment line\n"
        "NodeName=node3 Name=gpu \\\n"
        "    File={dev}/nvidia6,{dev}/nvidia[4-5]   # a trailing comment\n"
        "\n"
        'nodename=node3 NAME=gpu file="{dev}/nvidia[3,2]"\n'
        "Name=gpu File={dev}/nvidia1 Flags=nvidia_gpu_env  # Flags=\\#ignored\n"
        "Include more.conf\n",
    )
    # Name= records first (nvidia1, then the included nvidia9), then this node's NodeName= records, in file order.
    assert files(env) == ["nvidia1", "nvidia9", "nvidia6", "nvidia4", "nvidia5", "nvidia3", "nvidia2"]


def test_only_this_nodes_records_and_only_gpu_make_devices(tmp_path: Path) -> None:
    env = gres_env(
        tmp_path,
        "NodeName=node[1-4] Name=gpu File={dev}/nvidia[3,1]\n"
        "NodeName=node[5-8] Name=gpu File={dev}/nvidia[0-3]\n"
        "NodeName=node3,login1 Name=gpu File={dev}/nvidia0\n"
        "NodeName=node3 Name=mps Count=200 File={dev}/nvidia[0-1]\n"
        "NodeName=node[9-1] Name=gpu File={dev}/nvidia5\n"  # a host list naming no node
        "Name=shard Count=8\n",
    )
    assert files(env) == ["nvidia3", "nvidia1", "nvidia0"]
    env["SLURMD_NODENAME"] = "node6"
    assert files(env) == ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]


def test_without_slurmd_nodename_the_hosts_short_name_is_the_node(tmp_path: Path) -> None:
    short = os.uname().nodename.split(".")[0]
    env = gres_env(
        tmp_path, f"NodeName={short} Name=gpu File={{dev}}/nvidia2\nNodeName=x Name=gpu File={{dev}}/nvidia1\n"
    )
    del env["SLURMD_NODENAME"]
    assert files(env) == ["nvidia2"]


def test_one_type_keeps_file_order_without_reading_slurm_conf(tmp_path: Path) -> None:
    env = gres_env(tmp_path, "Name=gpu Type=a100 File={dev}/nvidia[7,3]\nName=gpu Type=A100 File={dev}/nvidia1\n")
    assert files(env) == ["nvidia7", "nvidia3", "nvidia1"]  # no slurm.conf was written


def test_several_types_follow_slurm_confs_type_order_each_cut_at_its_count(tmp_path: Path) -> None:
    gres = (
        "Name=gpu Type=a File={dev}/nvidia[7,3]\nName=gpu Type=bb File={dev}/nvidia[5,1]\n"
        "Name=gpu Type=a File={dev}/nvidia[0,2]\nName=gpu Type=bb File={dev}/nvidia[4,6]\n"
    )
    env = gres_env(
        tmp_path, gres, "NodeName=DEFAULT Gres=gpu:a:4\nNodeName=node[1-4] CPUs=8 Gres=gpu:bb:3,gpu:a:4 State=UNKNOWN\n"
    )
    assert files(env) == ["nvidia5", "nvidia1", "nvidia4", "nvidia7", "nvidia3", "nvidia0", "nvidia2"]
    (tmp_path / "slurm.conf").write_text("NodeName=DEFAULT Gres=gpu:a:2\nNodeName=node3 CPUs=8\n")
    assert files(env) == ["nvidia7", "nvidia3"]  # the DEFAULT line's Gres: type a only, 2 of them
    (tmp_path / "slurm.conf").write_text("NodeName=node3 Gres=gpu:8\n")
    assert files(env) == ["nvidia7", "nvidia3", "nvidia5", "nvidia1", "nvidia0", "nvidia2", "nvidia4", "nvidia6"]
    (tmp_path / "slurm.conf").unlink()
    with pytest.raises(slurmconf.GresConfError, match=r"several Type=s, whose order slurm\.conf gives"):
        gresconf.read(env)


def test_multiple_files_is_one_gpu_and_a_path_that_is_no_device_takes_no_number(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia5").write_text("a regular file: slurmd skips it")
    env = gres_env(
        tmp_path,
        "Name=gpu File={dev}/nvidia[4,5,6]\n"
        "Name=gpu MultipleFiles={dev}/nvidia0,{dev}/nvidia-caps/nvidia-cap21\n"
        "Name=GPU File={dev}/nvidia7\n",
    )
    assert files(env) == ["nvidia4", "nvidia6", "nvidia0,nvidia-cap21"]


@pytest.mark.parametrize(
    ("gres", "autodetect"),
    [
        ("AutoDetect=nvml\n", "nvml"),
        ("AutoDetect=NVML\nNodeName=node3 AutoDetect=off\n", None),  # node-local wins
        ("AutoDetect=off\nNodeName=node3 AutoDetect=nvml\n", "nvml"),
        ("NodeName=node9 AutoDetect=nvml\n", None),  # another node's
        ("AutoDetect=bogus\n", None),  # slurmd: "unknown autodetect flag", unset
        ("AutoDetect=rsmi\n", "rsmi"),
        ("Name=gpu AutoDetect=nvml File={dev}/nvidia0\n", None),  # in-line AutoDetect needs NodeName
    ],
)
def test_autodetect_node_local_wins_over_global(tmp_path: Path, gres: str, autodetect: str | None) -> None:
    conf, _ = gresconf.read(gres_env(tmp_path, gres))
    assert conf.autodetect == autodetect


def test_a_missing_or_unreadable_gres_conf_is_a_reason_not_an_error(tmp_path: Path) -> None:
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    with pytest.raises(slurmconf.GresConfError, match=f"no readable {tmp_path}/gres.conf here .No such file"):
        gresconf.read(env)
    (tmp_path / "gres.conf").mkdir()
    with pytest.raises(slurmconf.GresConfError, match="it is a directory, not a regular file"):
        gresconf.read(env)
    (tmp_path / "gres.conf").rmdir()
    os.mkfifo(tmp_path / "gres.conf")  # never waited on
    with pytest.raises(slurmconf.GresConfError, match="it is a FIFO, not a regular file"):
        gresconf.read(env)
    (tmp_path / "gres.conf").unlink()
    (tmp_path / "gres.conf").symlink_to("/dev/zero")  # never read to its end
    with pytest.raises(slurmconf.GresConfError, match="it is a character device, not a regular file"):
        gresconf.read(env)
    assert slurmconf.conf_path({}, "gres.conf") == "/etc/slurm/gres.conf"


def test_a_gres_conf_slurm_could_not_read_is_a_reason(tmp_path: Path) -> None:
    with pytest.raises(slurmconf.GresConfError, match="bad range"):
        gresconf.read(gres_env(tmp_path, "Name=gpu File={dev}/nvidia[3-1]\n"))
    with pytest.raises(slurmconf.GresConfError, match="cannot read"):
        gresconf.read(gres_env(tmp_path, "Name=gpu File={dev}/nvidia0 = oops\n"))


def test_the_limits_of_a_slurm_config(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(slurmconf.GresConfError, match="names more than 131072 files or hosts"):
        gresconf.read(gres_env(tmp_path, "Name=gpu File={dev}/nvidia[0-65536]x[0-65536]\n"))
    (tmp_path / "fan.conf").write_text("Include mid.conf\n" * 300)  # 90,000 reads of a few bytes
    (tmp_path / "mid.conf").write_text("Include leaf.conf\n" * 300)
    (tmp_path / "leaf.conf").write_text("\n")
    with pytest.raises(slurmconf.GresConfError, match="more than 64 files through `Include`"):
        gresconf.read(gres_env(tmp_path, "Include fan.conf\n"))
    (tmp_path / "big.conf").write_text("#" * (slurmconf.MAX_BYTES + 1))
    with pytest.raises(slurmconf.GresConfError, match="larger than 1 MiB"):
        gresconf.read(gres_env(tmp_path, "Include big.conf\n"))
    assert time.monotonic() - started < 5


def test_the_minor_number_is_stat_ed_else_read_from_the_name(tmp_path: Path) -> None:
    assert gresconf.minor_of(str(tmp_path / "nvidia12")) == (
        12,
        "minor number from its name: no such file or directory here",
    )
    assert gresconf.minor_of(str(tmp_path / "gpu0")) == (
        None,
        f"{tmp_path}/gpu0 is not here (No such file or directory) and its name gives no minor number",
    )
    assert gresconf.minor_of("/dev/null") == (None, "/dev/null is device 1:3, not an NVIDIA GPU (195:N)")
    assert gresconf.minor_of(str(tmp_path)) == (None, f"{tmp_path} is not a character device")
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    node = tmp_path / "nvidia9"
    os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(195, 2))
    assert gresconf.minor_of(str(node)) == (2, "")  # the device's own minor number wins over the name


# --- Slurm's numbers read through gres.conf (gpupin.entrypoint.slurm) -----------------------------------------------


def test_the_numbers_are_positions_in_gres_conf_not_minor_numbers(tmp_path: Path) -> None:
    env = gres_env(tmp_path, "Name=gpu File={dev}/nvidia3\nName=gpu File={dev}/nvidia[1,0,2]\n")
    e = expect({**env, "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_LOCALID": "0"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[3], BY_MINOR[1]]  # the old reading: BY_MINOR[0], BY_MINOR[1]
    assert e.detail == (
        f"SLURM_STEP_GPUS=0,1 and CUDA_VISIBLE_DEVICES=0,1 (Slurm local rank 0); GPU numbers are "
        f"positions in {tmp_path}/gres.conf"
    )
    assert e.cards[0].note == (
        f"Slurm local rank 0, Slurm's GPU 0 = {tmp_path}/dev/nvidia3 (minor number from its "
        "name: no such file or directory here)"
    )
    # A launcher's reordering within the allocation, in Slurm's numbers, is followed.
    e = expect({**env, "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "1,0"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[1], BY_MINOR[3]]


def test_outside_the_allocation_names_the_device_file_of_that_number(tmp_path: Path) -> None:
    env = gres_env(tmp_path, "Name=gpu File={dev}/nvidia[3,1,0,2]\n")
    msg = refusal({**env, "SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "2", "SLURM_LOCALID": "0"})
    assert msg.startswith(f"Slurm local rank 0 was allocated GPU 1 (SLURM_JOB_GPUS=1: {tmp_path}/dev/nvidia1 ")
    assert msg.endswith(
        f"but CUDA_VISIBLE_DEVICES=2 names {tmp_path}/dev/nvidia0 (minor number from its name: no "
        f"such file or directory here) ({BY_MINOR[0]} at 00000000:5E:00.0), outside the allocation"
    )


def test_a_number_beyond_gres_conf_or_a_card_not_here_is_refused(tmp_path: Path) -> None:
    env = gres_env(tmp_path, "Name=gpu File={dev}/nvidia[3,1]\n")
    msg = refusal({**env, "SLURM_STEP_GPUS": "1,2"})
    assert msg.endswith(f"but {tmp_path}/gres.conf gives the node 2 gpu device file(s), none numbered 2")
    env = gres_env(tmp_path, "Name=gpu File={dev}/nvidia[3,7]\n")
    assert "no card this process can see has minor number 7" in refusal({**env, "SLURM_STEP_GPUS": "1"})
    env = gres_env(tmp_path, "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n")
    assert "which gpupin does not read as a card" in refusal({**env, "SLURM_STEP_GPUS": "0"})


def test_where_gres_conf_names_no_gpu_for_this_node_the_number_is_read_as_minor_number(tmp_path: Path) -> None:
    env = gres_env(tmp_path, "NodeName=other Name=gpu File={dev}/nvidia[3,1]\n")
    e = expect({**env, "SLURM_STEP_GPUS": "1"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[1]]
    assert e.detail is not None and e.detail.endswith(
        f"GPU numbers read as minor numbers: {tmp_path}/gres.conf lists no gpu File= for node node3"
    )


def test_autodetect_nvml_without_files_numbers_in_nvml_order(tmp_path: Path) -> None:
    env = gres_env(tmp_path, "AutoDetect=nvml\n")
    e = expect({**env, "SLURM_STEP_GPUS": "0,1"})
    assert [c.uuid for c in e.cards] == [str(BOX[0].uuid), str(BOX[1].uuid)]  # minors 1 and 3
    assert e.detail is not None and e.detail.endswith(
        f"GPU numbers in NVML's order (AutoDetect=nvml in {tmp_path}/gres.conf)"
    )
    assert e.cards[0].note == "the Slurm job, Slurm's GPU 0 = NVML index 0"
    mig = cards("mig")
    assert "is in MIG mode" in refusal({**env, "SLURM_STEP_GPUS": "0"}, mig)


def test_autodetect_nvml_with_files_needs_both_orders_to_agree(tmp_path: Path) -> None:
    # Slurm with NVML sorts the listed files by NVML index; without it (Debian's) keeps the File= order.
    env = gres_env(tmp_path, "AutoDetect=nvml\nName=gpu File=/dev/nvidia[1,3,0,2]\n")  # NVML's order already
    e = expect({**env, "SLURM_STEP_GPUS": "0,2"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[1], BY_MINOR[0]]
    assert e.detail is not None and e.detail.endswith(
        f"the same in NVML's order (AutoDetect=nvml in {tmp_path}/gres.conf)"
    )
    env = gres_env(tmp_path, "AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-3]\n")  # minor order: differs
    msg = refusal({**env, "SLURM_STEP_GPUS": "0"}).replace(
        " (minor number from its name: no such file or directory here)", ""
    )  # no /dev/nvidia* on the test machine
    assert msg == (
        f"the Slurm job was allocated GPU 0 (SLURM_STEP_GPUS=0: /dev/nvidia0 by {tmp_path}/gres.conf), but "
        f"Slurm's GPU 0 is another card depending on how Slurm was built ({tmp_path}/gres.conf: /dev/nvidia0"
        f" = {BY_MINOR[0]}; NVML's order of them (AutoDetect=nvml): /dev/nvidia1 = {BY_MINOR[1]})"
    )

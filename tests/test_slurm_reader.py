"""Slurm's allocation as the expectation (gpupin.entrypoint.slurm), pure: the environments Slurm 22.05 writes
(measured by tests/test_slurm.py), and what a job script or launcher makes of them, over the slurm-shuffled box
(minor numbers neither in PCI nor in FASTEST_FIRST order)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpupin.entrypoint.errors import ExpectationError, MisalignedError
from gpupin.entrypoint.expectation import Expectation
from gpupin.entrypoint.nvml import Card
from gpupin.entrypoint.sources import find
from tests.cards import cards

BOX = cards("slurm-shuffled")  # NVML (PCI) order: 1B minor 1, 3B minor 3, 5E minor 0 (H100), AF minor 2 (4090)
BY_MINOR = {c.minor_number: str(c.uuid) for c in BOX}


def expect(env: dict[str, str], box: list[Card] = BOX) -> Expectation:
    found = find(env, cards=lambda: box)
    assert found.expectation is not None, found.why_unpinned()
    return found.expectation


def refusal(env: dict[str, str], box: list[Card] = BOX) -> str:
    with pytest.raises(MisalignedError) as e:
        find(env, cards=lambda: box)
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
    assert e.detail == f"{var}=1,3 and CUDA_VISIBLE_DEVICES=1,3 (Slurm local rank 0)"
    assert [c.note for c in e.cards] == ["Slurm local rank 0, minor number 1", "Slurm local rank 0, minor number 3"]
    assert [str(c.bus_id) for c in e.cards] == ["00000000:1B:00.0", "00000000:3B:00.0"]


def test_the_step_wins_over_the_job_inside_srun() -> None:
    e = expect({"SLURM_JOB_GPUS": "0,1,2", "SLURM_STEP_GPUS": "2", "CUDA_VISIBLE_DEVICES": "2"})
    assert [c.uuid for c in e.cards] == [BY_MINOR[2]] and e.source == "SLURM_STEP_GPUS"


def test_each_gpus_per_task_task_gets_its_own_card() -> None:
    ranks = [expect({"SLURM_STEP_GPUS": str(m), "CUDA_VISIBLE_DEVICES": str(m), "SLURM_LOCALID": str(r)})
             for r, m in enumerate([0, 1])]
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
    assert e.detail == "SLURM_JOB_GPUS=3,0 and CUDA_VISIBLE_DEVICES unset (the Slurm job)"


def test_a_job_script_that_sets_cuda_visible_devices_outside_the_allocation_is_refused() -> None:
    msg = refusal({"SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": "0", "SLURM_LOCALID": "0"})
    assert msg == (f"Slurm local rank 0 was allocated minor number 2 (SLURM_JOB_GPUS=2), but CUDA_VISIBLE_DEVICES=0 "
                   f"names /dev/nvidia0 ({BY_MINOR[0]} at 00000000:5E:00.0), outside the allocation")


@pytest.mark.parametrize(("cvd", "says"), [
    ("1,7", "names /dev/nvidia7, which is not here, outside the allocation"),
    ("", "hides every card"),
    ("1,1", "names a card twice"),
    (f"1,{BY_MINOR[1]}", "names a card twice"),
    ("bogus", "'bogus' names no card"),
    ("GPU-ffff", "no card's UUID starts with 'GPU-ffff'"),
])
def test_what_no_slurm_wrote_is_refused_naming_rank_minors_and_both_values(cvd: str, says: str) -> None:
    msg = refusal({"SLURM_STEP_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": cvd, "SLURM_LOCALID": "1"})
    assert msg.startswith("Slurm local rank 1 was allocated minor numbers 1, 3 (SLURM_STEP_GPUS=1,3), but "
                          f"CUDA_VISIBLE_DEVICES={cvd}")
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
    found = find({"SLURM_JOB_GPUS": value}, cards=lambda: BOX)
    assert found.expectation is None
    assert f"SLURM_JOB_GPUS={value} names no card" in found.why_unpinned()


@pytest.mark.parametrize("value", ["0,x", "1,1", "-1", "0, 1 2"])
def test_a_malformed_allocation_is_64(value: str) -> None:
    with pytest.raises(ExpectationError) as e:
        find({"SLURM_STEP_GPUS": value}, cards=lambda: BOX)
    assert e.value.exit_code == 64 and "SLURM_STEP_GPUS" in e.value.message


def test_every_earlier_source_wins_over_slurm() -> None:
    env = {"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1"}
    assert expect({**env, "GPUPIN_EXPECT": BY_MINOR[0]}).source == "GPUPIN_EXPECT"
    assert expect({**env, "NVIDIA_VISIBLE_DEVICES": BY_MINOR[0]}).source == "NVIDIA_VISIBLE_DEVICES"


def test_outside_slurm_nothing_slurm_is_imported_or_read() -> None:
    code = ("import sys; from gpupin.entrypoint.sources import find; "
            "f = find({'SLURM_LOCALID': '0', 'SLURM_JOB_ID': '7'}, cards=list); "
            "print(f.expectation, 'gpupin.entrypoint.slurm' in sys.modules, f.why_unpinned())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("None False GPUPIN_EXPECT, NVIDIA_VISIBLE_DEVICES, DOCKER_RESOURCE_*, "
                           "SLURM_STEP_GPUS/SLURM_JOB_GPUS unset")


def test_the_help_lists_slurm_as_a_source() -> None:
    from gpupin.entrypoint.cli import HELP

    sources = HELP.split("comes from, in this order:")[1].split("The workload gets")[0]
    assert [line.split()[0] for line in sources.splitlines() if line[:3].strip()] == [
        "GPUPIN_EXPECT", "NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices", "DOCKER_RESOURCE_*",
        "SLURM_STEP_GPUS"]
    assert "SLURM_JOB_GPUS in a batch script" in sources and "refused (78)" in sources

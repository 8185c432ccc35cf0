"""Alignment: the plan (CUDA_VISIBLE_DEVICES) and the proof (what cuda:k is), over reported cards."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.core.errors import ExpectationError, MisalignedError
from gpupin.core.expectation import Expectation, parse_expect
from gpupin.core.identity import BusId
from gpupin.core.nvml import Card, MigDevice
from gpupin.entrypoint import cudaprobe
from gpupin.entrypoint.align import CudaDevice, check_devices, check_sole, plan, uuid_hex
from gpupin.entrypoint.sources import from_environ
from tests.support.host import FAKEGPU
from tests.support.hypo import examples
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import scenario, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")  # NVML order: 1B, 3B, 86, AF
RTX_PREFIX = RTX[:8]  # unique among the four
A800_PREFIX = A800[:6]  # GPU-6c: A800B's UUID starts so too


def hex_of(uuid: str) -> str:
    h = uuid_hex(uuid)
    assert h is not None
    return h


def dev(k: int, uuid: str, bus: str, name: str = "x") -> CudaDevice:
    return CudaDevice(k, hex_of(uuid), BusId.parse(bus), name)


def test_single_card_in_a_container_is_index_0() -> None:
    cards = [Card(0, RTX, BusId.parse("3b:00.0"), "NVIDIA GeForce RTX 4090")]
    p = plan(parse_expect(f"{RTX}@00000000:3B:00.0"), cards)
    assert p.cuda_visible_devices == "0"
    assert [(b.local_rank, b.uuid, str(b.bus_id)) for b in p.bindings] == [(0, RTX, "00000000:3B:00.0")]


def test_bare_metal_selects_the_expected_cards_by_uuid_in_pci_order() -> None:
    p = plan(parse_expect(f"{A800C},{RTX}"), scenario_cards())
    assert p.cuda_visible_devices == "3,1"
    assert p.extra_cards == 2
    assert [b.uuid for b in p.bindings] == [A800C, RTX]


def test_nvml_listing_order_does_not_matter_only_the_bus_ids() -> None:
    shuffled = list(reversed(scenario_cards()))
    assert plan(parse_expect(f"{RTX},{A800}"), shuffled).cuda_visible_devices == "1,0"


def test_reversed_two_card_expectation_gives_1_0() -> None:
    cards = scenario_cards()[:2]
    p = plan(parse_expect(f"{RTX},{A800}"), cards)
    assert p.cuda_visible_devices == "1,0"


def test_a_unique_prefix_resolves_to_the_full_uuid() -> None:
    p = plan(parse_expect(RTX_PREFIX), scenario_cards())
    assert p.bindings[0].uuid == RTX and p.cuda_visible_devices == "1"


def test_absent_card_is_refused_with_78_naming_what_was_seen() -> None:
    cards = [Card(0, A800B, BusId.parse("86:00.0"), "NVIDIA A800-SXM4-80GB")]
    with pytest.raises(MisalignedError) as e:
        plan(parse_expect(RTX), cards)
    assert e.value.exit_code == 78
    assert RTX in e.value.message and A800B in e.value.message and "cuda:0" in e.value.message
    assert e.value.hint and f"device={RTX}" in e.value.hint


def test_uuid_of_one_card_with_the_bus_of_another_is_refused() -> None:
    with pytest.raises(MisalignedError) as e:
        plan(parse_expect(f"{RTX}@00000000:86:00.0"), scenario_cards())
    assert "00000000:86:00.0" in e.value.message and "00000000:3B:00.0" in e.value.message


def test_two_prefixes_naming_one_card_and_ambiguous_prefixes_are_usage_errors() -> None:
    with pytest.raises(ExpectationError) as e:
        plan(parse_expect(f"{RTX_PREFIX},{RTX}"), scenario_cards())
    assert "same card" in e.value.message
    with pytest.raises(ExpectationError) as e:
        plan(parse_expect(A800_PREFIX), scenario_cards())
    assert A800 in e.value.message and A800B in e.value.message


def test_no_expectation_leaves_cuda_visible_devices_alone() -> None:
    p = plan(None, scenario_cards())
    assert p.cuda_visible_devices is None and p.expectation is None
    assert [b.uuid for b in p.bindings] == [A800, RTX, A800B, A800C]


def test_mig_expectations_use_uuids_in_cuda_visible_devices() -> None:
    parent = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
    mig1 = "MIG-bbbbbbbb-1111-2222-3333-444444444444"
    mig2 = "MIG-cccccccc-1111-2222-3333-444444444444"
    card = Card(0, parent, BusId.parse("07:00.0"), "NVIDIA A100-SXM4-40GB")
    card.mig_devices = [MigDevice(mig1, 1, 0), MigDevice(mig2, 2, 0)]
    other = Card(1, A800, BusId.parse("1b:00.0"), "NVIDIA A800")
    p = plan(parse_expect(f"{mig2},{A800}"), [card, other])
    assert p.cuda_visible_devices == f"{mig2},{A800}"
    legacy = plan(parse_expect(f"MIG-GPU-{parent[4:]}/1/0"), [card])
    assert legacy.bindings[0].uuid == mig1 and legacy.bindings[0].bus_id == BusId.parse("07:00.0")


def test_check_devices_accepts_the_expected_cards_whatever_the_bus_spelling() -> None:
    p = plan(parse_expect(f"{RTX},{A800}"), scenario_cards())
    check_devices(p, [dev(0, RTX, "0000:3B:00.0"), dev(1, A800, "0000:1b:00.0")], scenario_cards(), "cuda", "1,0")


def test_check_devices_refuses_a_swapped_card() -> None:
    p = plan(parse_expect(f"{RTX}@3b:00.0"), scenario_cards())
    with pytest.raises(MisalignedError) as e:
        check_devices(p, [dev(0, A800, "0000:1B:00.0")], scenario_cards(), "the CUDA driver", "1")
    msg = e.value.message
    assert "cuda:0 is " + A800 in msg and RTX in msg and "CUDA_VISIBLE_DEVICES=1" in msg


def test_check_devices_refuses_the_right_uuid_at_the_wrong_bus() -> None:
    p = plan(parse_expect(RTX), scenario_cards())
    with pytest.raises(MisalignedError):
        check_devices(p, [dev(0, RTX, "0000:86:00.0")], scenario_cards(), "cuda", "1")


def test_check_devices_refuses_a_count_mismatch() -> None:
    p = plan(parse_expect(f"{RTX},{A800}"), scenario_cards())
    with pytest.raises(MisalignedError) as e:
        check_devices(p, [dev(0, RTX, "3b:00.0")], scenario_cards(), "the CUDA driver", "1,0")
    assert "sees 1 device(s)" in e.value.message and "asks for 2" in e.value.message


def test_torch_without_uuid_or_pci_fields_compares_what_it_has() -> None:
    p = plan(parse_expect(RTX), scenario_cards())
    check_devices(p, [CudaDevice(0, "", None, "NVIDIA GeForce RTX 4090")], scenario_cards(), "torch", "1")
    with pytest.raises(MisalignedError):
        check_devices(p, [CudaDevice(0, hex_of(A800), None, "A800")], scenario_cards(), "torch", "1")


def test_a_whole_card_beside_a_mig_mode_card_is_named_by_uuid() -> None:
    # CUDA shows the MIG-mode card 0 as its two MIG devices: index 1 would be MIG device 2, not the whole card 1.
    box = scenario_cards("mig")
    p = plan(parse_expect(str(box[1].uuid)), box)
    assert p.cuda_visible_devices == box[1].uuid


def test_a_whole_card_in_mig_mode_is_refused_listing_its_mig_devices() -> None:
    box = scenario_cards("mig")
    with pytest.raises(MisalignedError) as e:
        plan(parse_expect(str(box[0].uuid)), box)
    assert "is in MIG mode" in e.value.message
    assert all(m.uuid in e.value.message for m in box[0].mig_devices)


def test_uuid_hex_never_gives_an_empty_string() -> None:
    assert uuid_hex(RTX) == RTX[4:].replace("-", "")
    assert uuid_hex(f"MIG-{RTX}/1/0") is None  # its digits are the parent's
    assert uuid_hex("GPU-") is None and uuid_hex(RTX_PREFIX) == RTX_PREFIX[4:]


@st.composite
def box_and_request(draw: st.DrawFn) -> tuple[str, list[Card], list[tuple[Card, MigDevice | None]]]:
    """A shipped box and an ordered pick of what CUDA can run on there: whole cards not in MIG mode, MIG devices."""
    name = draw(st.sampled_from(["mixed-4", "dgx-8", "mig", "mig-shared-prefix"]))
    box = scenario_cards(name)
    usable: list[tuple[Card, MigDevice | None]] = [(c, None) for c in box if not c.mig_mode]
    usable += [(c, m) for c in box for m in c.mig_devices]
    picked = draw(st.lists(st.sampled_from(usable), min_size=1, max_size=4, unique_by=lambda t: id(t[1] or t[0])))
    return name, box, picked


@settings(max_examples=examples(60), deadline=None)
@given(box_and_request(), st.booleans())
def test_the_plan_puts_expectation_k_at_cuda_k_as_the_cuda_driver_enumerates(
    fakegpu: Path, request: tuple[str, list[Card], list[tuple[Card, MigDevice | None]]], with_bus: bool
) -> None:
    # The model property: whatever the box and the pick, the CUDA driver (the fake, which keeps CUDA's rules:
    # tests/fakegpu/cuda.c) reports binding k at cuda:k under the plan's CUDA_VISIBLE_DEVICES.
    name, box, picked = request
    entries = [(m.uuid if m else str(c.uuid)) + (f"@{c.bus_id}" if with_bus else "") for c, m in picked]
    p = plan(parse_expect(",".join(entries)), box)
    assert p.cuda_visible_devices is not None
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(FAKEGPU / "lib"),
        "FAKEGPU_TOPOLOGY": str(scenario(name)),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": p.cuda_visible_devices,
    }
    out = subprocess.run(
        [sys.executable, *cudaprobe.CHILD_ARGS], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    found = [CudaDevice.from_probe(d) for d in cudaprobe.from_lines(out)["devices"]]
    assert [(d.uuid_hex, d.bus_id) for d in found] == [(uuid_hex(b.uuid), b.bus_id) for b in p.bindings]
    check_devices(p, found, box, "the CUDA driver", p.cuda_visible_devices)


# --- a source whose cards are all the runtime was meant to expose (Swarm's reservation) -----------------------


def swarm_expectation(value: str, key: str = "DOCKER_RESOURCE_GPU") -> Expectation:
    found = from_environ({key: value, "NVIDIA_VISIBLE_DEVICES": "all"})
    assert found is not None and found.sole is not None
    return found


def test_a_swarm_task_that_sees_only_what_it_reserved_passes() -> None:
    only = [c for c in scenario_cards() if c.uuid == RTX]
    p = plan(swarm_expectation(RTX), only)
    check_sole(p, only)  # no error
    box = scenario_cards("mig")
    parent = next(c for c in box if c.mig_mode)
    mine = parent.mig_devices[0]
    alone = copy.deepcopy(parent)
    alone.mig_devices = [m for m in alone.mig_devices if m.uuid == mine.uuid]  # what the runtime exposes
    check_sole(plan(swarm_expectation(mine.uuid), [alone]), [alone])


@pytest.mark.parametrize("key", ["DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_NVIDIA-GPU"])
def test_a_swarm_task_that_sees_more_cards_than_it_reserved_is_refused(key: str) -> None:
    exp = swarm_expectation(A800C, key)
    p = plan(exp, scenario_cards())  # the plan alone would select A800C among the four
    with pytest.raises(MisalignedError) as info:
        check_sole(p, scenario_cards())
    err = info.value
    assert err.exit_code == 78
    assert err.message == (
        f"{key} reserves {A800C} for this task, but it also sees 3 device(s) it did not reserve "
        f"({A800}, {RTX}, {A800B}), which the scheduler gives to other tasks"
    )
    assert err.hint is not None
    assert (
        f"the node advertises {key.removeprefix('DOCKER_RESOURCE_')} resources, but its runtime's "
        f"swarm-resource does not name {key}, so it fell back to NVIDIA_VISIBLE_DEVICES "
        "(NVIDIA_VISIBLE_DEVICES='all' here)" in err.hint
    )
    assert "`hostagent swarm node-config --check` on that node" in err.hint
    assert f'swarm-resource = "{key}"' in err.hint


def test_a_swarm_task_given_one_mig_device_that_sees_its_siblings_is_refused() -> None:
    """The trap on a MIG box: the parent card is one NVML device either way; its other MIG devices give it away."""
    box = scenario_cards("mig")
    parent = next(c for c in box if c.mig_mode)
    mine, other = parent.mig_devices[0].uuid, parent.mig_devices[1].uuid
    with_parent_only = [copy.deepcopy(parent)]
    with pytest.raises(MisalignedError, match=f"it also sees 1 device\\(s\\) it did not reserve \\({other}\\)"):
        check_sole(plan(swarm_expectation(mine), with_parent_only), with_parent_only)
    whole = next(c for c in box if not c.mig_mode)
    with pytest.raises(MisalignedError, match=f"2 device\\(s\\) it did not reserve \\({other}, {whole.uuid}\\)"):
        check_sole(plan(swarm_expectation(mine), box), box)


def test_other_sources_let_cuda_visible_devices_select() -> None:
    """GPUPIN_EXPECT (bare metal, `--gpus all`), NVIDIA_VISIBLE_DEVICES and Slurm keep extra cards as a note."""
    for env in ({"GPUPIN_EXPECT": A800C, "DOCKER_RESOURCE_GPU": A800C}, {"NVIDIA_VISIBLE_DEVICES": A800C}):
        exp = from_environ(env)
        assert exp is not None and exp.sole is None
        check_sole(plan(exp, scenario_cards()), scenario_cards())

"""GPUPIN_EXPECT parsing and the expectation sources, in DESIGN.md's order."""

from __future__ import annotations

import pytest

from gpupin.entrypoint.errors import ExpectationError
from gpupin.entrypoint.expectation import ExpectedCard, format_expect, parse_expect
from gpupin.entrypoint.identity import BusId
from gpupin.entrypoint.sources import find, from_environ

U1 = "GPU-b7f5fec9-b46a-cafb-c72e-03faa22cc009"
U2 = "GPU-bd66e15d-bea0-a04a-ba15-aa76757c09e1"


def test_parse_in_local_rank_order_with_and_without_bus() -> None:
    e = parse_expect(f"{U2}@0000:00:06.0, {U1.upper().replace('GPU-', 'GPU-')}")
    assert [c.uuid for c in e.cards] == [U2, U1]
    assert e.cards[0].bus_id == BusId(0, 0, 6) and e.cards[1].bus_id is None
    assert e.source == "GPUPIN_EXPECT"
    assert str(e) == f"{U2}@00000000:00:06.0,{U1}"


def test_format_round_trips() -> None:
    cards = [ExpectedCard(U1, BusId.parse("3b:00.0")), ExpectedCard(U2)]
    assert parse_expect(format_expect(cards)).cards == tuple(cards)


def test_a_hand_written_prefix_is_kept_for_resolution() -> None:
    assert parse_expect("gpu-B7F5").cards[0].uuid == "GPU-b7f5"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "set but empty"),
        ("   ", "set but empty"),
        (f"{U1},", "entry 1 is empty"),
        (f"{U1},,{U2}", "entry 1 is empty"),
        ("0", "is not a GPU UUID"),
        ("all", "is not a GPU UUID"),
        ("GPU-", "is not a GPU UUID"),
        (f"{U1}@zz:00.0", "is not a PCI bus id"),
        (f"{U1}@", "is not a PCI bus id"),
        (f"{U1},{U1.upper()}", "listed twice"),
    ],
)
def test_malformed_values_are_refused_with_64(value: str, says: str) -> None:
    with pytest.raises(ExpectationError) as e:
        parse_expect(value)
    assert says in e.value.message
    assert e.value.exit_code == 64
    assert e.value.hint and "UUID[@BUSID]" in e.value.hint


def test_sources_in_order() -> None:
    both = {"GPUPIN_EXPECT": U1, "NVIDIA_VISIBLE_DEVICES": U2, "DOCKER_RESOURCE_GPU": U2}
    e = from_environ(both)
    assert e is not None and e.source == "GPUPIN_EXPECT" and e.cards[0].uuid == U1
    e = from_environ({"NVIDIA_VISIBLE_DEVICES": f"{U2},{U1}", "DOCKER_RESOURCE_GPU": U1})
    assert e is not None and e.source == "NVIDIA_VISIBLE_DEVICES" and [c.uuid for c in e.cards] == [U2, U1]
    e = from_environ({"NVIDIA_VISIBLE_DEVICES": "all", "DOCKER_RESOURCE_GPU": "GPU-b7f5fec9"})
    assert e is not None and e.source == "DOCKER_RESOURCE_GPU" and e.cards[0].uuid == "GPU-b7f5fec9"
    e = from_environ({"DOCKER_RESOURCE_FPGA": "fpga0", "DOCKER_RESOURCE_NVIDIA-GPU": U2})
    assert e is not None and e.source == "DOCKER_RESOURCE_NVIDIA-GPU"


@pytest.mark.parametrize("nvd", ["all", "none", "void", "", "0", "0,1", f"{U1},1", "GPU-b7f5"])
def test_nvidia_visible_devices_without_full_uuids_names_no_card(nvd: str) -> None:
    assert from_environ({"NVIDIA_VISIBLE_DEVICES": nvd}) is None


def test_set_but_malformed_expect_is_never_a_silent_fallback() -> None:
    with pytest.raises(ExpectationError):
        from_environ({"GPUPIN_EXPECT": "", "NVIDIA_VISIBLE_DEVICES": U1})


def test_the_unpinned_line_says_why_each_source_named_no_card() -> None:
    found = find({"NVIDIA_VISIBLE_DEVICES": "void", "DOCKER_RESOURCE_FPGA": "fpga0"}, cards=list)
    assert found.expectation is None
    assert found.why_unpinned() == ("NVIDIA_VISIBLE_DEVICES=void names no card (CDI or no GPU request); "
                                    "DOCKER_RESOURCE_FPGA name(s) no GPU UUID; GPUPIN_EXPECT unset")
    assert find({}, cards=list).why_unpinned() == "GPUPIN_EXPECT, NVIDIA_VISIBLE_DEVICES, DOCKER_RESOURCE_* unset"


def test_a_runtime_variable_listing_a_card_twice_gets_a_hint_about_that_variable() -> None:
    with pytest.raises(ExpectationError) as e:
        from_environ({"NVIDIA_VISIBLE_DEVICES": f"{U1},{U1}"})
    assert "listed twice" in e.value.message and e.value.hint is not None
    assert "NVIDIA_VISIBLE_DEVICES should list GPU UUIDs, each card once" in e.value.hint
    assert "GPUPIN_EXPECT=" not in e.value.hint  # the user did not write GPUPIN_EXPECT: no recipe for it

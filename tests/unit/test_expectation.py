"""GPUPIN_EXPECT parsing and the expectation sources, in the order of docs/design.md, "Expectation sources"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.core.errors import ExpectationError
from gpupin.core.expectation import ExpectedCard, format_expect, parse_expect
from gpupin.core.identity import BusId
from gpupin.entrypoint.sources import find, from_environ
from tests.support.hypo import examples
from tests.support.scenarios import cards as scenario_cards
from tests.support.scenarios import uuids

U1 = "GPU-b7f5fec9-b46a-cafb-c72e-03faa22cc009"
U2 = "GPU-bd66e15d-bea0-a04a-ba15-aa76757c09e1"


def test_parse_in_local_rank_order_with_and_without_bus() -> None:
    e = parse_expect(f"{U2}@0000:00:06.0, {U1.upper().replace('GPU-', 'gpu-')}")  # any case, NVML's spelling out
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


@pytest.mark.parametrize("nvd", ["all", "none", "void", "", f"{U1},1", "GPU-b7f5", "/some/path", "0,0", "x"])
def test_nvidia_visible_devices_without_cards_it_can_name_names_no_card(nvd: str) -> None:
    assert find({"NVIDIA_VISIBLE_DEVICES": nvd}, cards=lambda: scenario_cards("mixed-4")).expectation is None


MIXED = scenario_cards("mixed-4")  # NVML order: A800 1B, RTX 3B, A800 86, A800 AF
A800, RTX, A800B, A800C = uuids("mixed-4")


def expected(value: str, cards: list[Any], **env: str) -> tuple[list[str], str | None]:
    e = find({"NVIDIA_VISIBLE_DEVICES": value, **env}, cards=lambda: cards).expectation
    assert e is not None and e.source == "NVIDIA_VISIBLE_DEVICES"
    return [str(c) for c in e.cards], e.detail


def at(card: Any, mig: Any = None) -> str:
    return f"{mig.uuid if mig else card.uuid}@{card.bus_id}"


def test_indices_where_every_card_is_seen_are_nvmls_numbers() -> None:
    cards, detail = expected("3,1", MIXED)
    assert cards == [at(MIXED[3]), at(MIXED[1])]  # in the order listed: the local-rank order
    assert detail == "NVIDIA_VISIBLE_DEVICES=3,1 (indices as NVML numbers this host's cards)"


def test_indices_in_a_container_given_just_those_cards_are_the_runtimes_renumbering() -> None:
    """`--gpus device=3,1` (or the device plugin's index strategy): the container sees two cards, numbered 0 and 1
    in bus order, so 1 is the first of them and 3 the second."""
    given = [MIXED[1], MIXED[3]]
    cards, detail = expected("3,1", given)
    assert cards == [at(MIXED[3]), at(MIXED[1])]
    assert detail is not None and "renumbered by the runtime: the 2 device(s) it exposed" in detail
    assert expected("2", [MIXED[2]])[0] == [at(MIXED[2])]


def test_mig_pairs_are_read_like_indices() -> None:
    mig = scenario_cards("mig")  # A100 at 07 in MIG mode (MIG devices 0 and 1), A100 at 0F
    a100, whole = mig
    assert expected("0:1", mig)[0] == [at(a100, a100.mig_devices[1])]  # every device seen: NVML's numbers
    only = [a100]  # a container given MIG device 0:1 sees its parent with that MIG device alone
    only[0] = type(a100)(a100.index, a100.uuid, a100.bus_id, a100.name)
    only[0].mig_mode, only[0].mig_devices = True, [a100.mig_devices[1]]
    assert expected("0:1", only)[0] == [at(a100, a100.mig_devices[1])]
    assert expected("1,0:0", mig)[0] == [at(whole), at(a100, a100.mig_devices[0])]
    why = find({"NVIDIA_VISIBLE_DEVICES": "0"}, cards=lambda: only).why_unpinned()
    assert "names a whole card where this container sees a MIG device" in why


def test_an_index_is_only_a_fallback_a_source_naming_cards_wins() -> None:
    """An index orders what the runtime was told to give; a later source that names cards decides (and, for
    Slurm, proves the runtime gave them: tests/cluster/test_slurm.py passes Slurm's numbers as --gpus device=0,1)."""
    e = find({"NVIDIA_VISIBLE_DEVICES": "0", "DOCKER_RESOURCE_GPU": A800C}, cards=lambda: MIXED).expectation
    assert e is not None and e.source == "DOCKER_RESOURCE_GPU" and [c.uuid for c in e.cards] == [A800C]
    e = find({"NVIDIA_VISIBLE_DEVICES": "0", "DOCKER_RESOURCE_FPGA": "x"}, cards=lambda: MIXED).expectation
    assert e is not None and e.source == "NVIDIA_VISIBLE_DEVICES" and [c.uuid for c in e.cards] == [A800]


def test_indices_that_cannot_be_known_say_why() -> None:
    found = find({"NVIDIA_VISIBLE_DEVICES": "2,3"}, cards=lambda: MIXED[:3])
    assert (
        found.expectation is None
        and "names devices by host index, which the 3 device(s) NVML sees here cannot resolve" in found.why_unpinned()
    )


def test_the_device_plugins_volume_mounts_folder(tmp_path: Path) -> None:
    """NVIDIA/k8s-device-plugin's volume-mounts strategy: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices
    and /dev/null mounted at that folder + "/" + each device id (a UUID, or an index); IMEX channels in imex/."""
    folder = tmp_path / "nvidia-container-devices"
    folder.mkdir()
    env = {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices", "GPUPIN_DEVICE_LIST_DIR": str(folder)}
    found = find(env, cards=lambda: MIXED)
    assert (
        found.expectation is None
        and f"{folder} (the device plugin's volume-mounts list) names no device" in found.why_unpinned()
        and "NVIDIA_VISIBLE_DEVICES," not in found.why_unpinned()
    )
    for name in (A800C, RTX):
        (folder / name).touch()
    (folder / "imex").mkdir()
    (folder / "imex" / "0").touch()
    e = find(env, cards=lambda: MIXED).expectation
    assert e is not None and e.source == str(folder)
    assert [c.uuid for c in e.cards] == [RTX, A800C]  # no order in a folder: NVML's
    for p in folder.iterdir():
        if p.is_file():
            p.unlink()
    (folder / "1").touch()
    (folder / "3").touch()
    e = find(env, cards=lambda: [MIXED[1], MIXED[3]]).expectation
    assert e is not None and [c.uuid for c in e.cards] == [RTX, A800C]
    missing = {**env, "GPUPIN_DEVICE_LIST_DIR": str(tmp_path / "none")}
    assert "which cannot be read (No such file or directory)" in find(missing, cards=lambda: MIXED).why_unpinned()
    # A folder but no variable naming it (never the plugin's way, still a deliberate mount): read all the same.
    e = find({"GPUPIN_DEVICE_LIST_DIR": str(folder)}, cards=lambda: [MIXED[1], MIXED[3]]).expectation
    assert e is not None and e.source == str(folder)
    assert find({"GPUPIN_DEVICE_LIST_DIR": str(tmp_path / "none")}, cards=lambda: MIXED).why_unpinned() == (
        "GPUPIN_EXPECT, NVIDIA_VISIBLE_DEVICES, DOCKER_RESOURCE_*, SLURM_STEP_GPUS/SLURM_JOB_GPUS unset"
    )


def test_set_but_malformed_expect_is_never_a_silent_fallback() -> None:
    with pytest.raises(ExpectationError):
        from_environ({"GPUPIN_EXPECT": "", "NVIDIA_VISIBLE_DEVICES": U1})


def test_the_unpinned_line_says_why_each_source_named_no_card() -> None:
    found = find({"NVIDIA_VISIBLE_DEVICES": "void", "DOCKER_RESOURCE_FPGA": "fpga0"}, cards=list)
    assert found.expectation is None
    assert found.why_unpinned() == (
        "NVIDIA_VISIBLE_DEVICES=void: the cards came through CDI, which names none "
        "inside the container; DOCKER_RESOURCE_FPGA name(s) no GPU UUID; GPUPIN_EXPECT, "
        "SLURM_STEP_GPUS/SLURM_JOB_GPUS unset"
    )
    assert find({}, cards=list).why_unpinned() == (
        "GPUPIN_EXPECT, NVIDIA_VISIBLE_DEVICES, DOCKER_RESOURCE_*, SLURM_STEP_GPUS/SLURM_JOB_GPUS unset"
    )


def test_a_runtime_variable_listing_a_card_twice_gets_a_hint_about_that_variable() -> None:
    with pytest.raises(ExpectationError) as e:
        from_environ({"NVIDIA_VISIBLE_DEVICES": f"{U1},{U1}"})
    assert "listed twice" in e.value.message and e.value.hint is not None
    assert "NVIDIA_VISIBLE_DEVICES should list GPU UUIDs, each card once" in e.value.hint
    assert "GPUPIN_EXPECT=" not in e.value.hint  # the user did not write GPUPIN_EXPECT: no recipe for it


HEX = "0123456789abcdef"
uuid_bodies = st.text(HEX, min_size=32, max_size=32).map(lambda h: f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
bus_ids = st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F)).map(lambda t: BusId(*t))


@st.composite
def written_cards(draw: st.DrawFn) -> tuple[str, ExpectedCard]:
    """One GPUPIN_EXPECT entry as a person or a tool may write it, and the card it means."""
    body = draw(uuid_bodies)
    tag = draw(st.sampled_from(["GPU", "MIG"]))
    text = draw(st.sampled_from([f"{tag}-{body}", f"{tag}-{body}".upper(), f"{tag.lower()}-{body}"]))
    bus = draw(st.none() | bus_ids)
    if bus is not None:
        text += "@" + draw(
            st.sampled_from(
                [str(bus), f"{bus.domain:04x}:{bus.bus:02x}:{bus.device:02x}.0", f"{bus.bus:02X}:{bus.device:02X}.0"]
                if bus.domain == 0
                else [str(bus)]
            )
        )
    pad = draw(st.sampled_from(["", " ", "\t"]))
    return pad + text + pad, ExpectedCard(f"{tag}-{body}", bus)


@settings(max_examples=examples(300))
@given(st.lists(written_cards(), min_size=1, max_size=6, unique_by=lambda wc: wc[1].uuid))
def test_any_spelling_parses_to_nvmls_spelling_in_rank_order_and_round_trips(
    entries: list[tuple[str, ExpectedCard]],
) -> None:
    e = parse_expect(",".join(text for text, _ in entries))
    assert e.cards == tuple(card for _, card in entries)
    assert parse_expect(format_expect(e.cards)).cards == e.cards


@settings(max_examples=examples(500))
@given(st.text(max_size=80) | st.binary(max_size=80).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_any_text_is_an_expectation_or_one_line_64(value: str) -> None:
    try:
        e = parse_expect(value)
    except ExpectationError as err:
        assert err.exit_code == 64
        line = err.line("gpupin-entrypoint")
        assert line.count("\n") == 1 and line.endswith("\n") and len(line) < 1200, line
        return
    assert e.cards and all(c.uuid[:4] in ("GPU-", "MIG-") for c in e.cards)

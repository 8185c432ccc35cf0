"""GPU spec resolution, the one rule every side uses (gpupin.core.resolve), on the shipped scenarios."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.core.errors import GpuSpecError
from gpupin.core.resolve import BUS_ID, INDEX, MIG_LEGACY, MIG_PAIR, UUID, by_minor, form, resolve, resolve_all
from tests.support.hypo import examples
from tests.support.scenarios import cards, topology

MIXED4 = cards("mixed-4")
MIG = cards("mig")
A800, RTX, A800B, A800C = (str(c.uuid) for c in MIXED4)
MIG_PARENT = str(MIG[0].uuid)
MIG1, MIG2 = (m.uuid for m in MIG[0].mig_devices)


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        (RTX, UUID),
        ("gpu-95C6", UUID),
        (MIG1, UUID),
        ("MIG-2236", UUID),
        (f"MIG-GPU-{MIG_PARENT[4:]}/2/0", MIG_LEGACY),
        ("0:1", MIG_PAIR),
        ("12:00", MIG_PAIR),
        ("3b:00.0", BUS_ID),
        ("0000:3B:00.0", BUS_ID),
        ("00000000:3b:00.0", BUS_ID),
        ("3b:00", BUS_ID),
        ("0", INDEX),
        (" 12 ", INDEX),
        ("²", None),
        ("\u0661", None),
        ("fastest", None),
        ("", None),
        ("GPU-", None),
        ("GPU-xyz", None),
    ],
)
def test_form(spec: str, kind: str | None) -> None:
    assert form(spec) == kind


@pytest.mark.parametrize(
    "spec", [RTX, RTX.upper(), "GPU-95c6", "gpu-95C6A", "1", "3b:00.0", "0000:3B:00.0", "00000000:3b:00.0", " 1 "]
)
def test_every_form_of_one_card(spec: str) -> None:
    t = resolve(spec, MIXED4)
    assert (t.uuid, str(t.bus_id), t.mig) == (RTX, "00000000:3B:00.0", None)


def test_mig_devices_by_uuid_prefix_old_form_and_index_pair() -> None:
    for spec in (MIG2, MIG2[:12], f"MIG-GPU-{MIG_PARENT[4:]}/2/0", f"mig-gpu-{MIG_PARENT[4:].upper()}/2/0", "0:1"):
        t = resolve(spec, MIG)
        assert (t.uuid, t.card.uuid, t.expect_entry()) == (MIG2, MIG_PARENT, f"{MIG2}@00000000:07:00.0"), spec


def test_the_mig_index_pair_is_not_a_bus_id() -> None:
    # `0:1` once read as the bus id 00:01.0; on the mig box it is card 0's MIG device 1.
    assert resolve("0:1", MIG).uuid == MIG2
    with pytest.raises(GpuSpecError) as e:
        resolve("1:0", MIG)
    assert "MIG device 0 of card 1" in e.value.message and "not in MIG mode" in e.value.message
    with pytest.raises(GpuSpecError) as e:
        resolve("0:7", MIG)
    assert "has 2 MIG device(s)" in e.value.message


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("²", "is not a GPU UUID, index, bus id or MIG device"),  # never taken as index 2
        ("\u0661", "is not a GPU UUID, index, bus id or MIG device"),  # never taken as index 1
        ("4", "GPU index 4 is out of range: this host has 4 card(s) (0 = "),
        ("GPU-6c", "ambiguous: it matches GPU-6c39be0e"),
        ("GPU-ffff", "no card's UUID starts with 'GPU-ffff'"),
        ("5e:00.0", "no card at bus id 00000000:5E:00.0"),
        ("zz:00.0", "malformed PCI bus id"),
        ("GPU-", "is not a GPU UUID or a prefix of one"),
        ("MIG-2236", "no card here has MIG devices"),
        ("", "an empty GPU spec"),
    ],
)
def test_what_names_no_card_says_why(spec: str, says: str) -> None:
    with pytest.raises(GpuSpecError) as e:
        resolve(spec, MIXED4)
    assert says in e.value.message and e.value.exit_code == 64 and e.value.hint


def test_an_ambiguous_mig_prefix_is_refused_like_any_other() -> None:
    # The entrypoint once took the first MIG device that matched; hostagent refused. Now both refuse.
    box = cards("mig")
    twin = box[0].mig_devices[1]
    twin.uuid = MIG1[:9] + "ffff" + MIG1[13:]
    with pytest.raises(GpuSpecError) as e:
        resolve(MIG1[:9], box)
    assert "ambiguous" in e.value.message and MIG1 in e.value.message and twin.uuid in e.value.message
    assert resolve(MIG1[:10], box).uuid == MIG1


def test_the_old_mig_form_must_name_an_existing_instance() -> None:
    with pytest.raises(GpuSpecError) as e:
        resolve(f"MIG-GPU-{MIG_PARENT[4:]}/9/0", MIG)
    assert "no MIG device with GPU instance 9 and compute instance 0 (it has: 1/0, 2/0)" in e.value.message
    with pytest.raises(GpuSpecError) as e:
        resolve(f"MIG-GPU-{A800[4:]}/1/0", MIG)
    assert "no card with UUID" in e.value.message


def test_a_card_named_twice_in_two_forms() -> None:
    with pytest.raises(GpuSpecError) as e:
        resolve_all(["1", "GPU-95c6"], MIXED4)
    assert "names GPU-95c6a38a" in e.value.message and "already asked for" in e.value.message
    assert [t.uuid for t in resolve_all(["3", "0"], MIXED4)] == [A800C, A800]


def test_minor_numbers_follow_the_device_files_not_nvml_order() -> None:
    raw = topology("mixed-4")["gpus"]
    for position, g in enumerate(raw):
        assert by_minor(position, MIXED4).uuid == g["uuid"]
    with pytest.raises(GpuSpecError) as e:
        by_minor(9, MIXED4)
    assert "/dev/nvidia9" in e.value.message


@settings(max_examples=examples(400), deadline=None)
@given(st.text(max_size=60))
def test_any_text_names_a_card_or_says_why(spec: str) -> None:
    try:
        t = resolve(spec, MIXED4 + MIG)
    except GpuSpecError as err:
        assert err.exit_code == 64 and err.message and "\n" not in err.message
    else:
        assert t.uuid.startswith(("GPU-", "MIG-"))


@settings(max_examples=examples(300), deadline=None)
@given(
    st.from_regex(
        r"(GPU|MIG|gpu|mig|MIG-GPU)-[0-9a-fA-F-]{0,40}(/[0-9]{1,3}/[0-9]{1,3})?|[0-9]{1,3}:[0-9]{1,3}"
        r"|[0-9a-fA-F]{1,9}:[0-9a-fA-F]{1,3}(:[0-9a-fA-F]{1,3})?(\.[0-9a-fA-F]{1,2})?",
        fullmatch=True,
    )
)
def test_spec_shaped_text_names_a_card_or_says_why(spec: str) -> None:
    try:
        resolve(spec, MIXED4 + MIG)
    except GpuSpecError as err:
        assert err.exit_code == 64 and "\n" not in err.message

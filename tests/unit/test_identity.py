"""The GPU-identity core: UUIDs, prefixes and PCI bus ids, without hardware."""

from __future__ import annotations

import pytest

from gpupin.core.errors import GpuSpecError, UsageError
from gpupin.core.identity import (
    BusId,
    is_full_uuid,
    is_uuid_like,
    looks_like_bus_id,
    match_uuid,
    mig_legacy_parts,
    normalize_uuid,
    uuid_from_bytes,
    uuid_from_torch,
)

U1 = "GPU-b7f5fec9-b46a-cafb-c72e-03faa22cc009"
U2 = "GPU-bd66e15d-bea0-a04a-ba15-aa76757c09e1"
U3 = "GPU-1c5e8f3a-4b2d-4f0e-9a7c-2d3e4f5a6b7c"


@pytest.mark.parametrize("text", ["3b:00.0", "0000:3B:00.0", "00000000:3b:00.0", "3B:00", " 0000:3b:00.0 "])
def test_bus_id_forms_parse_to_the_same_integers(text: str) -> None:
    b = BusId.parse(text)
    assert b.key() == (0, 0x3B, 0, 0)
    assert str(b) == "00000000:3B:00.0"
    assert b == BusId.parse("00000000:3B:00.0")


def test_bus_id_keeps_domain_and_function() -> None:
    b = BusId.parse("0001:af:1f.7")
    assert b.key() == (1, 0xAF, 0x1F, 7)
    assert str(b) == "00000001:AF:1F.7"
    assert BusId.parse("00000000:1B:00.0") < BusId.parse("0000:3b:00.0") < BusId.parse("0001:00:00.0")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3b",
        "zz:00.0",
        "3b:00.0.1",
        "123:00.0",
        "0000:3b:00:0",
        "3b:00.12",
        "3b:40.0",
        "3b:-1.0",
        "GPU-1234",
        "000000000:3b:00.0",
        "3b:00.8",
    ],
)
def test_malformed_bus_ids_are_refused(text: str) -> None:
    with pytest.raises(UsageError) as e:
        BusId.parse(text)
    assert "PCI bus id" in e.value.message and e.value.exit_code == 64


def test_looks_like_bus_id() -> None:
    assert looks_like_bus_id("3b:00.0") and looks_like_bus_id("0000:3B:00.0")
    assert not looks_like_bus_id(U1) and not looks_like_bus_id("2")


def test_normalize_uuid_spells_uuids_as_nvml_does() -> None:
    assert normalize_uuid(U1.upper().replace("GPU-", "gpu-")) == U1
    assert normalize_uuid("MIG-" + U1[4:].upper()) == "MIG-" + U1[4:]
    assert normalize_uuid(f"MIG-GPU-{U1[4:]}/3/0") == f"MIG-GPU-{U1[4:]}/3/0"
    assert mig_legacy_parts(f"MIG-GPU-{U1[4:]}/3/0") == (U1, 3, 0)
    assert mig_legacy_parts(U1) is None
    for bad in ["GPU-123", U1 + "0", U1[:-1] + "g", "b7f5fec9-b46a-cafb-c72e-03faa22cc009x", "1"]:
        with pytest.raises(UsageError):
            normalize_uuid(bad)


def test_uuid_shapes() -> None:
    assert is_full_uuid(U1) and not is_full_uuid(U1[:10])
    assert is_uuid_like(U1[:10]) and is_uuid_like("MIG-GPU-3f") and is_uuid_like("gpu-b7")
    assert not is_uuid_like("GPU-") and not is_uuid_like("GPU--") and not is_uuid_like("2")
    assert not is_uuid_like("3b:00.0") and not is_uuid_like("GPU-xyz")


def test_uuid_from_cuda_bytes_and_torch() -> None:
    raw = bytes.fromhex(U1[4:].replace("-", ""))
    assert uuid_from_bytes(raw) == U1
    assert uuid_from_bytes(raw, "MIG") == "MIG-" + U1[4:]
    assert uuid_from_torch(U1[4:]) == U1
    assert uuid_from_torch(U1) == U1


def test_match_uuid_full_prefix_and_case() -> None:
    cards = [U1, U2, U3]
    assert match_uuid(U2, cards) == U2
    assert match_uuid(U2.upper().replace("GPU-", "gpu-"), cards) == U2  # tag and hex in another case
    assert match_uuid("GPU-b7f5", cards) == U1
    assert match_uuid("GPU-1C5E", cards) == U3


def test_ambiguous_prefix_lists_every_match() -> None:
    with pytest.raises(GpuSpecError) as e:
        match_uuid("GPU-b", [U1, U2, U3])
    assert e.value.matches == (U1, U2)
    assert U1 in e.value.message and U2 in e.value.message and "ambiguous" in e.value.message
    assert e.value.exit_code == 64


@pytest.mark.parametrize("spec", ["GPU-9", "GPU-", "banana", "GPU-b7f5fec9-b46a-cafb-c72e-03faa22cc00a"])
def test_unmatched_or_meaningless_specs_are_refused(spec: str) -> None:
    with pytest.raises(GpuSpecError) as e:
        match_uuid(spec, [U1, U2])
    assert e.value.matches == ()


def test_a_prefix_longer_than_a_whole_uuid_names_nothing() -> None:
    assert is_uuid_like(U1) and is_uuid_like(U1[:12])
    assert not is_uuid_like(U1 + "0") and not is_uuid_like("GPU-" + "a" * 37)
    with pytest.raises(GpuSpecError) as e:
        match_uuid("GPU-" + "b" * 100_000, [U1, U2])
    assert len(e.value.message) < 300 and "100004 characters" in e.value.message

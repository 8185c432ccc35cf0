"""Sizes as `docker run` reads them (hostagent.run.values): go-units' RAMInBytes, as both engines' CLIs vendor it.

The rules, from go-units' documentation and source (size.go, v0.4): a decimal number (digits, optionally `.digits`),
one optional space, then optionally a unit k, m, g, t or p, an optional `i` and an optional `b`, in any case; the
unit is binary whatever the spelling; the value is a float64 truncated to whole bytes. The fixed cases below were
seen with Docker 20.10's and Engine 26's own CLIs (`docker create --shm-size X`, then inspect), which agree.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupin.hostagent.run.values import ram_in_bytes

KIB = 1024


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16GiB", 16 * KIB**3),
        ("8 g", 8 * KIB**3),
        ("16gb", 16 * KIB**3),
        ("16GB", 16 * KIB**3),
        ("1.5g", 1536 * KIB**2),
        ("100b", 100),
        ("16KIB", 16 * KIB),
        ("16kib", 16 * KIB),
        ("16iB", 16),
        ("16 ", 16),
        ("1Pb", KIB**5),
        ("1TIB", KIB**4),
        ("1073741824", KIB**3),
        ("0", 0),
        ("2048k", 2 * KIB**2),
    ],
)
def test_what_the_docker_cli_takes(text: str, size: int) -> None:
    assert ram_in_bytes(text) == size


@pytest.mark.parametrize(
    "text",
    [
        "1e3",
        "16x",
        "-1",
        "0x10",
        ".5g",
        "1.",
        "1.5.5g",
        " 16",
        "1_000",
        "8  g",
        "+5",
        "16GBS",
        "",
        "g",
        "16\n",
        "\uff11\uff16g",
        "16 gb ",
    ],
)
def test_what_the_docker_cli_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        ram_in_bytes(text)


def test_more_than_an_int64_is_refused() -> None:
    with pytest.raises(ValueError, match="int64"):
        ram_in_bytes("8192p")


UNITS = {"": 1, "k": KIB, "m": KIB**2, "g": KIB**3, "t": KIB**4, "p": KIB**5}


@given(
    whole=st.integers(0, 4000),
    frac=st.one_of(st.none(), st.text("0123456789", min_size=1, max_size=6)),
    space=st.booleans(),
    unit=st.sampled_from(sorted(UNITS)),
    i=st.booleans(),
    b=st.booleans(),
    upper=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_every_spelling_of_a_size_is_binary_and_truncated(
    whole: int, frac: str | None, space: bool, unit: str, i: bool, b: bool, upper: list[bool]
) -> None:
    number = str(whole) + (f".{frac}" if frac is not None else "")
    suffix = "".join(
        c.upper() if up else c
        for c, up in zip(unit + ("i" if i else "") + ("b" if b else ""), upper + [False] * 3, strict=False)
    )
    text = number + (" " if space else "") + suffix
    assert ram_in_bytes(text) == int(float(number) * UNITS[unit])


@given(st.text(alphabet="0123456789.kmgtpibKMGTPIB -e", max_size=8))
def test_any_text_is_a_size_only_in_go_units_grammar(text: str) -> None:
    import re

    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) ?([kmgtpKMGTP])?[iI]?[bB]?", text)
    size = None if m is None else int(float(m.group(1)) * UNITS[(m.group(2) or "").lower()])
    if size is None or size >= 2**63:
        with pytest.raises(ValueError):
            ram_in_bytes(text)
    else:
        assert ram_in_bytes(text) == size

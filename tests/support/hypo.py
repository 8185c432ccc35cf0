"""Hypothesis's example counts under the profiles tests/conftest.py registers: a test states the count it needs
on an ordinary run; the `fuzz` profile (`make fuzz`) multiplies it by twenty, `ci` halves it and derandomizes the
examples."""

from __future__ import annotations

from hypothesis import settings

BASE = 100  # hypothesis's own max_examples: a profile of BASE examples keeps each test's count


def examples(n: int) -> int:
    """`n` examples scaled by the loaded profile (its max_examples over BASE)."""
    loaded = settings.default
    return n if loaded is None else max(1, n * loaded.max_examples // BASE)

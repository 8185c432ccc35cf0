"""Waiting on a condition, never on the clock: a fixed sleep is too short on a busy machine and too long on an idle
one, and says nothing when it was too short."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(ready: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Call `ready` until it returns something true and return that; after `timeout` seconds, fail the test saying
    what it waited for (and the last value seen)."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last seen: {value!r})")
        time.sleep(interval)

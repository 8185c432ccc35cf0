"""Reads every card's health from the real NVML as gpupin does (gpupin.core.health), with the raw readings beside
it, and times it: what `hostagent run` and `ls` add to each call. Run on a GPU host after host.sh's install:
`python3 docs/probes/real_health.py`. One JSON line per fact."""

from __future__ import annotations

import json
import statistics
import time

import pynvml

from gpupin.core import nvml, readings


def out(**fact: object) -> None:
    print(json.dumps(fact), flush=True)


cards = nvml.list_cards(detail=True, mig=True, tolerate_lost=True)
readings.assess(cards)
for c in cards:
    m = readings.memory_health(c.index)
    h = pynvml.nvmlDeviceGetHandleByIndex(c.index)
    out(
        index=c.index,
        uuid=c.uuid,
        name=c.name,
        health=c.health.to_dict() if c.health else None,
        ecc_uncorrected_volatile=m.ecc_uncorrected,
        retired_pending=m.retired_pending,
        remap_pending=m.remap_pending,
        remap_failure=m.remap_failure,
        error=m.error,
        ecc_mode=pynvml.nvmlDeviceGetEccMode(h),
        supported_events=pynvml.nvmlDeviceGetSupportedEventTypes(h),
    )

times = []
for _ in range(20):
    t = time.perf_counter()
    readings.assess(cards)
    times.append((time.perf_counter() - t) * 1000)
out(what="health.assess on every card, ms", median=round(statistics.median(times), 3), max=round(max(times), 3))

events = readings.XidEvents(c.index for c in cards)
t = time.perf_counter()
got = events.drain(300)
events.close()
out(
    what="XID wait 300 ms with nothing pending",
    watched=events.watched,
    events=got,
    waited_ms=round((time.perf_counter() - t) * 1000, 1),
)

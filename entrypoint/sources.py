"""Where the expectation comes from: small readers tried in DESIGN.md's order; the first that names cards wins.

Each reader looks at one source and answers with an `Expectation` (the source names cards), a reason (the source is
set but names no card; the reason goes into the one line that says why the workload runs unpinned), or None (the
source is absent). A reader that needs NVML (a source naming cards by index or device file) asks the `Context`,
which reads the cards once, and only then. Adding a source is one function and one entry in `READERS`.
"""

from __future__ import annotations

from gpupin.entrypoint.errors import shorten
from gpupin.entrypoint.expectation import EXPECT_VAR, Expectation, parse_expect
from gpupin.entrypoint.identity import is_full_uuid, is_uuid_like

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Union

    from gpupin.entrypoint.nvml import Card

    Answer = Union[Expectation, str, None]

NVD_VAR = "NVIDIA_VISIBLE_DEVICES"
SWARM_PREFIX = "DOCKER_RESOURCE_"
SLURM_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")  # gpupin.entrypoint.slurm reads them


class Context:
    """What a reader may use: the environment, and the cards NVML sees (read on first use, at most once)."""

    __slots__ = ("_cards", "_read_cards", "env")

    def __init__(self, env: Mapping[str, str], cards: Callable[[], list[Card]] | None = None) -> None:
        self.env = env
        self._read_cards = cards
        self._cards: list[Card] | None = None

    def cards(self) -> list[Card]:
        if self._cards is None:
            if self._read_cards is None:
                from gpupin.entrypoint import nvml

                self._cards = nvml.list_cards(mig=True)
            else:
                self._cards = self._read_cards()
        return self._cards

    @property
    def cards_read(self) -> list[Card] | None:
        """The cards, if a reader already needed them (the caller then need not ask NVML again)."""
        return self._cards


def _uuid_list(value: str) -> list[str] | None:
    """The entries of a comma list when every one is UUID-like, else None."""
    entries = [e.strip() for e in value.split(",")]
    if not entries or not all(entries) or not all(is_uuid_like(e) for e in entries):
        return None
    return entries


def gpupin_expect(ctx: Context) -> Answer:
    """GPUPIN_EXPECT, written by hostagent, compose rendering or by hand. Set but malformed is an error."""
    value = ctx.env.get(EXPECT_VAR)
    return None if value is None else parse_expect(value)


def nvidia_visible_devices(ctx: Context) -> Answer:
    """NVIDIA_VISIBLE_DEVICES when it lists full UUIDs (docker --gpus device=UUID, the Kubernetes device plugin)."""
    value = ctx.env.get(NVD_VAR)
    if value is None:
        return None
    entries = _uuid_list(value)
    if entries is not None and all(is_full_uuid(e) for e in entries):
        return parse_expect(value, NVD_VAR)
    if value.strip() in ("void", ""):
        return f"{NVD_VAR}={value} names no card (CDI or no GPU request)"
    if value.strip() in ("all", "none"):
        return f"{NVD_VAR}={value} names no particular card"
    return f"{NVD_VAR}={shorten(value)} names no card by UUID"


def swarm_resources(ctx: Context) -> Answer:
    """Swarm's generic resources: DOCKER_RESOURCE_<KIND>, named after the resource kind (the toolkit's default
    is DOCKER_RESOURCE_GPU, tried first)."""
    keys = sorted(k for k in ctx.env if k.startswith(SWARM_PREFIX))
    keys.sort(key=lambda k: (k != "DOCKER_RESOURCE_GPU", "GPU" not in k.upper(), k))
    for key in keys:
        if _uuid_list(ctx.env[key]) is not None:
            return parse_expect(ctx.env[key], key)
    return f"{', '.join(keys)} name(s) no GPU UUID" if keys else None


def slurm_allocation(ctx: Context) -> Answer:
    """Slurm's SLURM_STEP_GPUS / SLURM_JOB_GPUS (places in the node's gres.conf), in the order of Slurm's
    CUDA_VISIBLE_DEVICES."""
    if not any(v in ctx.env for v in SLURM_VARS):
        return None
    from gpupin.entrypoint import slurm  # only inside a Slurm job (it reads gres.conf): start-up stays short elsewhere

    return slurm.read(ctx)


# (what the unpinned line calls the source when it is absent, its reader), in DESIGN.md's order.
READERS: Sequence[tuple[str, Callable[[Context], Answer]]] = (
    (EXPECT_VAR, gpupin_expect),
    (NVD_VAR, nvidia_visible_devices),
    (SWARM_PREFIX + "*", swarm_resources),
    ("/".join(SLURM_VARS), slurm_allocation),
)


class Found:
    """The expectation (or None) and, for the unpinned line, why the sources tried before named no card."""

    __slots__ = ("context", "expectation", "reasons")

    def __init__(self, expectation: Expectation | None, reasons: list[str], context: Context) -> None:
        self.expectation = expectation
        self.reasons = reasons
        self.context = context

    def why_unpinned(self) -> str:
        """One clause that says why no source named a card."""
        return "; ".join(self.reasons)


def find(env: Mapping[str, str], cards: Callable[[], list[Card]] | None = None) -> Found:
    """Try the readers in order; the first that names cards gives the expectation."""
    ctx = Context(env, cards)
    reasons: list[str] = []
    absent: list[str] = []
    for name, reader in READERS:
        answer = reader(ctx)
        if isinstance(answer, Expectation):
            return Found(answer, reasons, ctx)
        if answer is None:
            absent.append(name)
        else:
            reasons.append(answer)
    if absent:
        reasons.append(f"{', '.join(absent)} unset")
    return Found(None, reasons, ctx)


def from_environ(env: Mapping[str, str]) -> Expectation | None:
    """The expectation from the first source that names physical cards, or None."""
    return find(env).expectation

"""`run --wait`: what a run does when its cards are held, whoever looked (this process, or the resident agent for
it): without --wait it ends with the refusal (75); with it, it says once what it waits for, pauses, and asks again,
until the cards are free or --wait's seconds are up (75, saying how long it waited)."""

from __future__ import annotations

import time

from gpupin.core.errors import CardHeldError, GpupinError
from gpupin.hostagent import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.hostagent.agentlink import Link
    from gpupin.hostagent.run.request import RunRequest

POLL_S = 0.5  # how often a --wait run asks again, on average


def wait_before_retry(req: RunRequest, left: float, link: Link | None = None) -> None:
    """The pause between two attempts of a --wait run whose cards were held (`left`: seconds of --wait left,
    inf for --wait alone; `link`: the resident agent that answered, when the run goes through one): a jittered
    poll, so that many waiters do not ask in step. The one place a fair queue takes over (wait for this run's
    turn in the agent's queue)."""
    import random  # only a waiting run pays for it

    time.sleep(min(POLL_S * (0.5 + random.random()), max(left, 0.01)))


class Patience:
    """One run's --wait, around all its attempts (`with Patience(req) as patience:`): `refused(err)` raises the
    refusal when it is time to give up, else waits (`wait_before_retry`) before the next attempt. Entering and
    leaving are where a fair queue joins and leaves."""

    def __init__(self, req: RunRequest, link: Link | None = None) -> None:
        self.req = req
        self.link = link
        self.started = time.monotonic()
        self.said = False

    def __enter__(self) -> Patience:
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def refused(self, err: GpupinError) -> None:
        """`err`: the held cards' refusal (75), this process's own or the agent's."""
        if self.req.wait is None:
            raise err
        waited = time.monotonic() - self.started
        if waited >= self.req.wait:
            raise CardHeldError(f"{err.message}, still after waiting {waited:.0f} s",
                                "wait longer (--wait SECONDS, or --wait alone for as long as it takes), or free it "
                                "(`hostagent ls` shows who holds what)") from None
        if not self.said:
            say(f"waiting: {err.message}")
            self.said = True
        wait_before_retry(self.req, self.req.wait - waited, self.link)

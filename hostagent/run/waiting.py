"""`run --wait`: what a run does when its cards are held, whoever looked (this process, or the resident agent for
it): without --wait it ends with the refusal (75); with it, it says once what it waits for, waits for its turn in
the agent's fair queue (or polls, without an agent), and asks again, until the cards are free or --wait's seconds
are up (75, saying how long it waited)."""

from __future__ import annotations

import time

from gpupin.core.errors import CardHeldError, GpupinError
from gpupin.hostagent import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.hostagent.run.queueing import QueueClient
    from gpupin.hostagent.run.request import RunRequest


class WaitLoop:
    """One run's --wait, around all its attempts (`with WaitLoop(req) as wait_loop:`): `refused(err)` raises the
    refusal when it is time to give up, else waits for the next attempt. A --wait run waits in the resident
    agent's fair queue where one answers (gpupin.hostagent.run.queueing: it joins before its first attempt and
    leaves when the run ends), else polls."""

    def __init__(self, req: RunRequest) -> None:
        self.req = req
        self.started = time.monotonic()
        self.announced = False
        self._queue: QueueClient | None = None

    def __enter__(self) -> WaitLoop:
        self.started = time.monotonic()
        if self.req.wait is not None:
            from gpupin.hostagent.run import queueing  # only a waiting run pays for the queue's client

            self._queue = queueing.QueueClient.of(self.req)
            self._queue.join(self.started + self.req.wait)  # behind those who already wait for these cards
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Out of the queue at once: the run booked its cards, gave up or was interrupted."""
        if self._queue is not None:
            self._queue.close()

    def refused(self, err: GpupinError) -> None:
        """`err`: the held cards' refusal (75), this process's own or the agent's."""
        if self.req.wait is None:
            raise err
        waited = time.monotonic() - self.started
        if waited >= self.req.wait:
            raise CardHeldError(
                f"{err.message}, still after waiting {waited:.0f} s",
                "wait longer (--wait SECONDS, or --wait alone for as long as it takes), or free it "
                "(`hostagent ls` shows who holds what)",
            ) from None
        if not self.announced:
            say(f"waiting: {err.message}")
            self.announced = True
        assert self._queue is not None
        self._queue.next(self.started + self.req.wait)  # this run's next turn (or, without an agent, a poll)

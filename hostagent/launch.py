"""`hostagent run`: resolve the GPUs, take the ledger lock, look, create and start, then follow like `docker run`.

Order matters for "nothing started or lost on refusal": the request, the GPUs and the image are checked before
anything is created; a container that was created but could not be started is removed; a hostagent interrupted
between create and start removes what it created (and one killed outright leaves a created, never-started
container, which holds no card: see gpupin.hostagent.ledger).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time

from gpupin.entrypoint import nvml
from gpupin.entrypoint.errors import UsageError
from gpupin.hostagent import engine, gpus, image, ledger
from gpupin.hostagent.attach import Attachment
from gpupin.hostagent.errors import CardHeldError
from gpupin.hostagent.request import ContainerSpec, RunRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card
    from gpupin.entrypoint.resolve import Target

POLL_S = 0.5  # how often a --wait request looks at the ledger again


def _failpoint(name: str) -> None:
    """Die here, as a `kill -9` would, when GPUPIN_FAILPOINT names this point: how the tests prove that a
    hostagent killed mid-launch leaves no card held (the points: after-lock, after-create)."""
    if os.environ.get("GPUPIN_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def _say(msg: str) -> None:
    sys.stderr.write(f"hostagent: {msg}\n")
    sys.stderr.flush()


def _conflicts(picks: Sequence[Target], busy: dict[str, list[ledger.Holder]]) -> list[str]:
    """One line per asked card that someone holds (a whole card, its MIG devices, or its parent)."""
    out = []
    for p in picks:
        keys = [p.uuid, *([p.card.uuid] if p.mig is not None and p.card.uuid else []),
                *(m.uuid for m in p.card.mig_devices if p.mig is None)]
        holders = [h for k in keys for h in busy.get(k, [])]
        if holders:
            out.append(f"{p.uuid} is held by " + ", ".join(dict.fromkeys(h.describe() for h in holders)))
    return out


def _held_error(req: RunRequest, why: list[str], waited: float | None) -> CardHeldError:
    after = f" after waiting {waited:.0f} s" if waited is not None else ""
    return CardHeldError(
        "; ".join(why) + after,
        "wait for it with --wait [SECONDS], pick a free card (`hostagent ls`), or share it on purpose with --share",
    )


def _pick(req: RunRequest, cards: Sequence[Card], picks: list[Target] | None,
          busy: dict[str, list[ledger.Holder]]) -> tuple[list[Target] | None, list[str]]:
    """The cards to use now, or None and why not."""
    if req.count is not None:
        chosen = gpus.choose_free(req.count, cards, busy)
        if chosen is None:
            free = len(gpus.free_cards(cards, busy))
            return None, [f"--count {req.count}: {free} of {len(cards)} card(s) are free "
                          f"(held: {', '.join(sorted(busy)) or 'none'})"]
        return chosen, []
    assert picks is not None
    why = [] if req.share else _conflicts(picks, busy)
    return (None, why) if why else (picks, [])


class Launched:
    """A created and started container, with its attachment (streams, exit) when in the foreground."""

    def __init__(self, cid: str, spec: ContainerSpec, attachment: Attachment | None) -> None:
        self.cid = cid
        self.spec = spec
        self.attachment = attachment


def _create_and_start(api: Any, spec: ContainerSpec, foreground: bool) -> Launched:
    try:
        cid = api.create_container_from_config(spec.config(api.api_version), **spec.create_args())["Id"]
    except Exception as err:
        if engine.is_api_error(err):
            raise engine.refused(err, "Docker refused to create the container") from None
        if engine.is_sdk_error(err):  # the SDK checks some options itself (sizes, modes) before sending
            raise UsageError(f"bad option: {err}", "see `hostagent run --help`") from None
        raise
    _failpoint("after-create")
    try:
        attachment = None
        if foreground:
            attachment = Attachment(cid, spec.req, api.api_version)
            attachment.open()
        api.start(cid)
        return Launched(cid, spec, attachment)
    except BaseException as err:
        with contextlib.suppress(Exception):
            api.remove_container(cid, force=True)
        if engine.is_api_error(err):
            raise engine.refused(err, "Docker could not start the container") from None
        raise


def launch(req: RunRequest) -> Launched | ContainerSpec:
    """Everything up to a started container (or, with --dry-run, up to its spec)."""
    cards = nvml.list_cards(detail=req.count is not None, mig=True, tolerate_lost=True)
    picks = gpus.resolve_specs(req.gpus, cards) if req.gpus else None
    if req.dry_run:
        return _dry_run_spec(req, cards, picks)
    api = engine.connect()
    image.ensure(api, req)
    lock = ledger.HostLock(engine.docker_host())
    started = time.monotonic()
    said_waiting = False
    while True:
        lock.acquire()
        try:
            _failpoint("after-lock")
            busy = ledger.held(engine.read_holders(api, cards))
            chosen, why = _pick(req, cards, picks, busy)
            if chosen is not None:
                spec = ContainerSpec(req, chosen)
                return _create_and_start(api, spec, foreground=not req.detach)
        finally:
            lock.release()
        waited = time.monotonic() - started
        if req.wait is None:
            raise _held_error(req, why, None)
        if waited >= req.wait:
            raise _held_error(req, why, waited)
        if not said_waiting:
            _say("waiting: " + "; ".join(why))
            said_waiting = True
        time.sleep(min(POLL_S * (0.5 + random.random()), max(req.wait - waited, 0.01)))


def _dry_run_spec(req: RunRequest, cards: Sequence[Card], picks: list[Target] | None) -> ContainerSpec:
    if picks is None:
        # --count needs the ledger; without a daemon, say that the choice ignores who holds what.
        busy: dict[str, list[ledger.Holder]] = {}
        try:
            busy = ledger.held(engine.read_holders(engine.connect(timeout=5), cards))
        except Exception as err:
            _say(f"dry run: the ledger was not read ({getattr(err, 'message', err)}); every card counts as free")
        picks, why = _pick(req, cards, None, busy)
        if picks is None:
            raise _held_error(req, why, None)
    return ContainerSpec(req, picks)


def run(req: RunRequest) -> int:
    """The whole of `hostagent run`, returning its exit code (the container's, in the foreground)."""
    old_term = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        result = launch(req)
    except (Interrupted, KeyboardInterrupt) as err:
        signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
        _say(f"{signal.Signals(signum).name} before the container started: nothing left behind")
        return 128 + signum
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if isinstance(result, ContainerSpec):
        return 0
    if req.detach:
        sys.stdout.write(result.cid + "\n")
        return 0
    assert result.attachment is not None
    return result.attachment.follow()

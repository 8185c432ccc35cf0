"""`hostagent run`: resolve the GPUs, take the ledger lock, look, create and start, then follow like `docker run`.

Order matters for "nothing started or lost on refusal": the request, the GPUs and the image are checked before
anything is created; a container that was created but could not be started is removed; a hostagent interrupted
between create and start removes what it created. One killed outright leaves a created, never-started container
whose lease is dead: it holds nothing, and the next run removes it (gpupin.hostagent.ledger.lease, .ledger, .lock).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from gpupin.core import nvml, readings
from gpupin.core.errors import CardHeldError, DockerRefusedError, DockerUnavailableError
from gpupin.hostagent import engine, gpus, say
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger import holders as ledger
from gpupin.hostagent.ledger import lease, lock, renewal, uses
from gpupin.hostagent.ledger import read as ledger_read
from gpupin.hostagent.run import image, queueing
from gpupin.hostagent.run.attach import Attachment
from gpupin.hostagent.run.request import ContainerSpec, RunRequest, bad_option
from gpupin.hostagent.trace import mark

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.core.resolve import Target

NO_CDI = cdi.Detection(False, f"the daemon's API predates CDI ({cdi.MIN_API})")


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


def _keys(p: Target) -> list[str]:
    """What holding the asked card means: the card or MIG device itself, its parent, or any of its MIG devices."""
    return [p.uuid, *([p.card.uuid] if p.mig is not None and p.card.uuid else []),
            *(m.uuid for m in p.card.mig_devices if p.mig is None)]


def _conflicts(picks: Sequence[Target], busy: dict[str, list[ledger.Holder]]) -> list[str]:
    """One line per asked card that someone holds: the containers that hold it, the processes that use it."""
    out = []
    for p in picks:
        holders = list({id(h): h for k in _keys(p) for h in busy.get(k, [])}.values())
        containers = list(dict.fromkeys(h.describe() for h in holders if not h.process))
        # A process of the container that holds the card is that container's: said once, as its holder.
        others = [h for h in holders if h.process and not (isinstance(h, uses.Use) and h.foreign is False)]
        processes = list(dict.fromkeys(h.describe() for h in others or ([] if containers else holders)))
        parts = ([f"held by {', '.join(containers)}"] if containers else []) + (
            [f"in use by {', '.join(processes)}"] if processes else [])
        if parts:
            out.append(f"{p.uuid} is {' and '.join(parts)}")
    return out


def _taken(blocked: dict[str, list[ledger.Holder]]) -> str:
    """Which cards a --count could not take, and why in a word: held (a container), in use (a process),
    unknown (NVML would not list its processes)."""
    groups: dict[str, list[str]] = {}
    for key in sorted(blocked):
        hs = blocked[key]
        why = ("held" if any(not h.process for h in hs) else
               "in use by other processes" if any(isinstance(h, uses.Use) for h in hs) else
               "who uses it is unknown" if hs else "over --max-load/--max-memory")
        groups.setdefault(why, []).append(key)
    return "; ".join(f"{why}: {', '.join(keys)}" for why, keys in groups.items()) or "held: none"


def _busy(cards: Sequence[Card], picks: Sequence[Target] | None, book: ledger_read.Book
          ) -> dict[str, list[ledger.Holder]]:
    """Card UUID -> what holds it now: the ledger's containers, and the processes on the cards this request may
    get (gpupin.hostagent.ledger.uses), read from NVML at this look."""
    mine = list(cards) if picks is None else list({id(p.card): p.card for p in picks}.values())
    nvml.read_processes(mine)
    busy = ledger.held(book.holders)
    # Every process counts (no /proc read here): who runs it matters only to what a refusal says.
    for key, hs in uses.blocking(mine, uses.attribute(mine, book.holders, book.names), attributed=False).items():
        busy.setdefault(key, []).extend(hs)
    mark("attributed")
    return busy


class _Refusal:
    """Why a look found no cards, and the hint that fits this case (not a list of every hint there is)."""

    def __init__(self, why: list[str], hint: str) -> None:
        self.why = why
        self.hint = hint


def _held_error(req: RunRequest, refusal: _Refusal | list[str], waited: float | None) -> CardHeldError:
    if isinstance(refusal, list):  # reasons without their case: a hint true in every case
        refusal = _Refusal(refusal, "wait for it with --wait [SECONDS] (`hostagent ls` shows who holds what)")
    if waited is None:
        return CardHeldError("; ".join(refusal.why), refusal.hint)
    return CardHeldError(f"{'; '.join(refusal.why)}, still after waiting {waited:.0f} s",
                         "wait longer (--wait SECONDS, or --wait alone for as long as it takes), or free it "
                         "(`hostagent ls` shows who holds what)")


def _pick(req: RunRequest, cards: Sequence[Card], picks: list[Target] | None,
          busy: dict[str, list[ledger.Holder]]) -> tuple[list[Target] | None, list[str]]:
    """The cards to use now, or None and why not (`_choose` gives the whole refusal, with its hint)."""
    chosen, refusal = _choose(req, cards, picks, busy)
    return chosen, refusal.why if refusal is not None else []


def _choose(req: RunRequest, cards: Sequence[Card], picks: list[Target] | None,
            busy: dict[str, list[ledger.Holder]]) -> tuple[list[Target] | None, _Refusal | None]:
    """The cards to use now, or None and the refusal that says why, with the hint that fits."""
    blocked = ledger.blocking(busy, req.share)
    if req.count is not None and (req.max_load is not None or req.max_memory is not None):
        # With limits, a card that only processes use is judged by its load (GPUtil's rule), as is every card.
        blocked = {k: hs for k, hs in blocked.items() if not all(h.process for h in hs)}
        over = [c.uuid for c in cards if c.uuid and not gpus.within(c, req.max_load, req.max_memory)]
        blocked.update({u: blocked.get(u, []) for u in over})
    free = gpus.free_cards(cards, blocked)
    if req.count is not None:
        chosen = gpus.choose_free(req.count, cards, blocked)
        if chosen is not None:
            return chosen, None
        bad = gpus.unhealthy(cards)
        unfit = f"; unhealthy: {', '.join(str(c.index) for c in bad)}" if bad else ""
        why = [f"--count {req.count}: {len(free)} of {len(cards)} card(s) are free ({_taken(blocked)}{unfit})"]
        if free:
            return None, _Refusal(why, f"ask for at most {len(free)} (--count {len(free)}), or wait for more with "
                                       "--wait [SECONDS]")
        return None, _Refusal(why, "wait for one with --wait [SECONDS] (`hostagent ls` shows who holds them)")
    assert picks is not None
    why = _conflicts(picks, blocked)
    if not why:
        return picks, None
    hint = ["wait for it with --wait [SECONDS]"]
    others = [c for c in free if all(c is not p.card for p in picks)]
    if others:
        indices = ", ".join(str(i) for i in sorted(c.index for c in others))
        hint.append(f"pick a free card ({indices}: `hostagent ls`)")
    holders = [h for p in picks for k in _keys(p) for h in busy.get(k, [])]
    if not req.share and holders and all(h.shared or h.process for h in holders):
        hint.append("share it on purpose with --share" if any(h.process for h in holders) else
                    "share it with --share (its holder shares)")
    return None, _Refusal(why, ", or ".join(hint))


class Launched:
    """A created and started container, with its attachment (streams, exit) when in the foreground."""

    def __init__(self, cid: str, spec: ContainerSpec, attachment: Attachment | None) -> None:
        self.cid = cid
        self.spec = spec
        self.attachment = attachment


def _refused(err: BaseException, doing: str, spec: ContainerSpec) -> DockerRefusedError:
    out = engine.refused(err, doing)
    if spec.pin.via == cdi.CDI and "cdi" in out.message.lower():
        out.hint = (f"the daemon does not serve {cdi.KIND} by this name: see `docker info` (CDISpecDirs) and the "
                    "spec (`nvidia-ctk cdi list` lists its names), or pin with --via nvidia")
    return out


def _create_and_start(api: Any, spec: ContainerSpec, foreground: bool,
                      on_created: Callable[[str], None] | None = None) -> Launched:
    try:
        cid = api.create_container_from_config(spec.config(api.api_version), **spec.create_args())["Id"]
        mark("created")
    except Exception as err:
        if engine.is_api_error(err):
            raise _refused(err, "Docker refused to create the container", spec) from None
        if engine.is_sdk_error(err):  # the SDK checks some options itself (sizes, modes) before sending
            raise bad_option(err) from None
        raise
    _failpoint("after-create")
    try:
        if on_created is not None:
            on_created(cid)  # the ledger lock's commit: raises lock.LeaseLost when it ran past its lease
        attachment = None
        # Renewed on the daemon while it starts, however long the NVIDIA hook takes, for the clients that cannot
        # see this process (gpupin.hostagent.ledger.renewal); those that can see it alive leave it alone.
        with renewal.Renewal(api, cid):
            if foreground:
                attachment = Attachment(cid, spec.req, api.api_version)
                attachment.open()
                mark("attached")
            api.start(cid)
        mark("started")
        return Launched(cid, spec, attachment)
    except BaseException as err:
        with contextlib.suppress(Exception):
            api.remove_container(cid, force=True)
        if engine.is_api_error(err):
            raise _refused(err, "Docker could not start the container", spec) from None
        raise


def _remove_orphans(api: Any, book: ledger_read.Book) -> None:
    """Containers a hostagent created and never started, whose lease is dead or expired: they hold nothing and
    would keep their names forever. Removed by ID, under the ledger lock."""
    for s in book.orphans:
        labels = s.get("Labels") or {}
        name = str((s.get("Names") or ["?"])[0]).lstrip("/")
        try:
            api.remove_container(s["Id"], force=True, v=True)
        except Exception as err:
            if engine.is_not_found(err):
                continue
            if not engine.is_daemon_failure(err):
                raise
            say(f"could not remove {name} ({str(s['Id'])[:12]}), left created by {lease.holder_of(labels)}: "
                 f"{engine.failure(err, 'remove').message}")
            continue
        renewal.forget(api, str(s["Id"]))
        say(f"removed {name} ({str(s['Id'])[:12]}): created by {lease.holder_of(labels)}, never started")


LEASE_RETRIES = 3  # looks that ran past their lease before the run gives up (a daemon far too slow)


def launch(req: RunRequest) -> Launched | ContainerSpec:
    """Everything up to a started container (or, with --dry-run, up to its spec)."""
    cards = nvml.list_cards(detail=req.count is not None, mig=True, tolerate_lost=True)
    readings.assess(cards)
    mark("cards")
    picks = gpus.resolve_specs(req.gpus, cards) if req.gpus else None
    for p in picks or ():
        if p.card.health is not None and p.card.health.healthy is None:  # asked for by name: warned, not refused
            say(f"warning: the health of {p.uuid} is unknown ({p.card.health.why})")
    if req.dry_run:
        return _dry_run_spec(req, cards, picks)
    api = engine.connect()
    mark("connected")
    # One /info: whether the daemon serves CDI (unless --via says how, or its API predates CDI), and its runtimes
    # for the ledger.
    daemon_info = engine.info(api) if req.via is None and engine.may_serve_cdi(api) else None
    detection = engine.cdi_detection(daemon_info) if daemon_info is not None else NO_CDI
    # The lock's create needs the image, so it checks it too: image.ensure (pull or 125) runs only when it is missing
    # (or --pull always asks for a pull first).
    if req.pull == "always":
        image.ensure(api, req)
    guard = lock.LedgerLock(api, req.image, missing_image=lambda: image.ensure(api, req))
    # With the agent up, the waits between attempts are turns in its fair queue (left when this ends).
    with queueing.Turns.of(req) as turns:
        started = time.monotonic()
        if req.wait is not None:
            turns.join(started + req.wait)  # behind those who already wait for these cards
        said_waiting = False
        overruns = 0
        while True:
            refusal: _Refusal | None
            try:
                with guard:
                    mark("locked")
                    _failpoint("after-lock")
                    book = ledger_read.read_ledger(api, cards, daemon_info)
                    mark("looked")
                    _remove_orphans(api, book)
                    chosen, refusal = _choose(req, cards, picks, _busy(cards, picks, book))
                    if chosen is not None:
                        spec = ContainerSpec(req, chosen, _via(req, chosen, detection))
                        spec.labels.update(lease.claim())  # it holds its cards while this run starts it
                        guard.check()
                        return _create_and_start(api, spec, foreground=not req.detach, on_created=guard.commit)
            except lock.LeaseLost as err:
                overruns += 1
                if overruns >= LEASE_RETRIES:
                    raise DockerUnavailableError(
                        f"the Docker daemon at {engine.docker_host()} is too slow to pin a container inside the ledger "
                        f"lock's lease ({err})", "see the daemon's load and log, then retry") from None
                continue
            except lock.LockBusyError as err:
                if req.wait is None:
                    raise
                refusal = _Refusal([err.message], err.hint or "")
            except Exception as err:
                if isinstance(err, (Interrupted, KeyboardInterrupt)) or not engine.is_daemon_failure(err):
                    raise
                raise engine.failure(err, "talking to the daemon") from None
            assert refusal is not None
            waited = time.monotonic() - started
            if req.wait is None:
                raise _held_error(req, refusal, None)
            if waited >= req.wait:
                raise _held_error(req, refusal, waited)
            if not said_waiting:
                say("waiting: " + "; ".join(refusal.why))
                said_waiting = True
            turns.next(started + req.wait)


def _via(req: RunRequest, targets: Sequence[Target], detection: cdi.Detection) -> str:
    """How to pin: --via as asked, else as the daemon serves these cards (gpupin.hostagent.engine.cdi)."""
    return detection.via([t.uuid for t in targets], req.via, req.capabilities)


def _dry_run_spec(req: RunRequest, cards: Sequence[Card], picks: list[Target] | None) -> ContainerSpec:
    # --count needs the ledger (unknown is not free: without a daemon, a count is not placed), and the way to pin
    # (unless --via says it) the daemon's CDI devices; without a daemon, a named card's line is still printed.
    detection = NO_CDI
    if picks is not None and req.via is not None:
        return ContainerSpec(req, picks, _via(req, picks, NO_CDI))
    try:
        api = engine.connect(timeout=5)
        daemon_info = engine.info(api) if req.via is None and engine.may_serve_cdi(api) else None
        detection = engine.cdi_detection(daemon_info) if daemon_info is not None else NO_CDI
        book = ledger_read.read_ledger(api, cards, daemon_info) if picks is None else None
    except Exception as err:
        if picks is None:
            raise DockerUnavailableError(
                f"--dry-run --count {req.count} places the count on free cards, but which cards are free is unknown: "
                f"the ledger was not read ({getattr(err, 'message', err)})",
                "start Docker or set DOCKER_HOST, or name the cards with --gpu") from None
        if req.via is None:
            detection = cdi.Detection(False, "the daemon was not asked")
            say(f"dry run: the daemon was not asked ({getattr(err, 'message', err)}); the nvidia driver's form is "
                "shown (--via cdi shows CDI's)")
        book = None
    if picks is None:
        assert book is not None
        picks, why = _pick(req, cards, None, _busy(cards, None, book))
        if picks is None:
            raise _held_error(req, why, None)
    return ContainerSpec(req, picks, _via(req, picks, detection))


def run(req: RunRequest) -> int:
    """The whole of `hostagent run`, returning its exit code (the container's, in the foreground)."""
    old_term = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        result = launch(req)
    except (Interrupted, KeyboardInterrupt) as err:
        signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
        say(f"{signal.Signals(signum).name} before the container started: nothing left behind")
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

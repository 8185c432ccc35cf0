"""`hostagent run`: resolve the GPUs, take the ledger lock, read the ledger, create, start,
then follow like `docker run`.
`reserve` is the one place cards are booked, for this process or for the resident agent's caller. Nothing is left
on refusal: the request, the GPUs and the image are checked before anything is created, and a container created
but not started is removed (killed outright, its dead lease holds nothing: docs/design.md, "The lease").
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal

from gpupin.core import nvml, readings
from gpupin.core.contract import LOCK_LABEL
from gpupin.core.errors import CardHeldError, DockerUnavailableError, GpupinError
from gpupin.hostagent import engine, gpus, mark, say, start_thread
from gpupin.hostagent.engine import cdi, podman
from gpupin.hostagent.ledger import holders as ledger
from gpupin.hostagent.ledger import lease, lock
from gpupin.hostagent.ledger import processes as ledger_processes
from gpupin.hostagent.ledger import read as ledger_read
from gpupin.hostagent.run import image, start
from gpupin.hostagent.run.attach import Follow
from gpupin.hostagent.run.request import ContainerSpec, RunRequest, bad_option
from gpupin.hostagent.run.start import refused
from gpupin.hostagent.run.waiting import WaitLoop

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.core.resolve import Target
    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.run.attach import Attachment

    Admit = Callable[[ledger_read.LedgerReading, int], Mapping[str, str]]


def _failpoint(name: str) -> None:
    """Die here, as a `kill -9` would, when GPUPIN_FAILPOINT names this point: how the tests prove that a
    hostagent killed mid-launch leaves no card held (the points: after-lock, after-create)."""
    if os.environ.get("GPUPIN_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _keys(p: Target) -> list[str]:
    """What holding the asked card means: the card or MIG device itself, its parent, or any of its MIG devices."""
    return [
        p.uuid,
        *([p.card.uuid] if p.mig is not None and p.card.uuid else []),
        *(m.uuid for m in p.card.mig_devices if p.mig is None),
    ]


def _conflicts(picks: Sequence[Target], busy: dict[str, list[ledger.Holder]]) -> list[str]:
    """One line per asked card that someone holds: the containers that hold it, the processes that use it."""
    out = []
    for p in picks:
        holders = list({id(h): h for k in _keys(p) for h in busy.get(k, [])}.values())
        containers = list(dict.fromkeys(h.describe() for h in holders if not h.process))
        # A process of the container that holds the card is that container's: said once, as its holder; so is the
        # use NVML names no process for on a card a container holds (its own, most likely).
        others = [
            h
            for h in holders
            if h.process
            and not (isinstance(h, ledger_processes.GpuProcess) and h.foreign is False)
            and not (containers and isinstance(h, ledger_processes.UnseenUse))
        ]
        processes = list(dict.fromkeys(h.describe() for h in others or ([] if containers else holders)))
        parts = ([f"held by {', '.join(containers)}"] if containers else []) + (
            [f"in use by {', '.join(processes)}"] if processes else []
        )
        if parts:
            out.append(f"{p.uuid} is {' and '.join(parts)}")
    return out


def _taken(blocked: dict[str, list[ledger.Holder]]) -> str:
    """Which cards a --count could not take, and why in a word: held (a container), in use (a process),
    unknown (NVML would not list its processes)."""
    groups: dict[str, list[str]] = {}
    for key in sorted(blocked):
        hs = blocked[key]
        why = (
            "held"
            if any(not h.process for h in hs)
            else "in use by other processes"
            if any(isinstance(h, ledger_processes.GpuProcess) for h in hs)
            else "in use by an owner NVML does not name"
            if any(isinstance(h, ledger_processes.UnseenUse) for h in hs)
            else "who uses it is unknown"
            if hs
            else "over --max-load/--max-memory"
        )
        groups.setdefault(why, []).append(key)
    return "; ".join(f"{why}: {', '.join(keys)}" for why, keys in groups.items()) or "held: none"


def _busy(
    cards: Sequence[Card], picks: Sequence[Target] | None, reading: ledger_read.LedgerReading | None
) -> dict[str, list[ledger.Holder]]:
    """Card UUID -> what holds it now: the ledger's containers (None: the ledger was not read, so only the
    processes are known), and the processes on the cards this request may get (gpupin.hostagent.ledger.processes),
    read from NVML at this ledger read."""
    mine = list(cards) if picks is None else list({id(p.card): p.card for p in picks}.values())
    nvml.read_processes(mine)
    busy = ledger.held(reading.holders) if reading is not None else {}
    holders, names, places = (
        (reading.holders, reading.names, reading.places) if reading is not None else (None, None, None)
    )
    # Every process counts (no /proc read here): who runs it matters only to what a refusal says.
    for key, hs in ledger_processes.blocking(
        mine, ledger_processes.attribute(mine, holders, names, places), attributed=False
    ).items():
        busy.setdefault(key, []).extend(hs)
    mark("attributed")
    return busy


class _Refusal:
    """Why a ledger read found no cards, and the hint that fits this case (not a list of every hint there is)."""

    def __init__(self, why: list[str], hint: str) -> None:
        self.why = why
        self.hint = hint


def _held_error(refusal: _Refusal | list[str]) -> CardHeldError:
    """The refusal as the error a run without --wait ends with (a --wait run waits on it: run.waiting)."""
    if isinstance(refusal, list):  # reasons without their case: a hint true in every case
        refusal = _Refusal(refusal, "wait for it with --wait [SECONDS] (`hostagent ls` shows who holds what)")
    return CardHeldError("; ".join(refusal.why), refusal.hint)


def _pick(
    req: RunRequest, cards: Sequence[Card], picks: list[Target] | None, busy: dict[str, list[ledger.Holder]]
) -> tuple[list[Target] | None, list[str]]:
    """The cards to use now, or None and why not (`_choose` gives the whole refusal, with its hint)."""
    chosen, refusal = _choose(req, cards, picks, busy)
    return chosen, refusal.why if refusal is not None else []


def _blocked(
    req: RunRequest, cards: Sequence[Card], busy: dict[str, list[ledger.Holder]]
) -> dict[str, list[ledger.Holder]]:
    """The cards this request may not take now, and who keeps it off them (none: over --count's limits)."""
    blocked = ledger.blocking(busy, req.share)
    if req.count is not None and (req.max_load is not None or req.max_memory is not None):
        # With limits, a card that only processes use is judged by its load (GPUtil's rule), as is every card.
        blocked = {k: hs for k, hs in blocked.items() if not all(h.process for h in hs)}
        over = [c.uuid for c in cards if c.uuid and not gpus.within(c, req.max_load, req.max_memory)]
        blocked.update({u: blocked.get(u, []) for u in over})
    return blocked


def free_now(req: RunRequest, cards: Sequence[Card], busy: dict[str, list[ledger.Holder]]) -> list[Card]:
    """The cards a --count of this request would take from now, best first: the one rule for choosing a count's
    cards and for the free cards a refusal names (`busy`: what holds every card, processes included)."""
    return gpus.free_cards(cards, _blocked(req, cards, busy))


def _choose(
    req: RunRequest,
    cards: Sequence[Card],
    picks: list[Target] | None,
    busy: dict[str, list[ledger.Holder]],
    everyone: Callable[[], dict[str, list[ledger.Holder]]] | None = None,
) -> tuple[list[Target] | None, _Refusal | None]:
    """The cards to use now, or None and the refusal that says why, with the hint that fits. `busy` may know only
    the processes of the asked cards (`_busy`); `everyone` gives what holds every card, asked only when a refusal
    names the free cards to pick instead (None: `busy` knows them all)."""
    blocked = _blocked(req, cards, busy)
    free = gpus.free_cards(cards, blocked)
    if req.count is not None:
        chosen = gpus.choose_free(req.count, cards, blocked)
        if chosen is not None:
            return chosen, None
        bad = gpus.unhealthy(cards)
        unfit = f"; unhealthy: {', '.join(str(c.index) for c in bad)}" if bad else ""
        why = [f"--count {req.count}: {len(free)} of {len(cards)} card(s) are free ({_taken(blocked)}{unfit})"]
        if free:
            return None, _Refusal(
                why, f"ask for at most {len(free)} (--count {len(free)}), or wait for more with --wait [SECONDS]"
            )
        return None, _Refusal(why, "wait for one with --wait [SECONDS] (`hostagent ls` shows who holds them)")
    assert picks is not None
    why = _conflicts(picks, blocked)
    if not why:
        return picks, None
    hint = ["wait for it with --wait [SECONDS]"]
    takeable = free_now(req, cards, everyone()) if everyone is not None else free
    others = [c for c in takeable if all(c is not p.card for p in picks)]
    if others:
        indices = ", ".join(str(i) for i in sorted(c.index for c in others))
        hint.append(f"pick a free card ({indices}: `hostagent ls`)")
    holders = [h for p in picks for k in _keys(p) for h in busy.get(k, [])]
    if not req.share and holders and all(h.shared or h.process for h in holders):
        hint.append(
            "share it on purpose with --share"
            if any(h.process for h in holders)
            else "share it with --share (its holder shares)"
        )
    return None, _Refusal(why, ", or ".join(hint))


class Created:
    """A container made with the pin and signed with its owner's lease, not started yet."""

    def __init__(self, cid: str, spec: ContainerSpec) -> None:
        self.cid = cid
        self.spec = spec


class Launched:
    """A created and started container, with its attachment (streams, exit) when in the foreground."""

    def __init__(self, cid: str, spec: ContainerSpec, attachment: Attachment | None) -> None:
        self.cid = cid
        self.spec = spec
        self.attachment = attachment


def _create(api: Any, spec: ContainerSpec, guard: lock.LedgerLock) -> str:
    """Create the container inside the lock, then let the lock go (its commit); a commit past the lease removes
    what was made (the caller reads the ledger again)."""
    try:
        if podman.version(api):  # its compatible API drops the pin (gpupin.hostagent.engine.podman)
            cid = podman.create(api, spec.config(api.api_version), spec.req.name)
        else:
            cid = str(api.create_container_from_config(spec.config(api.api_version), **spec.create_args())["Id"])
        mark("created")
    except Exception as err:
        if engine.is_not_found(err) and not guard.daemon.image_checked:  # a lock taken through a spare
            raise lock.ImageMissing(spec.req.image) from None
        if engine.is_api_error(err):
            on_podman = bool(podman.version(api))  # the error names the runtime it came from
            doing = f"{'podman' if on_podman else 'Docker'} refused to create the container"
            raise refused(err, doing, spec.pin.via, on_podman) from None
        if engine.is_sdk_error(err):  # the SDK checks some options itself (sizes, modes) before sending
            raise bad_option(err) from None
        raise
    _failpoint("after-create")
    try:
        guard.commit(cid)  # raises lock.LeaseLost when it ran past its lease
    except BaseException:
        with contextlib.suppress(Exception):
            api.remove_container(cid, force=True)
        raise
    return cid


def _remove_orphans(api: Any, reading: ledger_read.LedgerReading, notify: Callable[[str], None]) -> None:
    """Containers a hostagent created and never started, whose lease is dead or expired: they hold nothing and
    would keep their names forever. Removed by ID, under the ledger lock."""
    for s in reading.orphans:
        labels = s.get("Labels") or {}
        name = str((s.get("Names") or ["?"])[0]).lstrip("/")
        try:
            api.remove_container(s["Id"], force=True, v=True)
        except Exception as err:
            if engine.is_not_found(err):
                continue
            if not engine.is_daemon_failure(err):
                raise
            notify(
                f"could not remove {name} ({str(s['Id'])[:12]}), left created by {lease.holder_of(labels)}: "
                f"{engine.failure(err, 'remove').message}"
            )
            continue
        lease.forget(api, str(s["Id"]))
        if LOCK_LABEL in labels:
            continue  # a dead agent's spare of the ledger lock (gpupin.hostagent.ledger.lock): not the user's news
        notify(f"removed {name} ({str(s['Id'])[:12]}): created by {lease.holder_of(labels)}, never started")


LEASE_RETRIES = 3  # ledger reads that ran past their lease before the run gives up (a daemon far too slow)


def read_cards(req: RunRequest, notify: Callable[[str], None] = say) -> tuple[list[Card], list[Target] | None]:
    """NVML's cards (with their health) and the ones asked for by name (None for --count)."""
    cards = nvml.list_cards(detail=req.count is not None, mig=True, tolerate_lost=True)
    readings.assess(cards)
    picks = gpus.resolve_specs(req.gpus, cards) if req.gpus else None
    for p in picks or ():
        if p.card.health is not None and p.card.health.healthy is None:  # asked for by name: warned, not refused
            notify(f"warning: the health of {p.uuid} is unknown ({p.card.health.why})")
    return cards, picks


class CardReading:
    """`read_cards` on a helper thread, so that NVML's import and read (nvidia-ml-py's import is most of it: about
    35 ms) overlap the connection and the ledger lock's create, which wait on the daemon (`make bench`'s phases).

    Why the overlap keeps every promise of the lock: what the lock guards is the look then the create, and both
    stay under it. `get` is called with the lock held and returns before the ledger and the cards' processes are
    read (`_busy`, under the lock as before); what the thread reads is which cards the host has, their identity
    and health, which no other client's booking changes, and which this process read before the lock already.
    What a run says stays in its order: the thread's warnings are said when the cards are taken, and an NVML
    refusal (no driver, a card that is not there) is the run's refusal whatever failed after it (`first`), as when
    NVML was read before anything else; a missing image is pulled only once the cards are known (`launch`).
    The cost: where NVML is slower than the lock's create (a host whose driver is not kept loaded: nvmlInit can take
    a second), the lock is held that much longer, inside its lease (`LedgerLock.check` still guards the create)."""

    def __init__(self, req: RunRequest, notify: Callable[[str], None] = say) -> None:
        self._notify = notify
        self._lines: list[str] = []
        self._cards: tuple[list[Card], list[Target] | None] | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._thread = start_thread(self._read, "hostagent-nvml", (req,))

    def _read(self, req: RunRequest) -> None:
        try:
            self._cards = read_cards(req, self._lines.append)
        except BaseException as err:  # raised in the main thread, by get
            self._error = err

    def get(self) -> tuple[list[Card], list[Target] | None]:
        """The cards and the picks, once read (NVML's refusal raised here)."""
        self._thread.join()
        if not self._taken:
            self._taken = True
            mark("cards")
            for line in self._lines:
                self._notify(line)
        if self._error is not None:
            raise self._error
        assert self._cards is not None
        return self._cards

    def first(self, err: BaseException) -> BaseException:
        """What a run that failed with `err` says: NVML's refusal when there is one, read first as before."""
        if not isinstance(err, Exception) or self._taken:  # a signal ends the run now; or NVML was not refused
            return err
        try:
            self.get()
        except GpupinError as nvml_err:
            return nvml_err
        return err


def reserve(
    api: Any,
    req: RunRequest,
    cards_of: Callable[[], tuple[list[Card], list[Target] | None]],
    daemon_info: DaemonAnswer | None,
    detection: cdi.Detection,
    owner: Mapping[str, str],
    missing_image: Callable[[], None],
    notify: Callable[[str], None] = say,
    admit: Admit | None = None,
    spares: lock.StandbyLocks | None = None,
    after: Callable[[Callable[[], None]], None] | None = None,
    sign: Callable[[ContainerSpec], Mapping[str, str]] | None = None,
) -> Created:
    """Under the ledger lock: read the ledger, choose and create the container, signed with `owner`'s lease (the
    process that will start it); the lock is let go once it exists. Held cards are CardHeldError (75). `cards_of`
    gives NVML's cards and the picks (CardReading.get: read while the lock was taken).
    `missing_image` is called outside the lock; `admit` judges the booking under it (gpupin.hostagent.policy.admit);
    `spares` and `after` are the resident agent's (gpupin.hostagent.ledger.lock); so is `sign`, the labels of its
    grant for the cards chosen (gpupin.hostagent.authz.grant)."""
    guard = lock.LedgerLock(api, req.image, missing_image=missing_image, spares=spares, after=after)
    overruns = 0
    while True:
        try:
            with guard:
                mark("locked")
                _failpoint("after-lock")
                cards, picks = cards_of()
                ledger = ledger_read.read_ledger(api, cards, daemon_info)
                mark("looked")
                _remove_orphans(api, ledger, notify)
                everyone = functools.partial(_busy, cards, None, ledger)  # read only for a refusal's hint
                chosen, refusal = _choose(req, cards, picks, _busy(cards, picks, ledger), everyone)
                if chosen is None:
                    assert refusal is not None
                    raise _held_error(refusal)
                spec = ContainerSpec(req, chosen, _via(req, chosen, detection))
                if podman.version(api):
                    podman.refuse_nvidia(spec.pin.via, str(podman.version(api)))
                spec.labels.update(owner)  # it holds its cards while its owner starts it
                if admit is not None:
                    spec.labels.update(admit(ledger, len(chosen)))
                if sign is not None:
                    spec.labels.update(sign(spec))
                guard.check()
                return Created(_create(api, spec, guard), spec)
        except lock.ImageMissing:  # found by the create, the lock having been a spare's: as for the lock's own
            missing_image()
            guard.daemon.image_checked = True
        except lock.LeaseLost as err:
            overruns += 1
            if overruns >= LEASE_RETRIES:
                raise DockerUnavailableError(
                    f"the Docker daemon at {engine.docker_host()} is too slow to pin a container inside the ledger "
                    f"lock's lease ({err})",
                    "see the daemon's load and log, then retry",
                ) from None
        except Exception as err:
            if isinstance(err, GpupinError) or not engine.is_daemon_failure(err):
                raise
            raise engine.failure(err, "talking to the daemon") from None


def launch(req: RunRequest, wait_loop: WaitLoop | None = None) -> Launched | ContainerSpec:
    """Everything up to a started container (or, with --dry-run, up to its spec). `wait_loop`: the --wait this run
    already waits in (a run through the agent that goes on without it keeps its place in the queue)."""
    if req.dry_run:
        cards, picks = read_cards(req)
        mark("cards")
        return _dry_run_spec(req, cards, picks)
    reading = CardReading(req)  # NVML, while the daemon is asked and the lock taken (CardReading says why)
    try:
        admit = _admit(req)  # what no wait can meet (a --for past the maximum, cards past the quota): 64 before asking
        api = engine.connect()
        mark("connected")
        daemon_info, detection = engine.daemon_view(api, ask=req.via is None)

        def missing_image() -> None:
            reading.get()  # a card that is not there is refused before any pull
            image.ensure(api, req)

        # The lock's create needs the image, so it checks it too: image.ensure (pull or 125) runs only when it is
        # missing (or --pull always asks for a pull first).
        if req.pull == "always":
            missing_image()
        with contextlib.nullcontext(wait_loop) if wait_loop is not None else WaitLoop(req) as waiting:
            while True:
                try:
                    created = reserve(
                        api,
                        req,
                        reading.get,
                        daemon_info,
                        detection,
                        lease.claim(),
                        missing_image=missing_image,
                        admit=admit,
                    )
                    break
                except CardHeldError as err:
                    waiting.refused(err)
            waiting.close()  # booked: out of the queue before the start
    except BaseException as err:
        first = reading.first(err)
        if first is err:
            raise
        raise first from None
    attachment = start.start(engine.follower(api.api_version), created.cid, Follow.of(req), created.spec.pin.via)
    return Launched(created.cid, created.spec, attachment)


def _admit(req: RunRequest) -> Admit:
    """A run without the agent books as this process's uid and groups, under the host's policy file (a file with
    mistakes is said, and enforces nothing here: the agent keeps its last good one)."""
    from gpupin.hostagent.agentdir import state_folder
    from gpupin.hostagent.ledger import owners
    from gpupin.hostagent.ledger.booking import Caller, read_extensions
    from gpupin.hostagent.policy import admit, host_policy

    policy = host_policy(say)
    me = Caller.me()
    q = policy.quota(os.getuid(), me.gids)
    if q.gpu_hours_per_day is not None or q.gpu_hours_per_week is not None:
        # The past is the agent's record (root's, written by the agent alone): a run of its own counts only the
        # present (docs/policy.md, "Quotas").
        say("warning: the GPU-hour quotas count only what you hold now: past use is counted through the agent")
    folder = state_folder()
    # Held cards count for the uids the agent proves (its owners.json): a label's uid is anyone's claim.
    return admit.for_run(
        policy,
        me,
        req.book_for,
        read_extensions(folder),
        lambda: owners.uids(owners.read(folder)),
        cards=req.count or len(req.gpus) or None,
    )


def _via(req: RunRequest, targets: Sequence[Target], detection: cdi.Detection) -> str:
    """How to pin: --via as asked, else as the daemon serves these cards (gpupin.hostagent.engine.cdi)."""
    return detection.via([t.uuid for t in targets], req.via, req.capabilities)


def _dry_run_spec(req: RunRequest, cards: Sequence[Card], picks: list[Target] | None) -> ContainerSpec:
    # --count needs the ledger (unknown is not free: without a daemon, a count is not placed), and the way to pin
    # (unless --via says it) the daemon's CDI devices; without a daemon, a named card's line is still printed.
    detection = engine.NO_CDI
    if picks is not None and req.via is not None:
        _say_busy(req, cards, picks, None)
        return ContainerSpec(req, picks, _via(req, picks, engine.NO_CDI))
    reading: ledger_read.LedgerReading | None
    try:
        api = engine.connect(timeout=5)
        daemon_info, detection = engine.daemon_view(api, ask=req.via is None)
        reading = ledger_read.read_ledger(api, cards, daemon_info)
    except Exception as err:
        if picks is None:
            raise DockerUnavailableError(
                f"--dry-run --count {req.count} places the count on free cards, but which cards are free is unknown: "
                f"the ledger was not read ({getattr(err, 'message', err)})",
                "start Docker or set DOCKER_HOST, or name the cards with --gpu",
            ) from None
        if req.via is None:
            detection = cdi.Detection(False, "the daemon was not asked")
            say(
                f"dry run: the daemon was not asked ({getattr(err, 'message', err)}); the nvidia driver's form is "
                "shown (--via cdi shows CDI's)"
            )
        reading = None
    if picks is None:
        assert reading is not None
        picks, why = _pick(req, cards, None, _busy(cards, None, reading))
        if picks is None:
            raise _held_error(why)
    else:
        _say_busy(req, cards, picks, reading)
    return ContainerSpec(req, picks, _via(req, picks, detection))


def _say_busy(
    req: RunRequest, cards: Sequence[Card], picks: Sequence[Target], reading: ledger_read.LedgerReading | None
) -> None:
    """A dry run of named cards still prints its line, and says what a real run would find on them now: the
    holders that would refuse it (75) or keep it waiting (the ledger's when it was read, NVML's processes always)."""
    for line in _conflicts(picks, ledger.blocking(_busy(cards, picks, reading), req.share)):
        then = "wait for it (--wait)" if req.wait is not None else "be refused (75)"
        say(f"dry run: {line}: a real run now would {then}")


def run(req: RunRequest) -> int:
    """The whole of `hostagent run`, returning its exit code (the container's, in the foreground)."""
    old_term = signal.signal(signal.SIGTERM, start.raise_interrupted)
    try:
        result = launch(req)
    except (start.Interrupted, KeyboardInterrupt) as err:
        return start.interrupted(err)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if isinstance(result, ContainerSpec):
        return 0
    return start.finish(result.cid, result.attachment)

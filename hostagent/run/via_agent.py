"""`hostagent run` through the resident agent: the agent books the cards and creates the container (`POST
/api/run`, gpupin.hostagent.serve.runs), this process attaches, starts and follows it, importing neither the docker
SDK nor NVML. The request is read here with the caller's rights, and the container's lease names this process.
Where no agent answers, or it hands the run back, `run` returns None and the run goes on without it (docs/run.md,
"Through the resident agent").
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket

from gpupin.core.errors import AgentUnavailableError, CardHeldError, GpupinError
from gpupin.hostagent import agentlink, engine, http1, mark, say
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.run import start
from gpupin.hostagent.run.attach import Follow

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.run.request import RunRequest

ROUTE = "/api/run"
ASK_S = 180.0  # the agent may wait for the ledger lock (up to 60 s) before it answers
EXPECT = {"Connection": "close", "Expect": "102-processing"}  # a 102 as soon as the agent has the request


def ask(link: agentlink.Link, body: JSONObject) -> JSONObject:
    """One POST /api/run: the agent's answer, its refusal raised with its exit code, or 69 when it stops
    answering (it died mid-request: what it made is this process's, and holds nothing once this process ends).
    An agent that does not take the request within agentlink.ANSWER_S (its 102), turns it away (503: its
    connections are full), or closes the connection before its 102, leaves the run to this process: it has made
    nothing for it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(agentlink.ANSWER_S)
    try:
        sock.connect(link.path)
    except OSError:  # gone since it was found (a restart while this run waited): nothing was asked of it
        sock.close()
        return {"direct": f"the agent at {link} is gone"}
    taken = []  # the agent's 102: the request is in, and the answer may wait for the ledger lock

    def interim(status: int) -> None:
        taken.append(status)
        sock.settimeout(ASK_S)

    try:
        answer = http1.exchange(sock, "POST", ROUTE, body, host="agent", headers=EXPECT, interim=interim)
        if answer.status == 503:  # its connections are full, or it cannot start a thread: nothing was made
            answer.close()
            return {"direct": f"the agent at {link} is too busy to take this run"}
        raw = answer.body()
    except TimeoutError:
        if not taken:
            return {"direct": f"the agent at {link} did not take this run within {agentlink.ANSWER_S:g} s"}
        raise AgentUnavailableError(
            f"the agent at {link} stopped answering (nothing within {ASK_S:g} s)",
            "see the agent's log (journalctl -u gpupin-hostagent); retry, or set "
            f"{agentlink.USE_ENV}=0 to go without it",
        ) from None
    except OSError as err:
        sock.close()
        if not taken:  # closed on before it took the request (no 102): it has made nothing for this run
            return {"direct": f"the agent at {link} closed the connection before it took this run"}
        raise AgentUnavailableError(
            f"the agent at {link} stopped answering ({getattr(err, 'strerror', None) or err})",
            "see the agent's log (journalctl -u gpupin-hostagent); retry, or set "
            f"{agentlink.USE_ENV}=0 to go without it",
        ) from None
    try:
        obj = json.loads(raw) if raw.strip() else None
    except ValueError:
        obj = None
    if answer.status == 404:  # an agent older than POST /api/run: the run is this process's own
        return {"direct": f"the agent at {link} does not serve POST {ROUTE}"}
    if answer.status >= 400:
        raise agentlink.error_from(answer.status, obj, str(link))
    if not isinstance(obj, dict) or not ("direct" in obj or isinstance(obj.get("id"), str)):
        raise AgentUnavailableError(
            f"the agent at {link} answered POST {ROUTE} with nonsense",
            f"see the agent's log; set {agentlink.USE_ENV}=0 to go without it",
        )
    return obj


def _start(answer: JSONObject, follow: Follow) -> tuple[str, Any]:
    """The agent's container, attached and started: its ID and the attachment to follow (None with -d)."""
    mark("created")
    for line in answer.get("say") or ():
        say(str(line))
    cid = str(answer["id"])
    return cid, start.start(engine.follower(str(answer["api"])), cid, follow, str(answer.get("via")))


def _pull(req: RunRequest) -> bool:
    """The image pulled as the run asks (--pull always, or missing), with the caller's own registry credentials
    and progress (gpupin.hostagent.run.image); the agent then makes the run, and its grant with it, from an image
    that is there (`--pull missing` from then on)."""
    from gpupin.hostagent.run import image

    api = engine.connect()
    try:
        image.ensure(api, req)
    finally:
        with contextlib.suppress(Exception):
            api.close()
    req.options["pull"] = "missing"
    return True


def run(req: RunRequest) -> int | None:
    """The run through the agent, to its exit code; None when no agent answers (the run is this process's own).
    An agent that answers that the run is the caller's own (another daemon, an image to pull...), or that has gone
    since, leaves it to gpupin.hostagent.run.launch, within the same --wait."""
    from gpupin.hostagent.run import request_json
    from gpupin.hostagent.run.waiting import WaitLoop

    link = agentlink.find()
    if link is None:
        return None
    pulled = req.pull == "always" and _pull(req)  # asked first: the agent would only hand it back
    body = {"daemon": agentlink.daemon_key(), "owner": str(lease.this_process()), "request": request_json.dump(req)}
    old_term = signal.signal(signal.SIGTERM, start.raise_interrupted)
    mark("asking")
    try:
        with WaitLoop(req) as wait_loop:
            while True:
                try:
                    answer = ask(link, body)
                    if answer.get("pull") is True and not pulled:  # the image is the caller's to pull, then ask again
                        pulled = _pull(req)
                        body["request"] = request_json.dump(req)
                        continue
                    break
                except GpupinError as err:  # the agent's refusal, with its exit code
                    if err.exit_code != CardHeldError.exit_code:
                        raise
                    wait_loop.refused(err)
            if "direct" in answer:  # this run's own to make, in the same --wait
                from gpupin.hostagent.run import launch

                launched = launch.launch(req, wait_loop)
                assert isinstance(launched, launch.Launched)
                cid, attachment = launched.cid, launched.attachment
                answer = {}
            wait_loop.close()  # booked: out of the queue before the start
        if answer:
            cid, attachment = _start(answer, Follow.of(req))
    except (start.Interrupted, KeyboardInterrupt) as err:
        return start.interrupted(err)  # a container the agent made meanwhile is this process's, as without it
    finally:
        signal.signal(signal.SIGTERM, old_term)
    return start.finish(cid, attachment)

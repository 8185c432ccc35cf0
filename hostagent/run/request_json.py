"""A `hostagent run` request as JSON, for the resident agent, which books the cards and creates the container for
its caller (gpupin.hostagent.serve.runs).

What the caller read travels as values, never as paths: its env files and environment (the variables), its current
folder (`-v ./data` made absolute), a seccomp profile (its text): the agent runs as root and opens nothing for a
caller. The options' conversions are the caller's (RunRequest.validate); the agent makes again only the checks that
read nothing (RunRequest.check). JSON, never pickle: the agent must not run what a caller sends.
"""

from __future__ import annotations

from gpupin.core.errors import UsageError
from gpupin.hostagent.run import options as runopts
from gpupin.hostagent.run.environment import EnvVar
from gpupin.hostagent.run.request import RunRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
_TUPLE = "__tuple__"  # JSON has no tuple; the SDK's payload types tell (host, port) bindings by it


def _tagged(value: Any) -> Any:
    if isinstance(value, tuple):
        return {_TUPLE: [_tagged(v) for v in value]}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _tagged(v) for k, v in value.items()}
    return value


def _untagged(value: Any) -> Any:
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE}:
            return tuple(_untagged(v) for v in value[_TUPLE])
        return {k: _untagged(v) for k, v in value.items()}
    return value


def dump(req: RunRequest) -> dict[str, Any]:
    """The request, as the caller parsed and read it."""
    return {
        "wire": VERSION,
        "image": req.image,
        "command": req.command,
        "gpus": req.gpus,
        "count": req.count,
        "share": req.share,
        "verify": req.verify,
        "via": req.via,
        "max_load": req.max_load,
        "max_memory": req.max_memory,
        "options": req.options,
        "env": [list(v) for v in req.user_env],
        "payload": _tagged(req.payload),
    }


def _bad(what: str) -> UsageError:
    return UsageError(f"the run request is malformed ({what})", "use a hostagent of the agent's version")


def load(obj: Any) -> RunRequest:
    """The RunRequest a caller sent (without --wait: the caller waits), checked again where that reads nothing."""
    if not isinstance(obj, dict) or obj.get("wire") != VERSION:
        raise _bad(f"wire version {obj.get('wire') if isinstance(obj, dict) else None!r}, not {VERSION}")
    options = obj.get("options")
    payload = obj.get("payload")
    env = obj.get("env")
    if not isinstance(options, dict) or set(options) - set(runopts.BY_DEST) or not isinstance(payload, dict):
        raise _bad("options")
    if not isinstance(env, list) or not all(isinstance(e, list) and len(e) == 4 and isinstance(e[0], str) for e in env):
        raise _bad("env")
    req = RunRequest.__new__(RunRequest)
    try:
        req.image = str(obj["image"])
        req.command = [str(a) for a in obj["command"]]
        req.gpus = [str(g) for g in obj["gpus"]]
        req.count = None if obj["count"] is None else int(obj["count"])
        req.share = bool(obj["share"])
        req.wait = None
        req.verify = obj["verify"]
        req.dry_run = False
        req.via = obj["via"]
        req.max_load = None if obj["max_load"] is None else float(obj["max_load"])
        req.max_memory = None if obj["max_memory"] is None else float(obj["max_memory"])
    except (KeyError, TypeError, ValueError) as err:
        raise _bad(f"{type(err).__name__}: {err}") from None
    req.options = {o.dest: options.get(o.dest, [] if o.kind == runopts.APPEND else None) for o in runopts.OPTIONS}
    req.check()
    req.user_env = [EnvVar(k, v, f, bool(p)) for k, v, f, p in env]
    req.payload = _untagged(payload)
    return req

"""A `hostagent run` request as JSON, for the resident agent (gpupin.hostagent.serve.runs): what the user asked,
never what to create, so that the agent builds the container through the same RunRequest and every refusal of a run
applies. What the caller read (its folder, its files, its environment) travels as values: the agent runs as root
and opens nothing for a caller. JSON, never pickle: the agent must not run what a caller sends.
"""

from __future__ import annotations

from gpupin.core.errors import UsageError, shorten
from gpupin.hostagent.run import options as runopts
from gpupin.hostagent.run import reads
from gpupin.hostagent.run.request import RunRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject

# 2: the options as typed, and what they read; no create payload (1 sent one, and the agent used it). 3: `for`.
VERSION = 3
_FIELDS = {"wire", "image", "command", "gpus", "count", "share", "verify", "via", "max_load", "max_memory", "for"}
_READS = {"options", "environ", "cwd", "files"}


def dump(req: RunRequest) -> JSONObject:
    """The request, as the caller parsed it, with what its options read."""
    given = {o.dest: req.options[o.dest] for o in runopts.OPTIONS if req.options[o.dest] not in (None, [])}
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
        "for": req.book_for,
        "options": given,
        "environ": {v.key: v.value for v in req.user_env if v.passed and v.value is not None},
        "cwd": req.reads.cwd or reads.workdir(),
        "files": {path: data.decode("utf-8", "surrogateescape") for path, data in req.reads.files.items()},
    }


def malformed(what: str) -> UsageError:
    return UsageError(f"the run request is malformed ({what})", "use a hostagent of the agent's version")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _duration(value: Any) -> bool:
    """--for's seconds: absent, or within what parse_duration gives (its bounds are the policy's rule)."""
    from gpupin.hostagent.policy import LONGEST_S

    return value is None or (_number(value) and 0 < value <= LONGEST_S)


def _option(dest: str, value: Any) -> bool:
    """Whether an option's value has the type the command line gives it (its text is checked by its conversion)."""
    kind = runopts.BY_DEST[dest].kind
    if kind == runopts.FLAG:
        return value is None or isinstance(value, bool)
    if kind == runopts.APPEND:
        return _strings(value)
    return value is None or isinstance(value, str)


def load(obj: Any) -> RunRequest:
    """The RunRequest a caller sent (without --wait: the caller waits), made again here from its options as a run
    without the agent makes it: every check and conversion of `hostagent run` (a refusal is its line and code)."""
    if not isinstance(obj, dict) or obj.get("wire") != VERSION:
        raise malformed(f"wire version {shorten(obj.get('wire')) if isinstance(obj, dict) else None}, not {VERSION}")
    extra = set(obj) - _FIELDS - _READS
    if extra:  # a create payload among them: the agent builds the container itself
        raise malformed(f"unknown field(s) {shorten(sorted(extra))}")
    options, environ, cwd, files = obj.get("options"), obj.get("environ"), obj.get("cwd"), obj.get("files")
    if not isinstance(options, dict) or not all(k in runopts.BY_DEST and _option(k, v) for k, v in options.items()):
        raise malformed("options")
    if not isinstance(environ, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        raise malformed("environ")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise malformed("cwd")
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise malformed("files")
    image, command, gpus, count = obj.get("image"), obj.get("command"), obj.get("gpus"), obj.get("count")
    verify, via = obj.get("verify"), obj.get("via")
    if (
        not isinstance(image, str)
        or not _strings(command)
        or not _strings(gpus)
        or not (count is None or (isinstance(count, int) and not isinstance(count, bool)))
        or not isinstance(obj.get("share"), bool)
        or not all(v is None or isinstance(v, str) for v in (verify, via))
        or not (_number(obj.get("max_load")) and _number(obj.get("max_memory")))
        or not _duration(obj.get("for"))
    ):
        raise malformed("fields")
    try:
        read = {k: v.encode("utf-8", "surrogateescape") for k, v in files.items()}
    except UnicodeEncodeError:
        raise malformed("files") from None
    given = reads.Reads(cwd, read, given=True)
    return RunRequest(
        image,
        obj["command"],
        gpus=obj["gpus"],
        count=count,
        share=obj["share"],
        verify=verify,
        via=via,
        environ=environ,
        max_load=obj.get("max_load"),
        max_memory=obj.get("max_memory"),
        book_for=obj.get("for"),
        reads=given,
        **options,
    )

"""The two commands, `hostagent compose render FILE [-o OUT]` and `hostagent compose check FILE [--json]`: thin
adapters from the command line to the rules, and where the cards (NVML), the ledger (Docker) and the output
file come from. `read_model` picks the model (hostagent's own reading, or compose v2's `config` for a project
of several parts) and `written_text` what render writes: the source edited in place, or one merged file
(docs/compose.md, "Projects").
"""

from __future__ import annotations

import json
import os
import re
import sys

from gpupin.core import files
from gpupin.core.errors import EX_UNAVAILABLE, EX_USAGE, GpupinError, UsageError
from gpupin.hostagent import say
from gpupin.hostagent.compose import booking, interpolate, load, native, roundtrip
from gpupin.hostagent.compose.problems import RenderRefused, ServiceError, printable
from gpupin.hostagent.compose.project import Project, ProjectOptions, build
from gpupin.hostagent.compose.render import NOT_ASKED, header, render, set_entries
from gpupin.hostagent.compose.rules import Examination, examine, top_level_lookalikes
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.policy import host_policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.swarm.cluster import Node
    from gpupin.hostagent.yamlfile import YAMLMapping


_COMPOSE_PROJECT = "com.docker.compose.project"
_COMPOSE_SERVICE = "com.docker.compose.service"


# --- the cards and the ledger, minus this project's own containers --------------------------------------------


def project_names(doc: Any, paths: Iterable[str], environ: Mapping[str, str]) -> set[str]:
    """The compose project names this file may run under (COMPOSE_PROJECT_NAME, `name:`, its directory)."""
    names: set[str] = set()
    if environ.get("COMPOSE_PROJECT_NAME"):
        names.add(environ["COMPOSE_PROJECT_NAME"])
    if isinstance(doc, dict) and isinstance(doc.get("name"), str):
        names.add(doc["name"])
    for path in paths:
        base = os.path.basename(os.path.dirname(os.path.abspath(path)))
        names.add(re.sub(r"[^-_a-z0-9]", "", base.lower()))
    return {n for n in names if n}


def own_container_ids(summaries: Iterable[Mapping[str, Any]], projects: set[str], names: set[str]) -> set[str]:
    """Containers of this very project and its services: re-rendering or checking a running project is not
    a conflict with itself."""
    out: set[str] = set()
    for s in summaries:
        labels = s.get("Labels") or {}
        if labels.get(_COMPOSE_PROJECT) in projects and labels.get(_COMPOSE_SERVICE) in names:
            out.add(str(s["Id"]))
    return out


class Daemon:
    """What the daemon says for a render or a check: the ledger (card UUID -> running holders, without this
    project's own containers, and the processes that no grant explains: gpupin.hostagent.ledger.processes), whether it
    serves the cards by CDI (gpupin.hostagent.engine.cdi), and why the ledger is unknown (None: it was read)."""

    def __init__(
        self,
        busy: dict[str, list[Holder]],
        detection: cdi.Detection,
        unknown: str | None = None,
        podman: str | None = None,
    ) -> None:
        self.busy = busy
        self.detection = detection
        self.unknown = unknown
        self.podman = podman  # the podman version of a daemon that is podman, None for Docker


def read_daemon(cards: Sequence[Card], projects: set[str], service_names: set[str], cdi_too: bool = True) -> Daemon:
    """The ledger, and (`cdi_too`) what the daemon serves by CDI; when Docker cannot be reached, say so: the
    ledger is unknown (a count is then not placed: unknown is not free), and the nvidia driver pins the cards."""
    from gpupin.hostagent import engine
    from gpupin.hostagent.engine import podman
    from gpupin.hostagent.ledger import holders as ledger
    from gpupin.hostagent.ledger import processes
    from gpupin.hostagent.ledger import read as ledger_read

    try:
        api = engine.connect(timeout=10)
        daemon_info, detection = engine.daemon_view(api, ask=cdi_too)
        reading = ledger_read.read_ledger(api, cards, daemon_info)
        own = own_container_ids(api.containers(all=True, filters={"label": _COMPOSE_PROJECT}), projects, service_names)
    except Exception as err:
        why = f"Docker at {engine.docker_host()}: {getattr(err, 'message', err)}"
        say(
            f"warning: the ledger was not read ({why}): which cards running containers hold is unknown, and not "
            "checked" + ("; the nvidia driver pins the cards (--via cdi to pin through CDI)" if cdi_too else "")
        )
        return Daemon(
            processes.blocking(cards, processes.attribute(cards, None, None)),
            NOT_ASKED,
            f"the ledger was not read ({why})",
        )
    busy = ledger.held(h for h in reading.holders if h.id not in own)
    for key, hs in processes.blocking(
        cards, processes.attribute(cards, reading.holders, reading.names, reading.places)
    ).items():
        busy.setdefault(key, []).extend(hs)
    return Daemon(busy, detection, podman=podman.version(api))


def _host(doc: Any, paths: Sequence[str], cdi_too: bool) -> tuple[list[Card], Daemon]:
    from gpupin.core import nvml, readings

    cards = nvml.list_cards(detail=True, mig=True, tolerate_lost=True)
    readings.assess(cards)  # counts never take an unhealthy card; a named one is refused (gpupin.hostagent.gpus)
    svcs = doc.get("services") if isinstance(doc, dict) else None
    names = {str(k) for k in svcs} if isinstance(svcs, dict) else set()
    return cards, read_daemon(cards, project_names(doc, paths, os.environ), names, cdi_too)


# --- the output file ------------------------------------------------------------------------------------------


def output_path(output: str | None, source: str) -> str | None:
    """Where `-o` writes, None for stdout; UsageError (64) for a target it cannot or must not write, before
    anything else is done. A link is never followed (gpupin.core.files.write_atomic says why)."""
    if output is None or output == "-":
        return None
    quoted = printable(output)
    if not output:
        raise UsageError("-o '' names no file", "give a file name, or leave -o out to write to stdout")
    if "\0" in output:
        raise UsageError(f"-o {quoted}: the path holds a NUL character", "give a file name")
    if os.path.isdir(output):
        raise UsageError(
            f"-o {quoted} is a directory", f"name the file to write, e.g. -o {quoted.rstrip('/')}/pinned.yml"
        )
    if (os.path.exists(source) and os.path.exists(output) and os.path.samefile(source, output)) or os.path.abspath(
        output
    ) == os.path.abspath(source):
        raise UsageError(
            f"-o {quoted} is the file being rendered: the rendered file replaces each request "
            "(x-gpupin, an index, a count) with the cards picked today, so the source is kept",
            "write it beside the source, e.g. -o NAME.pinned.yml",
        )
    if os.path.islink(output):
        raise UsageError(
            f"-o {quoted} is a symbolic link, which is not followed for an output (another user may have planted it)",
            "name the file the link points to",
        )
    if os.path.exists(output) and not os.path.isfile(output):  # a device: written in place, as `>` does
        if not os.access(output, os.W_OK):
            raise UsageError(f"-o {quoted} is not writable by this user", "write elsewhere")
        return output
    directory = os.path.dirname(output) or "."
    if not os.path.isdir(directory):
        raise UsageError(
            f"-o {quoted}: the directory {printable(directory)} does not exist", "create it first, or write elsewhere"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(
            f"-o {quoted}: the directory {printable(directory)} is not writable by this user", "write elsewhere"
        )
    return output


def write_output(path: str, text: str, quoted: str, protected: Iterable[str] = ()) -> None:
    """All or nothing, never through a link, never over a file the project reads (`protected`): a temporary file
    in the target's directory, renamed over it (gpupin.core.files.write_atomic; the mode of a file it replaces is
    kept; a new one gets 0666 less the umask, as the shell's `>` gives). A file that carries the agent's grants is
    its user's alone (0600 at most): a grant admits whoever presents it first, for any name."""
    from gpupin.hostagent.authz.grant import LABEL

    try:
        files.write_atomic(path, text.encode("utf-8"), protected, private=f"{LABEL}:" in text or f"{LABEL}=" in text)
    except files.FileRefused as err:
        raise UsageError(f"-o {quoted}: {err.reason}", err.hint) from None


def _stdout(text: str) -> None:
    """The rendered file is UTF-8 whatever the locale says (it is a compose file, not a message)."""
    out = getattr(sys.stdout, "buffer", None)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        sys.stdout.flush()
        out.write(text.encode("utf-8"))
        out.flush()
    except BrokenPipeError:  # `render FILE | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# --- the commands ---------------------------------------------------------------------------------------------


def _relative(path: Any) -> bool:
    return isinstance(path, str) and bool(path) and not path.startswith(("/", "~"))


def relative_paths(doc: Any) -> list[str]:
    """Where the document names a path that compose resolves against the file's own folder: build contexts,
    env_file, bind-mount sources, extends.file, include, and the files of configs and secrets."""
    found: list[str] = []
    if not isinstance(doc, dict):
        return found
    for name, svc in (doc.get("services") or {}).items() if isinstance(doc.get("services"), dict) else ():
        if not isinstance(svc, dict):
            continue
        build = svc.get("build")
        context = build.get("context", ".") if isinstance(build, dict) else build
        if build is not None and _relative(context) and "://" not in str(context):
            found.append(f"{name}'s build")
        env_file = svc.get("env_file")
        for entry in env_file if isinstance(env_file, list) else [env_file]:
            if _relative(entry.get("path") if isinstance(entry, dict) else entry):
                found.append(f"{name}'s env_file")
                break
        for volume in svc.get("volumes") or () if isinstance(svc.get("volumes"), list) else ():
            source = volume.get("source") if isinstance(volume, dict) else str(volume).partition(":")[0]
            if isinstance(source, str) and (
                source in (".", "..")
                or source.startswith(("./", "../"))
                or (isinstance(volume, dict) and volume.get("type") == "bind" and _relative(source))
            ):
                found.append(f"{name}'s volumes")
                break
        extends = svc.get("extends")
        if isinstance(extends, dict) and _relative(extends.get("file")):
            found.append(f"{name}'s extends")
    for top in ("configs", "secrets"):
        for key, item in (doc.get(top) or {}).items() if isinstance(doc.get(top), dict) else ():
            if isinstance(item, dict) and _relative(item.get("file")):
                found.append(f"{top}.{key}")
    if doc.get("include"):
        found.append("include")
    return found


def _emit(
    text: str,
    file: str,
    output: str | None,
    target: str | None,
    relative: Sequence[str] = (),
    protected: Sequence[str] = (),
) -> int:
    """The rendered file to stdout or, all at once, to `target` (what output_path made of `-o`; never one of
    `protected`, the files the project read); a note when the file lands in another folder than its source and
    names paths that compose resolves against its folder."""
    if target is None:
        _stdout(text)
        return 0
    assert output is not None
    write_output(target, text, printable(output), protected)
    if relative and os.path.dirname(target) != os.path.dirname(os.path.realpath(file)) and os.path.isfile(target):
        say(
            f"note: {', '.join(relative)}: relative paths, which compose resolves against {printable(output)}'s "
            "directory; write it beside the source, or run compose with --project-directory"
        )
    return 0


def _rendered(options: ProjectOptions, output: str | None, make: Callable[[Project], tuple[str, Any]]) -> int:
    """Read the project, `make` the header and the rendered model of it (a RenderRefused names every problem), and
    write it out (written_text): the steps `render` and `render --swarm` share, each problem one
    line with the project's name."""
    name = "+".join(printable(f) for f in options.files) or "compose"
    try:
        targets = [output_path(output, f) for f in options.files] or [output_path(output, "")]
        project = read_model(options)
        name = project_name(project)
        if not options.files:
            targets = [output_path(output, f) for f in project.files]
        refused = booking.problems(project.doc, host_policy(say))  # a booking no run could have: before the host
        if refused:
            raise RenderRefused(refused)
        top, rendered = make(project)
        text = written_text(project, top, rendered)
        read_back(project, text, rendered)
    except ServiceError as err:
        say(f"ERROR: {err.problem().line(name)}")
        return err.exit_code
    except RenderRefused as refused:
        for p in refused.problems:
            say(f"ERROR: {p.line(name)}")
        return refused.exit_code
    return _emit(text, project.files[0], output, targets[0], relative_paths(project.doc), project.read_files)


def render_command(options: ProjectOptions, output: str | None, via: str | None = None) -> int:
    """`hostagent compose render [FILE] [-f FILE...] [-o OUT] [--via cdi|nvidia]`: 0 and the pinned file; 64/75/69
    with one line per problem."""

    def make(project: Project) -> tuple[str, Any]:
        doc = project.doc
        cards, daemon = _host(doc, project.files + ([output] if output else []), cdi_too=via is None)
        rendered, exam = render(
            doc, cards, daemon.busy, daemon.detection, via, daemon.unknown, project.file_env, daemon.podman
        )
        granted(rendered, exam)
        for p in top_level_lookalikes(doc):  # render says no other warning; this one may explain a missing card
            say(p.line(project_name(project)))
        if not exam.requests:
            say(f"note: {project_name(project)}: no service asks for GPUs; the file is written unchanged")
        return header(project.files[0], exam), rendered

    return _rendered(options, output, make)


def granted(rendered: Any, exam: Any) -> None:
    """The agent's grant on each service that takes cards, where the host's authorization plugin asks for one
    (docs/authz.md, Grants): asked of the agent when one answers; none is needed, or none can be had, otherwise
    (`docker compose up` then says so through the plugin)."""
    from gpupin.hostagent import agentlink
    from gpupin.hostagent.authz.grant import LABEL
    from gpupin.hostagent.compose.service import label_entries
    from gpupin.hostagent.ledger.booking import FOR_LABEL

    if not exam.requests:
        return
    link = agentlink.find()
    if link is None:
        return
    asked = [[t.uuid for t in exam.plan[req.service]] for req in exam.requests]
    answer = link.call("POST", "/api/grant", {"cards": asked})
    grants = answer.get("grants") if isinstance(answer, dict) else None
    if not isinstance(grants, list):
        return
    book_s = answer.get("booking_s")  # the policy's default booking for the caller, where a service asks none
    for req, value in zip(exam.requests, grants):
        svc = rendered["services"][req.service]
        set_entries(svc, "labels", {LABEL: str(value)})
        if isinstance(book_s, (int, float)) and FOR_LABEL not in label_entries(svc, req.service):
            set_entries(svc, "labels", {FOR_LABEL: f"{max(1, round(book_s))}s"})
    minutes = int(answer.get("expires_in_s") or 0) // 60
    say(f"note: the agent's grants are in the file: `docker compose up` within {minutes} minutes (then render again)")


def stack_granted(rendered: Any, exam: Any) -> None:
    """The agent's grant on each service of a stack that reserves GPUs, in its deploy.labels (the service's own
    labels, which the plugin reads at the service's create and update), where the plugin asks for one: bound to
    the service's key and its reservation, not to cards (Swarm picks them; docs/authz.md, Swarm)."""
    from gpupin.hostagent.authz.grant import LABEL
    from gpupin.hostagent.authz.request import gpu_kind

    reserving = [s for s in exam.reserving if gpu_kind(s.reservation.kind)]
    if not reserving:
        return
    asked = [
        {
            "service": s.service,
            "kinds": {s.reservation.kind: s.reservation.count},
            "tasks": "global" if s.global_mode else s.replicas,
        }
        for s in reserving
    ]
    got = _agent_grants({"services": asked})
    if got is None:
        return
    for s, value in zip(reserving, got[0]):
        set_entries(rendered["services"][s.service]["deploy"], "labels", {LABEL: value})
    say(f"note: the agent's grants are in the file: `docker stack deploy` within {got[1]} minutes (then render again)")


def _agent_grants(asked: Mapping[str, Any]) -> tuple[list[str], int] | None:
    """The grants the agent gives for `asked` (POST /api/grant) and the minutes they last; None: no agent answers,
    or its policy asks for none."""
    from gpupin.hostagent import agentlink

    link = agentlink.find()
    if link is None:
        return None
    answer = link.call("POST", "/api/grant", dict(asked))
    grants = answer.get("grants") if isinstance(answer, dict) else None
    if not isinstance(grants, list):
        return None
    return [str(v) for v in grants], int(answer.get("expires_in_s") or 0) // 60


def read_nodes() -> list[Node] | None:
    """The swarm's nodes, from the manager DOCKER_HOST names; when they cannot be read, say so and return None
    (what Swarm can place is then not checked)."""
    from gpupin.hostagent import engine
    from gpupin.hostagent.swarm import cluster as swarm

    try:
        return swarm.read(engine.reader(timeout=10), tasks=False).nodes
    except Exception as err:
        if not (isinstance(err, GpupinError) or engine.is_daemon_failure(err)):
            raise
        say(
            f"warning: the swarm's nodes were not read ({getattr(err, 'message', err)}): whether Swarm can place "
            "each task is not checked"
        )
        return None


def stack_command(options: ProjectOptions, output: str | None, kind: str) -> int:
    """`hostagent compose render --swarm [--kind KIND] FILE [-o OUT]`: 0 and the stack; 64 with one line per
    problem."""
    from gpupin.hostagent.compose import stack
    from gpupin.hostagent.swarm.resources import check_kind

    check_kind(kind)

    def make(project: Project) -> tuple[str, Any]:
        name = project_name(project)
        rendered, exam = stack.render(project.doc, kind, read_nodes(), project.file_env)
        stack_granted(rendered, exam)
        for p in exam.warnings:
            say(p.line(name))
        for note in exam.notes:
            say(f"note: {name}: {note}")
        if not exam.reserving:
            say(f"note: {name}: no service asks for GPUs")
        return stack.header(project.files[0], exam), rendered

    return _rendered(options, output, make)


def check_command(options: ProjectOptions, as_json: bool) -> int:
    """`hostagent compose check [FILE] [-f FILE...] [--json]`: 0 when clean (warnings allowed), 64 with one line
    per problem (69 when the only errors are what could not be read: the ledger for a count, a card NVML cannot
    read)."""
    name = "+".join(printable(f) for f in options.files) or "compose"
    try:
        project = read_model(options)
    except ServiceError as err:
        exam = Examination([err.problem()])
    else:
        name = project_name(project)
        cards, daemon = _host(project.doc, project.files, cdi_too=False)
        exam = examine(project.doc, cards, daemon.busy, daemon.unknown, project.file_env)
        exam.problems += booking.problems(project.doc, host_policy(say))
    if as_json:
        sys.stdout.write(json.dumps([p.to_dict() for p in exam.problems], indent=2) + "\n")
    else:
        for p in exam.problems:
            sys.stdout.write(p.line(name) + "\n")
        if exam.ok:
            sys.stdout.write(exam.summary() + "\n")
    if exam.ok:
        return 0
    # The ledger that could not be read (no daemon: a count is not placed) is 69, as render and `run --dry-run
    # --count` have it; any other error found is 64.
    errors = [p for p in exam.problems if p.is_error]
    return EX_UNAVAILABLE if errors and all(p.exit_code == EX_UNAVAILABLE for p in errors) else EX_USAGE


def read_model(options: ProjectOptions) -> Project:
    """The project and the model its commands read (compose v2's where it applies, see above)."""
    project = build(options)
    if project.editable is None:
        cmd = native.command()
        if cmd is not None:
            project.doc = native.config(
                cmd, ProjectOptions(project.files, options.project_directory, options.env_files, options.profiles)
            )
            project.by_compose = True
    return project


def read_back(project: Project, text: str, rendered: Any) -> None:
    """The text about to be written, read again as compose will read it, must be the model the rules checked and
    pinned: an edit of the source (hostagent.compose.roundtrip, another YAML library) or the dump of a merged model
    that reads back as anything else is refused, and nothing is written."""
    try:
        again = load.parse(text)
        again = interpolate.tree(again, project.variables) if project.editable else interpolate.unescaped(again)
    except ServiceError as err:
        again = err
    if again != rendered:
        raise ServiceError(
            None,
            "the rendered file does not read back as the model that was checked (the YAML of the source reads "
            "differently in the library that edits it); nothing was written",
            "quote the keys and values that YAML 1.1 and 1.2 read differently (`on`, `0o17`...), and drop a "
            "`%YAML 1.1` directive",
        )


def project_name(project: Project) -> str:
    """How messages name the project: its file, or its files joined with +."""
    return "+".join(printable(f) for f in project.files)


def written_text(project: Project, top: str, rendered: YAMLMapping) -> str:
    """The text render writes: `top` (the header), then the edited file or the merged model."""
    if project.editable is not None:
        source = roundtrip.without_header(project.texts[project.editable])
        return top + "\n" + roundtrip.edit(source, project.doc, rendered)  # the empty line ends the header
    if load.larger_than(rendered, load.MAX_BYTES):  # a merged file writes every alias out in full
        raise ServiceError(
            None,
            f"the merged model, with its YAML aliases written out, is larger than {load.MAX_BYTES >> 10} KiB, "
            "more than check reads back",
            "write the repeated values once (a merged file cannot keep aliases), or render one plain file",
        )
    how = "compose v2's `config`" if project.by_compose else "hostagent's reading of compose's rules"
    merged = [
        f"# Merged from {', '.join(printable(os.path.basename(f)) for f in project.files)} by {how}:",
        "# use it alone (-f THIS_FILE), without the source files or an override file.",
    ]
    return top + "\n".join(merged) + "\n\n" + load.dump(interpolate.escaped(rendered))

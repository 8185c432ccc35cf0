"""Files a hostile user names or plants, and root's hostagent reading or writing them (issue 24, "Files and
hosts"): no daemon, real other uids through setpriv.

- `compose render -o` never writes through a link (planted by uid 5001 in a sticky directory, the /tmp case), nor
  over a file the project reads (an `extends` base, an env file); a dangling link never makes root create a file.
- a service's `env_file:` is read by hostagent's own model as compose v2 reads it, so that a variable that picks
  devices is refused there as under `environment:`.
- errors never echo a file's content; malformed keys and paths are one line (64), never a traceback;
- a FIFO or a device named as a file is refused at once, never waited on.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.host import HOSTAGENT, simhost_env
from tests.support.host import hostagent as on_simhost
from tests.support.users import as_other, reach_env, setpriv

NO_DOCKER = "unix:///nonexistent/docker.sock"  # the ledger is not read: no daemon is touched


def hostagent(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return on_simhost(*args, timeout=timeout, **{"DOCKER_HOST": NO_DOCKER, **env})


HOSTILE = 5001  # a bare uid: no name, no group of interest
RUNTIME_ALL = (
    "services:\n  rogue:\n    image: i\n    runtime: nvidia\n{how}"
    "  pinned:\n    image: i\n    x-gpupin: {{gpus: ['1']}}\n"
)
PINNED = "services:\n  a:\n    image: i\n    x-gpupin: {gpus: ['1']}\n"


def as_hostile(*argv: str) -> None:
    """Run argv as uid/gid 5001, with no supplementary group."""
    subprocess.run(
        [*setpriv(HOSTILE), *argv],
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A /tmp-like directory: world-writable and sticky, owned by root."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv, to act as another uid")
    folder = Path(tempfile.mkdtemp(prefix="gpupin-sticky-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def one_error(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(lines) == 1 and " HINT: " in lines[0], r.stderr
    return lines[0]


# --- render -o ---------------------------------------------------------------------------------------------------


def test_render_never_writes_through_a_link_another_user_planted(sticky: Path, tmp_path: Path) -> None:
    src = tmp_path / "app.yml"
    src.write_text(PINNED)
    victim = tmp_path / "victim.conf"  # root's file, in a folder uid 5001 cannot even enter
    victim.write_text("root's own\n")
    as_hostile("ln", "-s", str(victim), str(sticky / "pinned.yml"))
    r = hostagent("compose", "render", str(src), "-o", str(sticky / "pinned.yml"))
    assert r.returncode == 64 and "is a symbolic link" in one_error(r), r
    assert victim.read_text() == "root's own\n" and (sticky / "pinned.yml").is_symlink()


def test_render_never_creates_the_file_a_dangling_link_names(sticky: Path, tmp_path: Path) -> None:
    src = tmp_path / "app.yml"
    src.write_text(PINNED)
    target = tmp_path / "created-by-root"
    as_hostile("ln", "-s", str(target), str(sticky / "pinned.yml"))
    r = hostagent("compose", "render", str(src), "-o", str(sticky / "pinned.yml"))
    assert r.returncode == 64 and "is a symbolic link" in one_error(r), r
    assert not target.exists()


def test_render_never_writes_through_a_linked_directory(sticky: Path, tmp_path: Path) -> None:
    src = tmp_path / "app.yml"
    src.write_text(PINNED)
    inner = tmp_path / "inner"
    inner.mkdir()
    as_hostile("ln", "-s", str(inner), str(sticky / "d"))
    r = hostagent("compose", "render", str(src), "-o", str(sticky / "d" / "pinned.yml"))
    assert r.returncode == 64 and "symbolic link" in one_error(r), r
    assert list(inner.iterdir()) == []


def test_render_into_a_sticky_directory_writes_a_file_of_its_own(sticky: Path, tmp_path: Path) -> None:
    src = tmp_path / "app.yml"
    src.write_text(PINNED)
    r = hostagent("compose", "render", str(src), "-o", str(sticky / "pinned.yml"))
    assert r.returncode == 0, r
    out = sticky / "pinned.yml"
    assert out.stat().st_uid == 0 and not out.is_symlink() and "GPUPIN_EXPECT" in out.read_text()
    assert sorted(p.name for p in sticky.iterdir()) == ["pinned.yml"]  # no temporary file left


@pytest.mark.parametrize("which", ["base.yml", "app.env", "dot/.env"])
def test_render_never_overwrites_a_file_the_project_reads(tmp_path: Path, which: str) -> None:
    (tmp_path / "base.yml").write_text("services:\n  base:\n    image: i\n")
    (tmp_path / "app.env").write_text("EPOCHS=3\n")
    (tmp_path / "dot").mkdir()
    (tmp_path / "dot" / ".env").write_text("TAG=1\n")
    src = tmp_path / "dot" / "app.yml"
    src.write_text(
        "services:\n  a:\n    extends: {file: ../base.yml, service: base}\n    env_file: ../app.env\n"
        "    x-gpupin: {gpus: ['1']}\n"
    )
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    r = hostagent("compose", "render", str(src), "-o", str(tmp_path / which), GPUPIN_COMPOSE="none")
    assert r.returncode == 64 and "a file this project reads" in one_error(r), r
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# --- env_file ----------------------------------------------------------------------------------------------------


def test_a_device_variable_in_an_env_file_is_refused_as_under_environment(tmp_path: Path) -> None:
    (tmp_path / "rogue.env").write_text("# the runtime reads it all the same\nNVIDIA_VISIBLE_DEVICES=all\n")
    by_env = tmp_path / "by-environment.yml"
    by_env.write_text(RUNTIME_ALL.format(how="    environment: [NVIDIA_VISIBLE_DEVICES=all]\n"))
    by_file = tmp_path / "by-env-file.yml"
    by_file.write_text(RUNTIME_ALL.format(how="    env_file: rogue.env\n"))
    listed = tmp_path / "listed.yml"
    listed.write_text(
        RUNTIME_ALL.format(how="    env_file: [{path: rogue.env, required: true}, {path: no.env, required: false}]\n")
    )
    verdicts = []
    for f in (by_env, by_file, listed):
        r = hostagent("compose", "check", str(f), GPUPIN_COMPOSE="none")
        verdicts.append((r.returncode, [ln.split(": ", 2)[1:] for ln in r.stdout.splitlines()]))
    assert verdicts[0][0] == 64 and "service rogue" in verdicts[0][1][0][0], verdicts
    assert verdicts[1] == verdicts[0] and verdicts[2] == verdicts[0], verdicts
    rendered = [hostagent("compose", "render", str(f), GPUPIN_COMPOSE="none") for f in (by_env, by_file)]
    assert [(r.returncode, r.stdout) for r in rendered] == [(64, "")] * 2, rendered
    assert rendered[1].stderr.replace(by_file.name, by_env.name) == rendered[0].stderr


def test_a_missing_env_file_is_one_line_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "app.yml"
    f.write_text("services:\n  a:\n    image: i\n    env_file: gone.env\n")
    r = hostagent("compose", "check", str(f), GPUPIN_COMPOSE="none")
    assert r.returncode == 64 and "service a" in r.stdout and "gone.env: cannot read it" in r.stdout, r


# --- errors and malformed keys -----------------------------------------------------------------------------------


def test_an_env_file_that_is_not_key_value_is_never_echoed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET-first-line of a root-only file\nmore\n")
    secret.chmod(0o600)
    sub = tmp_path / "sub.yml"
    sub.write_text("services:\n  b:\n    image: i\n")
    for how in (f"include: [{{path: sub.yml, env_file: {secret}}}]\n", ""):
        f = tmp_path / "app.yml"
        f.write_text(how + "services:\n  a:\n    image: i\n" + ("" if how else f"    env_file: {secret}\n"))
        for argv in (["compose", "check", str(f)], ["compose", "check", "--env-file", str(secret), str(f)]):
            r = hostagent(*argv, GPUPIN_COMPOSE="none")
            assert r.returncode == 64 and "line 1 is not KEY=VALUE" in r.stdout + r.stderr, r
            assert "TOPSECRET" not in r.stdout + r.stderr, r


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("include: 5\n", "`include` is 5"),
        ("include: [{path: sub.yml, project_directory: 5}]\n", "project_directory is 5"),
        ("include: [{path: sub.yml, env_file: 5}]\n", "`include.env_file` is 5"),
        ('include: ["sub\\0.yml"]\n', "NUL"),
        ("", "`env_file` is 5"),
        ("", "NUL"),
    ],
)
def test_malformed_include_and_env_file_are_one_line(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "sub.yml").write_text("services:\n  b:\n    image: i\n")
    env = "    env_file: 5\n" if says == "`env_file` is 5" else '    env_file: "a\\0b"\n' if not text else ""
    f = tmp_path / "app.yml"
    f.write_text(text + "services:\n  a:\n    image: i\n" + env)
    for argv in (["compose", "check", str(f)], ["compose", "render", str(f)]):
        r = hostagent(*argv, GPUPIN_COMPOSE="none")
        assert r.returncode == 64 and "Traceback" not in r.stderr, r
        assert says in r.stdout + r.stderr, r


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    f = tmp_path / "app.yml"
    f.write_text(f"services:\n  a:\n    image: i\n    extends: {{file: {fifo}, service: b}}\n")
    for argv in (
        ["compose", "check", str(f)],
        ["compose", "check", "--env-file", str(fifo), str(tmp_path / "app.yml")],
        ["compose", "check", "--env-file", "/dev/zero", str(tmp_path / "app.yml")],
        ["compose", "check", str(fifo)],
    ):
        r = hostagent(*argv, GPUPIN_COMPOSE="none", timeout=20)
        assert r.returncode == 64 and "not a regular file" in r.stdout + r.stderr, r
    assert stat.S_ISFIFO(fifo.stat().st_mode)


# --- run's path reads, as a user who may not read them ---------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["-v", "/proc/1/root/dev:/x"], "-v /proc/1/root/dev:/x: the host path /proc/1/root cannot be read"),
        (["--mount", "type=bind,source=/proc/1/root/dev,target=/x"], "the host path /proc/1/root cannot be read"),
        (["--device", "/proc/1/root/dev"], "--device /proc/1/root/dev: the host path /proc/1/root cannot be read"),
        (["--env-file", "/dev/zero"], "--env-file /dev/zero: it is a character device, not a regular file"),
        (["--env-file", "/proc/1/environ"], "--env-file /proc/1/environ: cannot read it: Permission denied"),
        (["--security-opt", "seccomp=/dev/zero"], "it is a character device, not a regular file"),
        (["--security-opt", "seccomp=/proc/1/root/etc/hostname"], "cannot read it: Permission denied"),
    ],
)
def test_run_refuses_a_path_this_user_cannot_read_naming_it(
    fakegpu: Path, sticky: Path, option: list[str], says: str
) -> None:
    r = subprocess.run(
        as_other(setpriv(HOSTILE), [HOSTAGENT, "run", "--dry-run", "--gpu", "0", *option, "img", "true"]),
        env=reach_env(simhost_env(DOCKER_HOST=NO_DOCKER)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 64 and says in one_error(r), r


# --- what render writes: bounded, and read back as what was checked ------------------------------------------


def test_a_merged_render_never_writes_out_an_alias_bomb(tmp_path: Path) -> None:
    levels = ["x-a: &a [aa,aa,aa,aa,aa,aa,aa,aa,aa,aa]"]
    for prev, name in zip("abcde", "bcdef"):
        levels.append(f"x-{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    src = tmp_path / "app.yml"
    src.write_text("\n".join(levels) + "\nservices:\n  s:\n    image: i\n    x-gpupin: {gpus: ['1']}\n    x-m: *e\n")
    (tmp_path / "over.yml").write_text("services:\n  s:\n    environment: [A=1]\n")
    assert len(src.read_bytes()) < 400  # a million scalars once its aliases are written out
    out = tmp_path / "pinned.yml"
    started = time.monotonic()
    r = hostagent(
        "compose", "render", "-f", str(src), "-f", str(tmp_path / "over.yml"), "-o", str(out), GPUPIN_COMPOSE="none"
    )
    assert r.returncode == 64 and "larger than 1024 KiB" in one_error(r), r
    assert not out.exists() and time.monotonic() - started < 60


@pytest.mark.parametrize("key", ["on", "yes", "off"])
def test_a_key_yaml_1_1_reads_otherwise_is_one_line(tmp_path: Path, key: str) -> None:
    src = tmp_path / "app.yml"
    src.write_text(f"%YAML 1.1\n---\nservices:\n  {key}:\n    image: i\n    x-gpupin: {{gpus: ['1']}}\n")
    r = hostagent("compose", "render", str(src), "-o", str(tmp_path / "pinned.yml"))
    assert r.returncode == 64 and f"the key '{key}' reads differently" in one_error(r), r
    assert not (tmp_path / "pinned.yml").exists()


# --- paths this user cannot look through ------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["-v", "--mount", "--device"])
def test_a_link_in_a_folder_its_user_made_unsearchable_is_refused(sticky: Path, option: str) -> None:
    """A link to a GPU node in a folder its owner then made unsearchable: followed as that user, the path stops
    there and looks harmless, but the daemon, as root, follows it. What cannot be judged is refused (64), and the
    refusal comes before NVML or the daemon is asked."""
    node = sticky / "card"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    hidden = sticky / "hidden"
    hidden.mkdir()
    (hidden / "link").symlink_to(node)
    os.lchown(hidden / "link", HOSTILE, HOSTILE)
    os.chown(hidden, HOSTILE, HOSTILE)
    hidden.chmod(0)
    path = str(hidden / "link")
    value = f"type=bind,src={path},dst=/x" if option == "--mount" else f"{path}:/x"
    r = subprocess.run(
        as_other(setpriv(HOSTILE), [HOSTAGENT, "run", "--uuid", "GPU-x", option, value, "img", "true"]),
        env=reach_env(simhost_env(DOCKER_HOST=NO_DOCKER)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert r.returncode == 64, r.stderr
    assert f"the host path {path} cannot be read by this user (Permission denied)" in one_error(r)

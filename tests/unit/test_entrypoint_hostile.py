"""gpupin-entrypoint against hostile, odd and concurrent input: the workload's own modules on its paths, bad
values in every variable and option it reads, signals while it verifies, and generated input of every kind.

The promise under test: a refusal is one line and a documented exit code (64 bad usage, 69 no usable GPU, 78
misaligned, 126/127 CMD cannot run, 128+N stopped by a signal), the workload never starts on a refusal, and there
is never a traceback unless the entrypoint's own --debug asked for one. Here on the simulated host;
the tests that take `ep`, `on_mig` or `on_shared_prefix` run again in a container on each engine
(tests/docker/test_entrypoint_hostile.py), as the contract's do.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.entrypoint import STARTED, Entrypoint, device, hung_driver, one_error_line, only_error_line, plant
from tests.support.host import ENTRYPOINT, children_of, simhost_env
from tests.support.hypo import examples
from tests.support.scenarios import mig_devices, topology, uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")
DOCUMENTED = {0, 64, 69, 78, 126, 127}


# --- the entrypoint's own imports never come from the workload's paths ----------------------------------------


def mounted(ep: Entrypoint, host_dir: Path, inside: str) -> tuple[str, tuple[str, ...]]:
    """The directory as the entrypoint sees it, and the `docker run` options that put it there."""
    host_dir.chmod(0o755)
    if ep.mode == "host":
        return str(host_dir), ()
    return inside, ("-v", f"{host_dir}:{inside}:ro")


# What the workload prints: its PYTHONPATH as it got it, and where *its* Python finds pynvml (without importing it).
SHOW_WORKLOAD = [
    "sh",
    "-c",
    'echo "PYTHONPATH=$PYTHONPATH"; {py} -c "import importlib.util as u; print(u.find_spec(\'pynvml\').origin)"',
]


def test_hostile_modules_on_pythonpath_are_not_imported_and_the_workload_keeps_its_path(
    ep: Entrypoint, tmp_path: Path
) -> None:
    path, opts = mounted(ep, plant(tmp_path / "pp", ep.mode == "container"), "/hostile")
    r = ep.run(
        "--json",
        "--verify",
        "cuda",
        *SHOW_WORKLOAD,
        env={"GPUPIN_EXPECT": RTX, "PYTHONPATH": path},
        gpus=device(RTX),
        docker_args=opts,
    )
    assert r.rc == 0, r
    assert "HOSTILE" not in r.err, r.err
    assert json.loads(r.err)["devices"][0]["uuid"] == RTX
    assert r.out.splitlines() == [f"PYTHONPATH={path}", f"{path}/pynvml.py"]


def test_hostile_traceback_module_does_not_hide_the_debug_traceback(ep: Entrypoint, tmp_path: Path) -> None:
    path, opts = mounted(ep, plant(tmp_path / "pp", ep.mode == "container"), "/hostile")
    r = ep.run("--debug", *STARTED, env={"GPUPIN_EXPECT": "GPU-nothex", "PYTHONPATH": path}, docker_args=opts)
    assert r.rc == 64, r
    assert "HOSTILE" not in r.err and "Traceback (most recent call last)" in r.err
    assert "GPU-nothex" in one_error_line(r.err)


@pytest.mark.parametrize("pythonpath", [None, ".", ":/nonexistent"])
def test_hostile_modules_in_the_working_directory_are_not_imported(
    ep: Entrypoint, tmp_path: Path, pythonpath: str | None
) -> None:
    # "." and an empty element of PYTHONPATH both put the working directory on sys.path.
    path, opts = mounted(ep, plant(tmp_path / "work", ep.mode == "container"), "/work")
    env = {"GPUPIN_EXPECT": RTX} if pythonpath is None else {"GPUPIN_EXPECT": RTX, "PYTHONPATH": pythonpath}
    r = ep.run(
        "--verify",
        "cuda",
        "sh",
        "-c",
        "pwd",
        env=env,
        gpus=device(RTX),
        docker_args=(*opts, "-w", path),
        cwd=tmp_path / "work",
    )
    assert r.rc == 0, r
    assert "HOSTILE" not in r.err and f"cuda:0  {RTX}" in r.err, r.err
    assert r.out.strip() == path


def test_a_sitecustomize_that_loaded_a_hostile_module_first_does_not_leak_into_the_entrypoint(
    ep: Entrypoint, tmp_path: Path
) -> None:
    # Python runs a sitecustomize.py on PYTHONPATH at start-up, before any gpupin code: the json it loads from
    # there cannot be prevented, but the entrypoint forgets it and imports the standard library's.
    pp = tmp_path / "pp"
    pp.mkdir()
    (pp / "json.py").write_text("def dumps(*args, **kwargs):\n    return 'HOSTILE-JSON'\n")
    (pp / "sitecustomize.py").write_text("import json\n")
    path, opts = mounted(ep, pp, "/hostile")
    r = ep.run("--json", env={"GPUPIN_EXPECT": RTX, "PYTHONPATH": path}, gpus=device(RTX), docker_args=opts)
    assert r.rc == 0, r
    assert json.loads(r.out)["devices"][0]["uuid"] == RTX


def test_isolate_keeps_the_installation_and_drops_only_the_workloads_entries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import site

    from gpupin.entrypoint import isolation

    stdlib = os.path.dirname(os.__file__)
    installed = site.getsitepackages()[0]
    gpupin_root = str(Path(isolation.__file__).resolve().parents[2])  # where gpupin itself was found
    work, pp = tmp_path / "work", tmp_path / "pp"
    work.mkdir()
    pp.mkdir()
    (pp / "hostile_mod.py").write_text("")
    monkeypatch.chdir(work)
    # PYTHONPATH naming the standard library or gpupin's own place (pip install --target DIR) keeps them.
    monkeypatch.setattr(
        sys,
        "path",
        [str(work), str(pp), stdlib, os.path.join(stdlib, "lib-dynload"), installed, gpupin_root, "relative", ""],
    )
    hostile = type(sys)("hostile_mod")
    hostile.__file__ = str(pp / "hostile_mod.py")
    monkeypatch.setattr(sys, "modules", {**sys.modules, "hostile_mod": hostile})  # a copy: isolate() edits it
    dropped = isolation.isolate({"PYTHONPATH": f"{pp}:{stdlib}:{gpupin_root}:relative"})
    assert dropped == [str(work), str(pp), "relative", ""]
    assert sys.path == [stdlib, os.path.join(stdlib, "lib-dynload"), installed, gpupin_root]
    assert "hostile_mod" not in sys.modules and "json" in sys.modules and "gpupin.entrypoint.isolation" in sys.modules
    assert isolation.isolate({}) == []  # nothing left to drop


# --- bad values: one line, the documented code, nothing started -----------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "1e999", "-1", "0", "abc", "90000", "12 s"])
def test_an_odd_probe_timeout_is_refused_with_64(ep: Entrypoint, value: str) -> None:
    r = ep.run(*STARTED, env={"GPUPIN_EXPECT": RTX, "GPUPIN_PROBE_TIMEOUT": value}, gpus=device(RTX))
    assert r.rc == 64, r
    assert "WORKLOAD-STARTED" not in r.out
    assert f"GPUPIN_PROBE_TIMEOUT={value!r}" in only_error_line(r.err)


@pytest.mark.parametrize("value", ["", " 30 ", "0.5", "1e3"])
def test_a_sound_probe_timeout_is_accepted(ep: Entrypoint, value: str) -> None:
    r = ep.run("--quiet", *STARTED, env={"GPUPIN_EXPECT": RTX, "GPUPIN_PROBE_TIMEOUT": value}, gpus=device(RTX))
    assert (r.rc, r.out.strip(), r.err) == (0, "WORKLOAD-STARTED", ""), r


def test_a_hung_driver_is_given_up_after_the_probe_timeout_with_69(fakegpu: Path, tmp_path: Path) -> None:
    env = simhost_env(
        "mixed-4", GPUPIN_EXPECT=RTX, GPUPIN_PROBE_TIMEOUT="0.5", FAKEGPU_TOPOLOGY=str(hung_driver(tmp_path))
    )
    t0 = time.monotonic()
    p = subprocess.run([ENTRYPOINT, *STARTED], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 69, p
    assert time.monotonic() - t0 < 10
    assert "did not answer within 0.5 s" in only_error_line(p.stderr) and "WORKLOAD-STARTED" not in p.stdout


def test_an_empty_command_is_127_before_anything_is_verified(ep: Entrypoint) -> None:
    # GPUPIN_EXPECT names an absent card: were it verified first, this would be 78.
    r = ep.run("", env={"GPUPIN_EXPECT": "GPU-00000000-1111-2222-3333-444444444444"})
    assert r.rc == 127, r
    assert "the command name is empty" in only_error_line(r.err)
    r = ep.run("--", "", "arg", env={"GPUPIN_EXPECT": RTX}, gpus=device(RTX))
    assert r.rc == 127 and "empty" in only_error_line(r.err), r


def test_nvidia_visible_devices_naming_a_card_twice_is_64_with_a_hint_about_gpupin_expect(ep: Entrypoint) -> None:
    # Container mode: docker passes the --gpus list on as NVIDIA_VISIBLE_DEVICES as written.
    env = {} if ep.mode == "container" else {"NVIDIA_VISIBLE_DEVICES": f"{RTX},{RTX}"}
    r = ep.run(*STARTED, env=env, gpus=device(RTX, RTX))
    assert r.rc == 64, r
    line = only_error_line(r.err)
    assert f"NVIDIA_VISIBLE_DEVICES={f'{RTX},{RTX}'!r}: {RTX} is listed twice" in line
    assert "HINT: NVIDIA_VISIBLE_DEVICES should list GPU UUIDs, each card once" in line and "GPUPIN_EXPECT" in line


def test_the_workloads_own_debug_and_options_are_not_the_entrypoints(ep: Entrypoint) -> None:
    r = ep.run("sh", "-c", "echo WORKLOAD-STARTED", "--debug", "--verify", "bogus", env={"GPUPIN_EXPECT": "GPU-nothex"})
    assert r.rc == 64, r
    assert "GPU-nothex" in only_error_line(r.err)  # no traceback: --debug was the workload's
    r = ep.run("--debug", "sh", "-c", "true", env={"GPUPIN_EXPECT": "GPU-nothex"})
    assert r.rc == 64 and "Traceback" in r.err and "GPU-nothex" in one_error_line(r.err), r
    # --debug before a bad option still counts; after it parsing stopped, so it does not.
    r = ep.run("--debug", "--bogus", "true")
    assert r.rc == 64 and "Traceback" in r.err, r
    r = ep.run("--bogus", "--debug", "true")
    assert r.rc == 64 and "--bogus" in only_error_line(r.err), r


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("GPUPIN_VERIFY", "fast"),
        ("GPUPIN_VERIFY", "nvml,cuda"),
        ("GPUPIN_REQUIRE", "maybe"),
        ("GPUPIN_QUIET", "2"),
        ("GPUPIN_QUIET", "y e s"),
    ],
)
def test_odd_gpupin_variables_are_refused_with_64_naming_the_variable(ep: Entrypoint, var: str, value: str) -> None:
    r = ep.run(*STARTED, env={"GPUPIN_EXPECT": RTX, var: value}, gpus=device(RTX))
    assert r.rc == 64, r
    line = only_error_line(r.err)
    assert repr(value) in line and f"HINT: set {var}" in line and "WORKLOAD-STARTED" not in r.out


@pytest.mark.parametrize(
    ("var", "value", "quiet"),
    [
        ("GPUPIN_VERIFY", " NVML ", False),
        ("GPUPIN_VERIFY", "", False),
        ("GPUPIN_QUIET", "Yes", True),
        ("GPUPIN_QUIET", "off", False),
        ("GPUPIN_QUIET", "", False),
        ("GPUPIN_REQUIRE", "FALSE", False),
    ],
)
def test_gpupin_variables_read_any_case_and_spacing(ep: Entrypoint, var: str, value: str, quiet: bool) -> None:
    r = ep.run(*STARTED, env={"GPUPIN_EXPECT": RTX, var: value}, gpus=device(RTX))
    assert (r.rc, r.out.strip()) == (0, "WORKLOAD-STARTED"), r
    assert (r.err == "") == quiet, r.err


def test_an_option_overrides_an_odd_variable_it_replaces(ep: Entrypoint) -> None:
    r = ep.run(
        "--verify",
        "nvml",
        "--quiet",
        *STARTED,
        env={"GPUPIN_EXPECT": RTX, "GPUPIN_VERIFY": "bogus", "GPUPIN_QUIET": "bogus"},
        gpus=device(RTX),
    )
    assert (r.rc, r.out.strip(), r.err) == (0, "WORKLOAD-STARTED", ""), r


def test_non_utf8_bytes_in_the_environment_and_argv(fakegpu: Path) -> None:
    env = {k.encode(): v.encode() for k, v in simhost_env("mixed-4").items()}
    env[b"GPUPIN_EXPECT"] = b"GPU-\xff\xfe"
    p = subprocess.run([ENTRYPOINT.encode(), b"true"], env=env, capture_output=True, timeout=60)
    assert p.returncode == 64, p
    line = only_error_line(p.stderr.decode("utf-8", "surrogateescape"))
    assert "GPUPIN_EXPECT" in line and "\\udcff" in line  # the bad bytes are shown escaped, on the one line
    env[b"GPUPIN_EXPECT"] = RTX.encode()
    env[b"ODD"] = b"\xff\x00"[:1]
    p = subprocess.run(
        [ENTRYPOINT.encode(), b"--quiet", b"sh", b"-c", b'printf %s "$ODD$1"', b"x", b"\xfe"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout, p.stderr) == (0, b"\xff\xfe", b""), p  # the workload gets its bytes untouched
    p = subprocess.run([ENTRYPOINT.encode(), b"--v\xe9rify", b"true"], env=env, capture_output=True, timeout=60)
    assert p.returncode == 64 and "unknown option" in only_error_line(p.stderr.decode(errors="replace")), p


def test_very_long_values_give_one_short_line(ep: Entrypoint) -> None:
    # 100 kB: under Linux's 128 kB limit for one string of the environment.
    for value in ("GPU-" + "a" * 100_000, f"{RTX}," * 2_700 + "x", "x" * 100_000):
        r = ep.run(*STARTED, env={"GPUPIN_EXPECT": value})
        assert r.rc in (64, 78), r.rc
        line = only_error_line(r.err)
        assert len(line) < 1000 and "characters)" in line, line[:2000]
    r = ep.run(
        "sh", "-c", 'echo "${#GPUPIN_LONG}"', env={"GPUPIN_EXPECT": RTX, "GPUPIN_LONG": "z" * 100_000}, gpus=device(RTX)
    )
    assert (r.rc, r.out.strip()) == (0, "100000"), r


# --- signals while the probe runs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT"), (signal.SIGHUP, "SIGHUP")]
)
def test_a_signal_during_the_probe_ends_the_entrypoint_and_its_probe(
    fakegpu: Path, tmp_path: Path, sig: int, name: str
) -> None:
    env = simhost_env("mixed-4", GPUPIN_EXPECT=RTX, FAKEGPU_TOPOLOGY=str(hung_driver(tmp_path)))
    # Its default disposition, as a shell gives it: a run under nohup ignores SIGHUP, which the entrypoint keeps.
    p = subprocess.Popen(
        [ENTRYPOINT, *STARTED],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL),
    )
    try:
        probes = wait_for(lambda: children_of(p.pid) if p.poll() is None else [], 30, "the CUDA probe to start")
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    assert time.monotonic() - t0 < 5
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert f"stopped by {name} while verifying the GPU pin; the workload was not started" in only_error_line(err)
    assert "WORKLOAD-STARTED" not in out
    assert not any(os.path.exists(f"/proc/{pid}") for pid in probes), "the probe child outlived the entrypoint"


def test_a_signal_the_caller_ignores_stays_ignored(fakegpu: Path, tmp_path: Path) -> None:
    # nohup's SIGHUP: the entrypoint keeps ignoring it, and the workload inherits the ignored disposition.
    env = simhost_env("mixed-4", GPUPIN_EXPECT=RTX)
    p = subprocess.run(
        ["sh", "-c", f"trap '' HUP; exec {shlex.quote(ENTRYPOINT)} --quiet sh -c 'kill -HUP $$; echo alive'"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout.strip()) == (0, "alive"), p


# --- MIG on bare metal: CUDA shows a MIG-mode card as its MIG devices -------------------------------------------

MIG_CARD, WHOLE = uuids("mig")
MIG_GI1, MIG_GI2 = mig_devices("mig")


@pytest.mark.parametrize("level", ["nvml", "cuda"])
def test_a_whole_card_beside_a_mig_mode_card_is_the_card_the_workload_gets(on_mig: Entrypoint, level: str) -> None:
    # NVML puts the whole A100 at index 1; CUDA's index 1 is MIG device 2 of card 0. The pin is by UUID.
    r = on_mig.run(
        "--verify", level, "{py}", "-m", "gpupin.entrypoint", env={"GPUPIN_EXPECT": WHOLE}, scenario_name="mig"
    )
    assert r.rc == 0, r
    assert r.out.startswith(f"cuda:0 = {WHOLE} at 00000000:0F:00.0"), r.out
    assert f"CUDA_VISIBLE_DEVICES={WHOLE}" in r.err


@pytest.mark.parametrize("level", ["nvml", "cuda"])
def test_a_mig_device_and_a_whole_card_together(on_mig: Entrypoint, level: str) -> None:
    r = on_mig.run(
        "--verify",
        level,
        "{py}",
        "-m",
        "gpupin.entrypoint",
        env={"GPUPIN_EXPECT": f"{WHOLE},{MIG_GI2}"},
        scenario_name="mig",
    )
    assert r.rc == 0, r
    assert [ln.split()[2] for ln in r.out.splitlines()] == [WHOLE, MIG_GI2]


@pytest.mark.parametrize("level", ["nvml", "cuda"])
def test_a_whole_card_in_mig_mode_is_refused_with_78(on_mig: Entrypoint, level: str) -> None:
    r = on_mig.run("--verify", level, *STARTED, env={"GPUPIN_EXPECT": MIG_CARD}, scenario_name="mig")
    assert r.rc == 78, r
    line = only_error_line(r.err)
    assert "is in MIG mode" in line and MIG_GI1 in line and MIG_GI2 in line and "WORKLOAD-STARTED" not in r.out


def test_the_torch_level_on_the_mig_box_is_a_clean_69_without_torch(on_mig: Entrypoint) -> None:
    r = on_mig.run("--verify", "torch", *STARTED, env={"GPUPIN_EXPECT": WHOLE}, scenario_name="mig")
    assert r.rc == 69, r
    assert "import torch failed" in only_error_line(r.err) and "WORKLOAD-STARTED" not in r.out


@pytest.mark.parametrize("level", ["nvml", "cuda"])
def test_an_old_style_mig_uuid_is_resolved_to_its_device(on_mig: Entrypoint, level: str) -> None:
    legacy = f"MIG-{MIG_CARD}/2/0"
    r = on_mig.run(
        "--verify", level, "{py}", "-m", "gpupin.entrypoint", env={"GPUPIN_EXPECT": legacy}, scenario_name="mig"
    )
    assert r.rc == 0, r
    assert r.out.startswith(f"cuda:0 = {MIG_GI2} at 00000000:07:00.0"), r.out


def test_assert_pinned_resolves_an_old_style_mig_uuid_and_never_matches_another_device(fakegpu: Path) -> None:
    # `python3 -m gpupin.entrypoint` (assert_pinned) used to take MIG-GPU-... for any card: its hex part was "".
    for cvd, legacy, rc, says in (
        (MIG_GI2, f"MIG-{MIG_CARD}/2/0", 0, f"cuda:0 = {MIG_GI2}"),
        (MIG_GI1, f"MIG-{MIG_CARD}/2/0", 78, f"cuda:0 is {MIG_GI1}"),
        (WHOLE, f"MIG-{MIG_CARD}/1/0", 78, f"cuda:0 is MIG-{WHOLE[4:]}"),
        (MIG_GI2, f"MIG-{MIG_CARD}/7/0", 78, "has no MIG device with GPU instance 7"),
        (MIG_GI2, f"MIG-{WHOLE}/1/0", 78, "has no MIG device with GPU instance 1"),
    ):
        env = simhost_env("mig", GPUPIN_EXPECT=legacy, CUDA_VISIBLE_DEVICES=cvd)
        p = subprocess.run(
            [sys.executable, "-m", "gpupin.entrypoint"], env=env, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == rc, (legacy, p)
        assert says in (p.stdout if rc == 0 else p.stderr), (legacy, p)
        if rc:
            assert len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr


def test_an_ambiguous_mig_prefix_is_64_listing_the_matches(on_shared_prefix: Entrypoint) -> None:
    mig = next(g for g in topology("mig-shared-prefix")["gpus"] if g.get("mig"))["mig"]["devices"]
    r = on_shared_prefix.run(*STARTED, env={"GPUPIN_EXPECT": "MIG-7f3"}, scenario_name="mig-shared-prefix")
    assert r.rc == 64, r
    line = only_error_line(r.err)
    assert "ambiguous" in line and mig[0]["uuid"] in line and mig[1]["uuid"] in line and mig[2]["uuid"] not in line
    r = on_shared_prefix.run(
        "{py}", "-m", "gpupin.entrypoint", env={"GPUPIN_EXPECT": "MIG-7f3b"}, scenario_name="mig-shared-prefix"
    )
    assert r.rc == 0 and r.out.startswith(f"cuda:0 = {mig[1]['uuid']}"), r


# --- generated input: never a traceback, always a documented exit code ------------------------------------------


def run_main_in_fork(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """gpupin.entrypoint.cli.main(argv) under `env`, in a forked copy of this process: the real main(), the real
    exec of the workload, without a Python start-up per example."""
    from gpupin.entrypoint import cli

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 250
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False, errors="surrogateescape")  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115
                os.environ.clear()
                os.environ.update(env)
                code = cli.main(argv)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return (
            os.waitstatus_to_exitcode(status),
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
        )


UUIDS = [*uuids("mixed-4"), "GPU-00000000-1111-2222-3333-444444444444", mig_devices("mig")[0]]
# Values as a process can receive them: any bytes but NUL, decoded as Python decodes the environment and argv.
raw_text = st.binary(max_size=24).filter(lambda b: b"\0" not in b).map(os.fsdecode)
odd_text = st.one_of(raw_text, st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=24))


@st.composite
def uuid_spellings(draw: st.DrawFn) -> str:
    """A UUID of the simulated box (or not on it) as people write them: full, prefix, any case, with a bus id."""
    u = draw(st.sampled_from(UUIDS))
    u = draw(st.sampled_from([u, u.upper(), u.lower(), "gpu-" + u[4:], u[: draw(st.integers(4, len(u)))], " " + u]))
    if draw(st.booleans()):
        u += "@" + draw(st.sampled_from(["3b:00.0", "0000:1B:00.0", "00000000:86:00.0", "zz:00.0", "", "3b"]))
    return u


def comma_list(item: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(item, min_size=1, max_size=4).map(",".join)


expectations = st.one_of(comma_list(uuid_spellings()), comma_list(st.one_of(uuid_spellings(), odd_text)), odd_text)
env_values = {
    "GPUPIN_EXPECT": expectations,
    "NVIDIA_VISIBLE_DEVICES": st.one_of(
        st.sampled_from(["all", "none", "void", "", "0,1", "0:1"]), comma_list(uuid_spellings()), odd_text
    ),
    "DOCKER_RESOURCE_GPU": st.one_of(comma_list(uuid_spellings()), odd_text),
    "GPUPIN_VERIFY": st.one_of(st.sampled_from(["nvml", "cuda", "torch", " NVML", "", "fast"]), odd_text),
    "GPUPIN_REQUIRE": st.one_of(st.sampled_from(["1", "0", "yes", "off", ""]), odd_text),
    "GPUPIN_QUIET": st.one_of(st.sampled_from(["1", "0", "on", "no", ""]), odd_text),
    "GPUPIN_PROBE_TIMEOUT": st.one_of(st.sampled_from(["inf", "nan", "1e999", "-1", "0", "30", "1_0", ""]), odd_text),
    "CUDA_VISIBLE_DEVICES": st.one_of(st.sampled_from(["0", "1,0", "", "GPU-6c", "bogus"]), odd_text),
    "CUDA_DEVICE_ORDER": st.one_of(st.sampled_from(["FASTEST_FIRST", "PCI_BUS_ID", "pci_bus_id"]), odd_text),
}
environments = st.fixed_dictionaries({}, optional=env_values)
OWN_OPTIONS = [
    "--require",
    "--quiet",
    "-q",
    "--json",
    "--debug",
    "--verify=nvml",
    "--verify=cuda",
    "--verify",
    "nvml",
    "--verify=fast",
    "--bogus",
    "--json=1",
    "-x",
    "--",
    "-",
]
WORKLOAD_EXIT = 7
commands = st.one_of(
    st.just(["sh", "-c", f"exit {WORKLOAD_EXIT}"]),
    st.just(["sh", "-c", f"exit {WORKLOAD_EXIT}", "--debug", "--verify", "bogus"]),
    st.just(["no-such-workload-xyz"]),
    st.just([""]),
    st.just([]),
    st.lists(odd_text, min_size=1, max_size=3),
)
argvs = st.tuples(st.lists(st.sampled_from(OWN_OPTIONS), max_size=5), commands)


def own_debug(options: list[str]) -> bool:
    """Whether the entrypoint itself was given --debug: only options before CMD count, and parsing stops at the
    first word that is not an option, at `--`, or at the first bad option."""
    value_next = False
    for arg in options:
        if value_next:  # --verify's value (`--verify nvml`), never a word that ends the options
            value_next = False
            continue
        if arg == "--debug":
            return True
        if arg == "--verify":
            value_next = True
            continue
        if arg in ("--", "-", "nvml", "--bogus", "--json=1", "-x", "--verify=fast") or not arg.startswith("-"):
            return False
    return False


def check_contract(rc: int, out: str, err: str, debug: bool, allowed: set[int]) -> None:
    event(f"exit {rc}")  # `pytest --hypothesis-show-statistics` shows how the examples spread over the outcomes
    assert rc in allowed, (rc, out, err)
    if rc in (0, WORKLOAD_EXIT):
        assert "ERROR:" not in err and "Traceback" not in err, err
        return
    errors = [ln for ln in err.splitlines() if ln.startswith("gpupin-entrypoint: ERROR: ")]
    assert len(errors) == 1, err
    if not debug:  # nothing but the entrypoint's own lines (and its --json report, on stderr when CMD is given)
        assert "Traceback" not in err, err
        assert all(ln.startswith(("gpupin-entrypoint: ", "{")) for ln in err.splitlines()), err


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=environments, argv=argvs)
def test_generated_environments_and_command_lines_in_process(
    env: dict[str, str], argv: tuple[list[str], list[str]]
) -> None:
    options, command = argv
    base = simhost_env("mixed-4")
    rc, out, err = run_main_in_fork([*options, *command], {**base, **env})
    check_contract(rc, out, err, own_debug(options), DOCUMENTED | {WORKLOAD_EXIT})


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=environments, argv=argvs)
def test_generated_environments_and_command_lines_as_a_process(
    env: dict[str, str], argv: tuple[list[str], list[str]]
) -> None:
    options, command = argv
    penv = {**simhost_env("mixed-4"), **env}
    p = subprocess.run(
        [os.fsencode(a) for a in (ENTRYPOINT, *options, *command)],
        env={os.fsencode(k): os.fsencode(v) for k, v in penv.items()},
        capture_output=True,
        timeout=120,
    )
    check_contract(
        p.returncode,
        p.stdout.decode(errors="replace"),
        p.stderr.decode(errors="replace"),
        own_debug(options),
        DOCUMENTED | {WORKLOAD_EXIT},
    )

"""hostagent's CLI under generated argument lists (hypothesis): never a traceback, always a documented exit code,
one line on a refusal. The daemon address is a socket that does not exist, so nothing can be created; NVML is the
simulated mixed-4 host's (make test and make test-unit export it)."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpupin.hostagent.cli import build_parser, main
from tests.support.hypo import examples
from tests.support.scenarios import uuids

RTX = uuids("mixed-4")[1]
WORDS = [
    "run",
    "ls",
    "compose",
    "render",
    "check",
    "--debug",
    "--json",
    "--gpu",
    "--uuid",
    "--count",
    "--wait",
    "--share",
    "--verify",
    "cuda",
    "fast",
    "--dry-run",
    "-e",
    "A=1",
    "-eB=2",
    "--env-file",
    "/nonexistent",
    "--rm",
    "-d",
    "-dit",
    "--name",
    "job",
    "--label",
    "gpupin.devices=x",
    "--shm-size",
    "1q",
    "8g",
    "--pull",
    "never",
    "always",
    "--stop-timeout",
    "-1",
    "--entrypoint",
    "",
    "--",
    "-",
    "--bogus",
    "--nmae",
    "1",
    "0",
    "9",
    "²",
    "0:1",
    "3b:00.0",
    "GPU-",
    "GPU-6c",
    RTX,
    "inf",
    "nan",
    "1e999",
    "img",
    "gpupin:test",
    "Bad Image",
    "-v",
    "/a:/b",
    "-w",
    "/w",
    "--help-me",
    "x" * 300,
    "\udcff",
]


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


@pytest.fixture(autouse=True)
def _dead_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    if "LD_LIBRARY_PATH" not in os.environ:
        pytest.skip("needs the simulated host's NVML (run through make test or make test-unit)")
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/gpupin-fuzz/docker.sock")
    for var in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "DOCKER_CONTEXT"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("argv", [["ls", "0\n"], ["ls", ""]])  # found by this test in CI: two lines; an IndexError
def test_words_argparse_does_not_know_are_one_line(argv: list[str]) -> None:
    with captured() as (_out, err):
        assert main(argv) == 64
    assert err.getvalue().count("\n") == 1 and "unrecognized arguments" in err.getvalue()


def watches(argv: list[str]) -> bool:
    """`ls -w` (`--watch`, or any abbreviation argparse takes for it) redraws until Ctrl-C by contract: a command
    that does not end is not one this test can wait for."""
    with captured():
        try:
            args = build_parser().parse_args(argv)
        except BaseException:  # argparse's exit on bad usage or --help: it ends
            return False
    return getattr(args, "watch", None) is not None


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=10))
def test_any_argument_list_ends_with_a_documented_code_and_one_line(argv: list[str]) -> None:
    assume(not watches(argv))
    with captured() as (_out, err):
        try:
            rc = main(argv)
        except SystemExit as exit_:  # argparse's --help
            rc = int(exit_.code or 0)
    assert rc in (0, 64, 69, 75), (argv, rc, err.getvalue())
    text = err.getvalue()
    assert "Traceback" not in text or "--debug" in argv, text
    if rc != 0 and "--debug" not in argv:
        assert text.count("ERROR:") == 1 and text.endswith("\n"), (argv, text)
        assert text.count("\n") == 1, (argv, text)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.permutations(["--gpu", "1", "--rm", "-e", "A=1", "--name", "job", "--shm-size", "1g"]))
def test_option_order_does_not_change_the_dry_run(order: list[str]) -> None:
    # Pairs must stay pairs: rebuild the permutation out of (option, value) units.
    units = [["--gpu", "1"], ["--rm"], ["-e", "A=1"], ["--name", "job"], ["--shm-size", "1g"]]
    keyed = sorted(units, key=lambda u: order.index(u[0]))
    argv = ["run", "--dry-run", *[w for u in keyed for w in u], "gpupin:test", "python3", "--rm"]
    with captured() as (out, err):
        rc = main(argv)
    assert rc == 0, err.getvalue()
    assert out.getvalue().startswith("docker run --name job --rm --shm-size 1g --gpus ")
    assert out.getvalue().rstrip().endswith("gpupin:test python3 --rm")

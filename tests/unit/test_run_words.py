"""A run sent to the resident agent as its words (gpupin.hostagent.serve.runs.from_words): the agent parses them
with the caller's own parser into the request the caller would have made, never prints, and sends back the parse of
words that read the caller's files or environment, print (errors, help), or wait. The follow the agent sends back
with the container is what the options say (gpupin.hostagent.run.attach.Follow)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout, suppress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupin.core.errors import GpupinError, UsageError
from gpupin.hostagent.cli import build_parser
from gpupin.hostagent.run import args as run_args
from gpupin.hostagent.run.attach import Follow
from gpupin.hostagent.serve import runs


def body(*words: str, cwd: str = "/work", tty: bool = False) -> dict[str, Any]:
    return {"words": list(words), "cwd": cwd, "stdin_tty": tty}


def own_parse(*words: str) -> Any:
    """The request this process makes of the same words (its own parser, its own reads)."""
    return run_args.request(run_args.parse(list(words), build_parser(run_only=True)), lambda: False)


@pytest.mark.parametrize(
    "words",
    [
        ("--gpu", "1", "img"),
        ("--rm", "-d", "--uuid", "GPU-1", "--name", "x", "-e", "A=1", "--memory", "16g", "img", "sh", "-c", "x"),
        ("-itd", "--count", "2", "--for", "2h", "--sig-proxy=false", "--stop-timeout", "3", "img"),
        ("--gpu", "0", "-v", "./data:/data", "--label", "k=v", "img", "--gpu", "1"),
    ],
)
def test_the_agent_parses_words_into_the_request_the_caller_would_make(words: tuple[str, ...]) -> None:
    theirs = runs.from_words(body(*words))
    mine = own_parse(*words)
    assert (theirs.image, theirs.command, theirs.gpus, theirs.count, theirs.book_for) == (
        mine.image,
        mine.command,
        mine.gpus,
        mine.count,
        mine.book_for,
    )
    assert theirs.options == mine.options  # as typed
    if "-v" in words:  # a relative bind source is made absolute against the caller's folder, as sent
        assert theirs.payload["host"]["binds"] == ["/work/data:/data"]
    else:
        assert theirs.payload == mine.payload
    assert Follow.of(theirs).wire() == Follow.of(mine).wire()


@pytest.mark.parametrize(
    "words",
    [
        ("--env-file", "/etc/shadow", "--gpu", "1", "img"),  # a file: read with the caller's rights
        ("--security-opt", "seccomp=/root/profile.json", "--gpu", "1", "img"),
        ("-e", "HOME", "--gpu", "1", "img"),  # a value of the caller's environment
        ("--wait", "--gpu", "1", "img"),  # the caller waits, in the queue
        ("--dry-run", "--gpu", "1", "img"),  # the caller prints
        ("--bogus", "img"),  # argparse's error, which the caller's parser prints
        ("--help",),
        ("-e", "A=1") * (runs.WORDS_MAX // 2) + ("--gpu", "1", "img"),  # argparse's time is the square of its options
    ],
)
def test_words_whose_parse_is_the_callers_are_sent_back(words: tuple[str, ...]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), pytest.raises(runs._Parse):
        runs.from_words(body(*words))
    assert out.getvalue() == err.getvalue() == ""  # the agent never prints a caller's words


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (("--privileged", "--gpu", "1", "img"), "hostagent run does not take --privileged"),
        (("--memory", "12q", "--gpu", "1", "img"), "--memory"),
        (("img", "--gpu", "1"), "comes after the image"),
        (("-it", "--gpu", "1", "img"), "-it needs a terminal"),
        (("--gpu", "1"), "no IMAGE given"),
    ],
)
def test_a_refusal_of_the_words_is_the_one_the_caller_would_give(words: tuple[str, ...], said: str) -> None:
    with pytest.raises(UsageError) as theirs:
        runs.from_words(body(*words))
    with pytest.raises(UsageError) as mine:
        own_parse(*words)
    assert said in theirs.value.message and theirs.value.line("hostagent") == mine.value.line("hostagent")
    assert runs.from_words(body("-it", "--gpu", "1", "img", tty=True)).tty  # with the caller's terminal, it parses


@pytest.mark.parametrize(
    "bad",
    [
        {"words": "--gpu 1 img", "cwd": "/", "stdin_tty": False},
        {"words": ["--gpu", 1, "img"], "cwd": "/", "stdin_tty": False},
        {"words": ["img"], "cwd": "relative", "stdin_tty": False},
        {"words": ["img"], "cwd": "/", "stdin_tty": "no"},
        {"words": ["img"], "stdin_tty": False},
    ],
)
def test_malformed_words_are_a_usage_error(bad: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="malformed"):
        runs.from_words(bad)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "--gpu",
                "1",
                "-e",
                "A",
                "A=1",
                "-it",
                "--rm",
                "-d",
                "img",
                "--",
                "-",
                "--wait",
                "--name",
                "=",
                "-v",
                "./x:/y",
                "--for",
                "2h",
                "--memory",
                "x",
                "-h",
                "\x1b[2J",
            ]
        ),
        max_size=8,
    )
    | st.lists(st.text(max_size=12), max_size=6)
)
def test_any_words_are_parsed_refused_or_sent_back_never_printed(words: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), suppress(runs._Parse, GpupinError):
        runs.from_words(body(*words))
    assert out.getvalue() == err.getvalue() == ""


def test_the_follow_the_agent_sends_is_checked() -> None:
    follow = Follow(detach=False, interactive=True, tty=False, rm=True, sig_proxy=False, stop_timeout=7)
    back = Follow.from_wire(follow.wire())
    assert back is not None and back.wire() == follow.wire()
    assert (back.interactive, back.rm, back.sig_proxy, back.stop_timeout) == (True, True, False, 7)
    bads: list[Any] = [None, [], {**follow.wire(), "tty": "yes"}, {**follow.wire(), "stop_timeout": True}, {"rm": True}]
    for bad in bads:
        assert Follow.from_wire(bad) is None

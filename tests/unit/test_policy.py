"""The policy file's model and parser (gpupin.hostagent.policy; docs/policy.md): durations, who a rule applies to,
and every mistake named once, with its key and line."""

from __future__ import annotations

import grp
import os
import pwd
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupin.core.files import FileRefused
from gpupin.hostagent.ledger import booking
from gpupin.hostagent.ls.listing import booking_shown
from gpupin.hostagent.ls.model import BookingShown, Listing
from gpupin.hostagent.policy import (
    BookingRule,
    Policy,
    PolicyError,
    Quota,
    check_policy,
    format_duration,
    load_policy,
    parse_duration,
    parse_policy,
)
from gpupin.hostagent.serve import queue

ROOT_GROUP = grp.getgrgid(0).gr_name
NOBODY = pwd.getpwnam("nobody").pw_uid
NAMELESS = (1001, 1002)  # the users of these tests, bare uids whatever the machine's passwd names them


@pytest.fixture(autouse=True)
def _bare_uids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' users have no name here (a machine where uid 1001 is someone's would change their messages)."""
    named = pwd.getpwuid

    def getpwuid(uid: int) -> pwd.struct_passwd:
        if uid in NAMELESS:
            raise KeyError(f"getpwuid(): uid not found: {uid}")
        return named(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)


FULL = f"""
[booking]
default = "4h"
max = "2d"
[booking.user.nobody]
max = "3d"

[idle]
after = "30m"
action = "stop"
grace = "10m"
exempt = ["nobody", "@{ROOT_GROUP}"]

[quota]
cards = 2
gpu_hours_per_day = 24
gpu_hours_per_week = 100.5
waiters = 4
[quota.user.nobody]
cards = 4
[quota.group.{ROOT_GROUP}]
gpu_hours_per_day = 48
[quota.group."4242"]
gpu_hours_per_day = 30
cards = 3

[notify]
command = ["/usr/local/bin/gpupin-hook", "--quiet"]
webhook = "http://127.0.0.1:8080/gpupin"
before_end = "15m"
"""


def policy(text: str, tmp_path: Path) -> Policy:
    f = tmp_path / "policy.toml"
    f.write_text(text)
    return load_policy(str(f))


def mistakes(text: str, tmp_path: Path) -> list[str]:
    f = tmp_path / "policy.toml"
    f.write_text(text)
    return check_policy(str(f))


# --- durations ---


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("90m", 5400), ("4h", 14400), ("2d", 172800), ("1w", 604800), ("1h30m", 5400), ("1.5h", 5400)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "90", "4 hours", "-1h", "0m", "1h1h", "h", "1y", "400d", "1e3s", "nan", "inf"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=366 * 86400))
def test_duration_round_trip(seconds: int) -> None:
    """format_duration names a time parse_duration reads back, never more than was left, and within its unit."""
    shown = format_duration(seconds)
    back = parse_duration(shown)
    assert back <= seconds
    assert seconds - back < (60 if seconds < 86400 else 3600) or seconds < 60


@given(st.text(max_size=30))
def test_any_text_is_a_duration_or_value_error(text: str) -> None:
    try:
        s = parse_duration(text)
    except ValueError as err:
        assert "\n" not in str(err)
    else:
        assert 0 < s <= 366 * 86400


# --- the model ---


def test_full_file(tmp_path: Path) -> None:
    p = policy(FULL, tmp_path)
    assert p.path == str(tmp_path / "policy.toml")
    assert p.booking == BookingRule(default=4 * 3600, max=2 * 86400)
    assert p.idle is not None and (p.idle.after, p.idle.action, p.idle.grace) == (1800, "stop", 600)
    assert p.notify is not None and p.notify.command == ["/usr/local/bin/gpupin-hook", "--quiet"]
    assert p.notify.webhook == "http://127.0.0.1:8080/gpupin" and p.notify.before_end == 900
    assert p.enforced
    assert "bookings default 4h, max 2d" in p.summary()


def test_who_a_rule_applies_to(tmp_path: Path) -> None:
    p = policy(FULL, tmp_path)
    someone = frozenset({12345})
    # the top table
    assert p.quota(1001, someone) == Quota(cards=2, gpu_hours_per_day=24, gpu_hours_per_week=100.5, waiters=4)
    assert p.booking_max(1001, someone) == 2 * 86400
    assert p.booking_default(1001, someone) == 4 * 3600
    # a user table wins, its absent keys inherit
    assert p.quota(NOBODY, someone).cards == 4
    assert p.quota(NOBODY, someone).waiters == 4
    assert p.booking_max(NOBODY, someone) == 3 * 86400
    # groups: the most generous of the caller's groups, per key; a group named by number
    q = p.quota(1001, frozenset({0, 4242}))
    assert (q.cards, q.gpu_hours_per_day) == (3, 48)
    # root is bound by no max and no quota, but gets the default
    assert p.quota(0, frozenset({0})) == Quota()
    assert p.booking_max(0, frozenset()) is None
    assert p.booking_default(0, frozenset()) == 4 * 3600


def test_default_never_past_max(tmp_path: Path) -> None:
    p = policy('[booking]\ndefault = "4h"\n[booking.user."1001"]\nmax = "1h"\n', tmp_path)
    assert p.booking_default(1001, frozenset()) == 3600
    assert p.booking_default(1002, frozenset()) == 4 * 3600


def test_may_exempt(tmp_path: Path) -> None:
    p = policy(FULL, tmp_path)
    assert p.may_exempt(NOBODY, frozenset())
    assert p.may_exempt(1001, frozenset({0}))  # @root's member
    assert not p.may_exempt(1001, frozenset({4242}))
    assert Policy.empty().may_exempt(0, frozenset())
    assert not Policy.empty().may_exempt(1001, frozenset())


def test_usage_readers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`[usage] readers`: the users and @groups who see everyone's usage through the agent (root always does); a
    name this host lacks is a warning; anything but a list of names is a mistake, named with its line, as
    `policy check` says it."""
    from gpupin.hostagent.cli import main

    p = policy(f'[usage]\nreaders = ["nobody", "@{ROOT_GROUP}", "1002", "gone-admin"]\n', tmp_path)
    assert p.usage.readers == ("nobody", f"@{ROOT_GROUP}", "1002", "gone-admin")
    assert p.may_read_usage(NOBODY, frozenset()) and p.may_read_usage(1002, frozenset())
    assert p.may_read_usage(1001, frozenset({0}))  # @root's member
    assert not p.may_read_usage(1001, frozenset({4242}))
    assert Policy.empty().may_read_usage(0, frozenset()) and not Policy.empty().may_read_usage(1001, frozenset({0}))
    assert not p.enforced and p.summary() == f"usage readers nobody, @{ROOT_GROUP}, 1002, gone-admin"
    assert p.as_json()["usage"] == {"readers": ["nobody", f"@{ROOT_GROUP}", "1002", "gone-admin"]}
    assert [w.split(": ", 2)[1:] for w in p.warnings] == [
        ["usage.readers", "names 'gone-admin': no such user on this host (now): it shows them no one's usage"]
    ]
    f = str(tmp_path / "policy.toml")
    for text, line, says in (
        ('[usage]\nreaders = "@admins"\n', 2, "usage.readers: must be an array of user names and @groups, not text"),
        ("[usage]\nreaders = [1001]\n", 2, "usage.readers: holds 1001: each item is a user name or uid, or @group"),
        ('[usage]\nreader = ["nobody"]\n', 2, "usage.reader: unknown key (did you mean readers? known here: readers)"),
        ('usage = "all"\n', 1, "usage: must be a table, not text"),
    ):
        assert mistakes(text, tmp_path) == [f"{f}:{line}: {says}"], text
        assert main(["policy", "check", f]) == 64
        assert f"ERROR: {f}:{line}: {says}" in capsys.readouterr().err


def test_empty_enforces_nothing(tmp_path: Path) -> None:
    e = Policy.empty()
    assert not e.enforced and e.idle is None and e.notify is None
    assert e.quota(1001, frozenset()) == Quota()
    assert e.booking_default(1001, frozenset()) is None and e.booking_max(1001, frozenset()) is None
    assert e.summary() == "nothing enforced"
    assert policy("# nothing yet\n", tmp_path) == e


# --- mistakes ---


def test_every_mistake_one_line_with_key_and_line(tmp_path: Path) -> None:
    text = """[booking]
default = "4 hours"
max = "1h"
[quota]
cards = -1
gpu_hour_per_day = 3
waiters = 1.5
[quota.user.no-such-user-here]
cards = 1
[idle]
after = "30m"
action = "kill"
[notify]
webhook = "http://example.com/hook"
command = "hook"
[extra]
"""
    found = mistakes(text, tmp_path)
    f = str(tmp_path / "policy.toml")
    assert all("\n" not in m for m in found)
    expect = {
        f"{f}:2: booking.default:",
        f"{f}:5: quota.cards:",
        f"{f}:6: quota.gpu_hour_per_day: unknown key",
        f"{f}:7: quota.waiters:",
        f"{f}:12: idle.action:",
        f"{f}:14: notify.webhook:",
        f"{f}:15: notify.command:",
        f"{f}:16: extra: unknown key",
    }
    for start in expect:
        assert any(m.startswith(start) for m in found), (start, found)
    assert len(found) == len(expect), found
    with pytest.raises(PolicyError) as err:
        load_policy(f)
    assert err.value.exit_code == 64 and err.value.mistakes == found
    assert "policy check" in (err.value.hint or "")


def test_a_name_the_host_no_longer_has_is_a_warning_never_a_mistake(tmp_path: Path) -> None:
    """A student leaves and her account is deleted: the file that named her stays a good policy (the rest of it is
    still enforced), and the rule that names her is said, limiting no one."""
    f = tmp_path / "policy.toml"
    f.write_text(
        '[quota]\ncards = 1\n[quota.user.gone-student]\ncards = 4\n[booking.group.gone-group]\nmax = "1d"\n'
        '[idle]\nafter = "1h"\nexempt = ["gone-student", "@gone-group", "nobody"]\n'
    )
    p = load_policy(str(f))
    assert p.quota(1001, frozenset()) == Quota(cards=1)
    assert p.idle is not None and "nobody" in p.idle.exempt
    assert [w.split(": ", 2)[1] for w in p.warnings] == [
        "quota.user.gone-student",
        "booking.group.gone-group",
        "idle.exempt",
        "idle.exempt",
    ], p.warnings
    assert p.warnings[0].startswith(f"{f}:3: quota.user.gone-student: no such user on this host")
    assert check_policy(str(f)) == []


def test_default_longer_than_max(tmp_path: Path) -> None:
    (m,) = mistakes('[booking]\ndefault = "2d"\nmax = "1d"\n', tmp_path)
    assert ":2: booking.default: 2d is longer than max, 1d" in m


def test_inline_tables_name_their_line(tmp_path: Path) -> None:
    (m,) = mistakes('idle = {after = "30m", action = "nap"}\n', tmp_path)
    assert ":1: idle.action:" in m


def test_not_toml(tmp_path: Path) -> None:
    (m,) = mistakes("[booking\nmax = 1\n", tmp_path)
    assert "not valid TOML" in m and "line 1" in m


@pytest.mark.parametrize("path", ["/dev/zero", "/nonexistent/policy.toml", "/"])
def test_files_that_are_not_read(path: str) -> None:
    (m,) = check_policy(path)
    assert "\n" not in m
    with pytest.raises(FileRefused):
        load_policy(path)


def test_not_utf8(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_bytes(b"[quota]\ncards = 1 # \xff\n")
    (m,) = check_policy(str(f))
    assert "UTF-8" in m


def test_fifo_does_not_hang(tmp_path: Path) -> None:
    f = tmp_path / "fifo"
    os.mkfifo(f)
    (m,) = check_policy(str(f))
    assert "FIFO" in m


@given(st.text(max_size=200))
def test_any_text_is_a_policy_or_mistakes(text: str) -> None:
    """Whatever the file holds, the parser answers a Policy or one-line mistakes, never another exception."""
    try:
        parse_policy(text, "p.toml")
    except PolicyError as err:
        assert err.mistakes and all("\n" not in m for m in err.mistakes)


@given(
    st.dictionaries(
        st.sampled_from(["cards", "waiters", "gpu_hours_per_day", "gpu_hours_per_week", "bogus"]),
        st.one_of(st.integers(-5, 50), st.floats(allow_nan=True), st.text(max_size=5), st.booleans()),
        max_size=5,
    )
)
def test_quota_values(values: dict[str, object]) -> None:
    import json

    # TOML's inline table from JSON-ish values (floats as TOML writes them)
    def toml(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "nan" if v != v else ("inf" if v > 0 else "-inf") if v in (float("inf"), float("-inf")) else repr(v)
        return json.dumps(v)

    text = "[quota]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in values.items())
    try:
        q = parse_policy(text, "p.toml").quota(1001, frozenset())
    except PolicyError as err:
        assert all(m.startswith("p.toml:") for m in err.mistakes)
    else:
        assert "bogus" not in values
        for k, v in values.items():
            assert getattr(q, k) == v


# --- hostagent policy check ---


def test_check_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpupin.hostagent.cli import main

    f = tmp_path / "policy.toml"
    f.write_text(FULL)
    assert main(["policy", "check", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"policy: OK {f}: bookings default 4h, max 2d; quota cards 2") and out.count("\n") == 1


def test_check_mistakes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from gpupin.hostagent.cli import main

    f = tmp_path / "policy.toml"
    f.write_text('[quota]\ncard = 2\n[booking]\nmax = "2 days"\n')
    assert main(["policy", "check", str(f)]) == 64
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"hostagent policy: ERROR: {f}:2: quota.card: unknown key (did you mean cards? known here: cards, "
        "gpu_hours_per_day, gpu_hours_per_week, group, user, waiters)",
        f"hostagent policy: ERROR: {f}:4: booking.max: '2 days' is not a duration (e.g. 45s, 90m, 4h, 2d, 1w, 1h30m)",
        f"hostagent policy: 2 mistakes in {f}",
    ]
    assert main(["policy", "check", "--json", str(f)]) == 64
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and len(out["mistakes"]) == 2 and out["policy"] is None
    f.write_text(FULL)
    assert main(["policy", "check", "--json", str(f)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["policy"]["quota"]["cards"] == 2


def test_check_default_file_missing(capsys: pytest.CaptureFixture[str]) -> None:
    from gpupin.hostagent.cli import main

    if os.path.exists("/etc/gpupin/policy.toml"):
        pytest.skip("this host has a policy file")
    assert main(["policy", "check"]) == 64
    assert "/etc/gpupin/policy.toml: cannot read it: No such file or directory" in capsys.readouterr().err


# --- bookings and quotas (gpupin.hostagent.policy.admit, gpupin.hostagent.ledger.booking) ---


def quota_policy(tmp_path: Path) -> Policy:
    return policy(
        '[booking]\ndefault = "1h"\nmax = "4h"\n[quota]\ncards = 2\ngpu_hours_per_day = 3\n'
        '[quota.user."1002"]\ncards = 4\n',
        tmp_path,
    )


def test_booking_length(tmp_path: Path) -> None:
    from gpupin.core.errors import UsageError

    p = quota_policy(tmp_path)
    alice = booking.Caller(1001, {1001})
    assert booking.length(p, alice, None) == 3600
    assert booking.length(p, alice, 7200) == 7200
    with pytest.raises(UsageError) as err:
        booking.length(p, alice, 5 * 3600)
    assert err.value.exit_code == 64
    assert "--for 5h is longer than the longest booking the policy gives uid 1001" in err.value.message
    assert "(booking.max)" in err.value.message
    assert booking.length(p, booking.Caller(0, {0}), 30 * 86400) == 30 * 86400  # root: no maximum
    assert booking.length(Policy.empty(), alice, None) is None


def test_booking_label_round_trip() -> None:

    labels = booking.labels(booking.Caller(1001, ()), 5400, now=1000)
    assert labels == {"gpupin.booking": "uid=1001 since=1000 until=6400"}
    b = booking.parse(labels["gpupin.booking"])
    assert b is not None and (b.uid, b.since, b.until) == (1001, 1000, 6400)
    assert booking_shown(b, now=2000) == BookingShown(1001, 1000, 6400, 4400)
    assert booking_shown(b, now=9000).left_s == 0
    assert booking.parse(booking.labels(booking.Caller(7, ()), None, now=5)["gpupin.booking"]).until is None  # type: ignore[union-attr]
    for forged in ("uid=0", "uid=1 since=2 until=3 extra", "uid=-1 since=2", "", "uid=1\nsince=2"):
        assert booking.parse(forged) is None


def test_quota_cards(tmp_path: Path) -> None:
    from gpupin.core.errors import UsageError
    from gpupin.hostagent.policy import admit

    p = quota_policy(tmp_path)
    alice = booking.Caller(1001, {1001})
    held = [admit.Holding(1001, 1, 1000 + 4320, "train-a"), admit.Holding(1002, 3, None, "bob-job")]
    admit.check(p, alice, 1, held, admit.nothing, now=1000)  # 1 + 1 <= 2
    with pytest.raises(admit.QuotaError) as err:
        admit.check(p, alice, 2, held, admit.nothing, now=1000)
    assert err.value.exit_code == 75
    assert err.value.message == (
        "quota cards: uid 1001 holds 1 of 2 card(s) at once, and asks 2 more; the first frees when train-a ends, "
        "in 1h12m"
    )
    with pytest.raises(UsageError) as never:
        admit.check(p, alice, 3, [], admit.nothing)
    assert never.value.exit_code == 64 and "at most 2 at once (quota.cards)" in never.value.message
    # bob's own quota, and bob's holdings are not alice's
    admit.check(p, booking.Caller(1002, ()), 1, held, admit.nothing)
    assert admit.never(p, alice, 3) is not None and admit.never(p, alice, 2) is None


def _record(tmp_path: Path, intervals: list[tuple[int, float, float | None]]) -> Any:
    """A record (the agent's SQLite file) with `intervals` planted: (uid, start, end or None while open)."""
    from gpupin.hostagent.record.store import Figures, IntervalRow, Store

    folder = tmp_path / "record"
    folder.mkdir(mode=0o700)
    s = Store(str(folder / "record.db"))
    for n, (uid, start, end) in enumerate(intervals):
        row = IntervalRow(f"c{n}", f"c{n}", "img", "GPU-a", 0, uid, f"u{uid}", start, start)
        rid = s.open_interval(row)
        if end is not None:
            s.close_interval(rid, row, Figures(start, start), end, "exit")
    return s


def test_quota_gpu_hours_count_the_records_past_and_what_runs_now(tmp_path: Path) -> None:
    """GPU-hours in a rolling window: the record's finished intervals (their part inside the window) plus the
    holdings running now; an interval still open in the record is the ledger's to count, not counted twice."""
    from gpupin.hostagent.policy import admit

    now = 1_800_000_000.0
    day, week = 86400.0, 7 * 86400.0
    s = _record(
        tmp_path,
        [
            (1001, now - 4 * 3600, now - 3 * 3600),  # 1 h this morning
            (1001, now - 4 * 3600, now - 3 * 3600),  # and on a second card: 2 GPU-hours today
            (1001, now - day - 1800, now - day + 1800),  # half inside the day's window
            (1001, now - 3 * day, now - 3 * day + 7200),  # this week, not today
            (1001, now - week - 3600, now - week),  # ended as the week's window begins: not counted
            (1002, now - 3600, now),  # bob's
            (1001, now - 600, None),  # open: running now, as the holdings say
        ],
    )
    past = s.finished
    assert past(1001, now - day) == [
        (now - day - 1800, now - day + 1800),
        (now - 4 * 3600, now - 3 * 3600),
        (now - 4 * 3600, now - 3 * 3600),
    ]
    spans = past(1001, now - day)
    running = [admit.Holding(1001, 1, None, "train", since=now - 600)]
    assert admit.used_seconds(spans, [], day, now) == 2 * 3600 + 1800
    assert admit.used_seconds(spans, running, day, now) == 2 * 3600 + 1800 + 600
    week_spans = past(1001, now - week)
    assert admit.used_seconds(week_spans, [], week, now) == 2 * 3600 + 3600 + 7200
    # a limit of 2 GPU-hours a day: alice, who used 2.5 this morning and stopped, is refused, 75
    p = policy("[quota]\ngpu_hours_per_day = 2\n", tmp_path)
    alice = booking.Caller(1001, ())
    with pytest.raises(admit.QuotaError) as err:
        admit.check(p, alice, 1, [], past, now=now)
    assert err.value.exit_code == 75
    # yesterday's half hour leaves by now + 30 min: 2.0 GPU-hours, still not below 2; this morning's two cards
    # begin to leave the window at now + 20 h: free from then
    frees = now + 20 * 3600
    assert admit.frees_at(spans, [], day, 7200.0, now) == pytest.approx(frees)
    assert err.value.message == (
        "quota gpu_hours_per_day: uid 1001 used 2.5 of 2 GPU-hours in the last 24 hours; it frees in 20h, at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(frees))}"
    )
    # bob's use is his own; a week's quota reads the week
    admit.check(p, booking.Caller(1002, ()), 1, [], past, now=now)
    weekly = policy("[quota]\ngpu_hours_per_week = 5\n", tmp_path)
    with pytest.raises(admit.QuotaError) as err:
        admit.check(weekly, alice, 1, [], past, now=now)
    assert "used 5.0 of 5 GPU-hours in the last 7 days; it frees in 4d, at " in err.value.message
    admit.check(policy("[quota]\ngpu_hours_per_week = 5.01\n", tmp_path), alice, 1, [], past, now=now)


def test_quota_gpu_hours_while_holding(tmp_path: Path) -> None:
    """What runs now counts, and runs on: a use that only its holdings keep up does not free while they run."""
    from gpupin.hostagent.policy import admit

    now = 1_800_000_000.0
    p = policy("[quota]\ngpu_hours_per_day = 3\n", tmp_path)
    alice = booking.Caller(1001, ())
    two = [admit.Holding(1001, 2, None, "train", since=now - 5400), admit.Holding(1002, 4, None, "bob", since=now)]
    with pytest.raises(admit.QuotaError) as err:
        admit.check(p, alice, 1, two, admit.nothing, now=now)
    assert err.value.message == (
        "quota gpu_hours_per_day: uid 1001 used 3.0 of 3 GPU-hours in the last 24 hours; it does not free while "
        "what it holds runs (train): stop it first"
    )
    # one card's 2 h of the past leave the window from now + 10 min while one card runs on: the use stays at the
    # limit, then grows; it does not free while that runs
    day = 86400.0
    past = [(now - day + 600, now - day + 7800)]
    one = [admit.Holding(1001, 1, None, "train", since=now - 3600)]
    assert admit.used_seconds(past, one, day, now) == 7200 + 3600
    assert admit.frees_at(past, one, day, 10800.0, now) is None
    # two cards of the past leave while one card runs on: the use falls by 1 s a second from now + 10 min, and
    # is below 5 GPU-hours from now + 20 min
    with pytest.raises(admit.QuotaError) as err:
        admit.check(policy("[quota]\ngpu_hours_per_day = 5\n", tmp_path), alice, 1, one, lambda _u, _s: past * 2, now)
    assert admit.frees_at(past * 2, one, day, 18000.0, now) == pytest.approx(now + 1200)
    assert err.value.message.startswith("quota gpu_hours_per_day: uid 1001 used 5.0 of 5 GPU-hours")
    assert err.value.message.endswith(
        f"it frees in 20m, at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now + 1200))}, counting train as "
        "running on"
    )
    assert admit.over(p, booking.Caller(1002, ()), 1, two, admit.nothing) is None  # bob: no quota of 1001's


@given(
    st.lists(st.tuples(st.floats(0, 3000), st.floats(1, 3000)), max_size=8),
    st.lists(st.tuples(st.integers(1, 4), st.floats(0, 3000)), max_size=3),
    st.floats(1, 8000),
)
def test_when_a_rolling_window_frees_is_the_first_time_below_the_limit(
    spans: list[tuple[float, float]], live: list[tuple[int, float]], limit: float
) -> None:
    """The sweep's answer against the use itself, looked at on a fine grid: below the limit from then on for a
    moment, and never below it before; None only where the use never falls below it while the holdings run."""
    from gpupin.hostagent.policy import admit

    now, window = 10_000.0, 3600.0
    past = [(now - a - d, now - a) for a, d in spans if now - a > now - window]  # ended within the window
    held = [admit.Holding(1001, n, None, "h", since=now - ago) for n, ago in live]
    use = admit.used_seconds(past, held, window, now)
    if use < limit:
        return
    at = admit.frees_at(past, held, window, limit, now)
    grid = [now + window * k / 2000 for k in range(2001)]
    if at is None:
        assert all(admit.used_seconds(past, held, window, t) >= limit - 1e-6 for t in grid)
        return
    assert now <= at <= now + window
    assert admit.used_seconds(past, held, window, at) == pytest.approx(limit, abs=1e-6)
    assert all(admit.used_seconds(past, held, window, t) >= limit - 1e-6 for t in grid if t <= at)
    assert admit.used_seconds(past, held, window, min(at + 2.0, now + window)) < limit + 1e-6


def test_quota_counts_the_owner_the_agent_proves_not_a_label_or_a_name(tmp_path: Path) -> None:
    """Whose a holding is comes from the uid the agent created it for (the view's owner), whatever the container is
    called; a booking label on a container the agent did not create is a claim, counted for no one."""
    proven = {"uid": 1001, "name": "alice", "verified": True, "claimed_uid": None}
    claim = {"uid": None, "name": None, "verified": False, "claimed_uid": 1001}
    a = {"id": "a", "name": "uid-1002-s-job", "holds": True, "booking": {"uid": 1001, "since": 0}, "owner": proven}
    forged = {"id": "c", "name": "forged", "holds": True, "booking": {"uid": 1001, "since": 0}, "owner": claim}
    view = Listing.from_json(
        {
            "gpus": [
                {"holders": [a]},
                {"holders": [a, forged]},
                {"holders": [{"id": "b", "name": "other", "holds": True, "booking": None}]},
            ]
        }
    )
    held = queue.view_holdings(view)
    assert [(h.uid, h.cards, h.since) for h in held] == [(1001, 2, 0.0)]


def test_a_run_counts_the_holders_the_agent_proves() -> None:
    """Under the ledger lock, a run's quota counts a holder for the uid in the agent's owners, never its label's."""
    from gpupin.hostagent.ledger.booking import Booking
    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.policy import admit

    def holder(cid: str, uid: int) -> Holder:
        return Holder(cid, cid, "running", ["GPU-0"], True, "gpupin", booking=Booking(uid, 0, None))

    held = admit.holdings([holder("mine", 1001), holder("forged", 1001)], {}, {"mine": 1001})
    assert [(h.uid, h.name) for h in held] == [(1001, "mine")]
    assert admit.holdings([holder("forged", 1001)], {}, {}) == []


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "4h", 400 * 86400])
def test_a_run_request_with_a_bad_for_is_malformed(value: object) -> None:
    """The agent reads `for` from a caller's JSON: anything parse_duration could not give is refused (64)."""
    from gpupin.core.errors import UsageError
    from gpupin.hostagent.run import request_json
    from gpupin.hostagent.run.request import RunRequest

    sent = request_json.dump(RunRequest("img", ["true"], gpus=["0"], environ={}, book_for=3600))
    assert request_json.load(sent).book_for == 3600
    sent["for"] = value
    with pytest.raises(UsageError) as err:
        request_json.load(sent)
    assert err.value.exit_code == 64


def test_run_for_takes_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    from gpupin.hostagent.cli import main

    assert main(["run", "--for", "4 hours", "--gpu", "0", "img"]) == 64
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'4 hours' is not a duration" in err


def test_a_hand_set_booking_label_is_refused() -> None:
    from gpupin.core.errors import UsageError
    from gpupin.hostagent.run.request import RunRequest

    with pytest.raises(UsageError) as err:
        RunRequest("img", ["true"], gpus=["0"], environ={}, labels=["gpupin.booking=uid=0 since=0"])
    assert "hostagent writes gpupin.booking itself" in err.value.message and err.value.hint == (
        "remove it; --for DURATION sets the end"
    )
    # a compose service's label is a run's --for, judged for the caller
    with pytest.raises(UsageError) as err:
        RunRequest("img", ["true"], gpus=["0"], environ={}, labels=["gpupin.booking.for=30d"])
    assert "hostagent writes gpupin.booking.for itself" in err.value.message

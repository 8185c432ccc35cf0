"""The host's policy: bookings with a limit, quotas, idle rules and notification hooks, from one TOML file
(/etc/gpupin/policy.toml). The model and its parser, pure (no Docker, no NVML): the agent asks a `Policy` about a
caller by uid and groups, as the kernel gave them. `load_policy` names every mistake at once, an unknown key
included. Every key, and who a rule applies to: docs/policy.md.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys

from gpupin.core.errors import UsageError, printable
from gpupin.hostagent.ledger.booking import LONGEST_S as LONGEST_S  # the longest duration said anywhere
from gpupin.hostagent.ledger.booking import format_duration as format_duration  # how `ls` shows a time left
from gpupin.hostagent.ledger.booking import parse_duration as parse_duration  # --for, the policy, compose

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any, Literal, TypeAlias, TypeVar

    from gpupin.core import JSONObject

    T = TypeVar("T")  # a rule read per user and per group (Quota, BookingRule)
    # An edge: a table of the policy's TOML document as tomllib gave it, before it is read into the model.
    TOMLTable: TypeAlias = dict[str, Any]

DEFAULT_PATH = "/etc/gpupin/policy.toml"
PATH_VARIABLE = "GPUPIN_POLICY"  # another file than DEFAULT_PATH (tests; `serve --policy` says it for the agent)
FILE_LIMIT = 1 << 20  # a policy is a page of text; a megabyte is a mistake (or /dev/zero)
BEFORE_END_S = 15 * 60.0  # notify.before_end when absent


class PolicyError(UsageError):
    """A policy file with mistakes (exit 64): `mistakes` holds one line per mistake, `FILE:LINE: key: what`."""

    def __init__(self, path: str, mistakes: list[str]) -> None:
        n = len(mistakes)
        super().__init__(
            f"{printable(path)}: {n} mistake{'s' if n != 1 else ''}: {mistakes[0]}"
            + (f" (and {n - 1} more)" if n > 1 else ""),
            f"`hostagent policy check {printable(path)}` lists them all",
        )
        self.path = path
        self.mistakes = mistakes


def policy_path() -> str:
    """The policy file this host reads: GPUPIN_POLICY, else /etc/gpupin/policy.toml."""
    import os

    return os.environ.get(PATH_VARIABLE) or DEFAULT_PATH


# --- the model ---------------------------------------------------------------------------------------------------


class _Rule:
    """A value of the policy's model, equal, hashed and shown by its fields (`FIELDS`), never changed once made.
    Plain classes, not dataclasses: importing dataclasses (inspect, ast, dis and tokenize with it) and building
    these five with it took ~10 ms of every run without the agent, which reads the policy (docs/benchmarks.md)."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()  # in the order they are shown

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Rule)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self.FIELDS)})"

    def as_json(self) -> JSONObject:
        return {k: getattr(self, k) for k in self.FIELDS}


class Quota(_Rule):
    """What one caller may hold: cards at once, GPU-hours per day and per week, places in the queue. None: no
    limit."""

    __slots__ = FIELDS = ("cards", "gpu_hours_per_day", "gpu_hours_per_week", "waiters")

    def __init__(
        self,
        cards: int | None = None,
        gpu_hours_per_day: float | None = None,
        gpu_hours_per_week: float | None = None,
        waiters: int | None = None,
    ) -> None:
        self.cards = cards
        self.gpu_hours_per_day = gpu_hours_per_day
        self.gpu_hours_per_week = gpu_hours_per_week
        self.waiters = waiters


class BookingRule(_Rule):
    """A booking's length: the default when a run says no --for, and the longest --for (or --for plus extensions)."""

    __slots__ = FIELDS = ("default", "max")

    def __init__(self, default: float | None = None, max: float | None = None) -> None:
        self.default = default
        self.max = max


class IdleRule(_Rule):
    __slots__ = ("action", "after", "exempt", "grace")
    FIELDS = ("after", "action", "grace", "exempt")

    def __init__(
        self, after: float, action: Literal["warn", "stop"], grace: float, exempt: tuple[str, ...] = ()
    ) -> None:
        self.after = after
        self.action = action
        self.grace = grace
        self.exempt = exempt  # user names or uids, and @groups, whose containers may carry gpupin.idle=exempt


class NotifyRule(_Rule):
    __slots__ = ("before_end", "command", "webhook")
    FIELDS = ("command", "webhook", "before_end")

    def __init__(self, command: list[str] | None, webhook: str | None, before_end: float = BEFORE_END_S) -> None:
        self.command = command
        self.webhook = webhook
        self.before_end = before_end


class UsageRule(_Rule):
    """Who sees everyone's rows of the record through the agent's socket, beside root (anyone else: their own)."""

    __slots__ = FIELDS = ("readers",)

    def __init__(self, readers: tuple[str, ...] = ()) -> None:
        self.readers = readers  # user names or uids, and @groups


ENFORCE_MODES = ("off", "warn", "on")
# The escape baseline's parts (gpupin.hostagent.authz.judge.escapes), each denied unless [enforce] allow names it.
ESCAPES = ("privileged", "host-pid", "host-binds", "capabilities")


class EnforceRule(_Rule):
    """What the authorization plugin enforces at Docker's door (docs/authz.md): `mode` off (it judges nothing),
    warn (it allows and logs what it would deny), on; `grants`: under on, only creates carrying the agent's grant
    may take cards (false: any create that pins a free card may); `allow`: the parts of the escape baseline the
    host allows (ESCAPES)."""

    __slots__ = FIELDS = ("mode", "grants", "allow")

    def __init__(self, mode: str = "off", grants: bool = True, allow: tuple[str, ...] = ()) -> None:
        self.mode = mode
        self.grants = grants
        self.allow = allow


class Policy(_Rule):
    """The policy the agent enforces. Built by `load_policy` (or `Policy.empty()`), never changed: a reload makes a
    new one. Equal to another whatever file each was read from (`path`), and whatever it warned of (`warnings`)."""

    __slots__ = (
        "booking",
        "booking_groups",
        "booking_users",
        "enforce",
        "idle",
        "notify",
        "path",
        "quota_groups",
        "quota_users",
        "quotas",
        "usage",
        "warnings",
    )
    FIELDS = (
        "booking",
        "booking_users",
        "booking_groups",
        "quotas",
        "quota_users",
        "quota_groups",
        "idle",
        "notify",
        "usage",
        "enforce",
    )

    def __init__(
        self,
        booking: BookingRule | None = None,
        booking_users: Mapping[str, BookingRule] | None = None,
        booking_groups: Mapping[str, BookingRule] | None = None,
        quotas: Quota | None = None,
        quota_users: Mapping[str, Quota] | None = None,
        quota_groups: Mapping[str, Quota] | None = None,
        idle: IdleRule | None = None,
        notify: NotifyRule | None = None,
        usage: UsageRule | None = None,
        path: str | None = None,
        warnings: tuple[str, ...] = (),
        enforce: EnforceRule | None = None,
    ) -> None:
        self.booking = BookingRule() if booking is None else booking
        self.booking_users: Mapping[str, BookingRule] = {} if booking_users is None else booking_users
        self.booking_groups: Mapping[str, BookingRule] = {} if booking_groups is None else booking_groups
        self.quotas = Quota() if quotas is None else quotas
        self.quota_users: Mapping[str, Quota] = {} if quota_users is None else quota_users
        self.quota_groups: Mapping[str, Quota] = {} if quota_groups is None else quota_groups
        self.idle = idle
        self.notify = notify
        self.usage = UsageRule() if usage is None else usage
        self.enforce = EnforceRule() if enforce is None else enforce
        self.path = path  # the file it was read from; None: no file, nothing enforced
        # What is written but names no one here (a user or group this host no longer has): said, never a mistake. A
        # student who leaves must not turn the whole policy invalid at the next start.
        self.warnings = warnings

    @classmethod
    def empty(cls) -> Policy:
        return cls()

    @property
    def enforced(self) -> bool:
        """Whether anything at all is limited (bookings or quotas)."""
        return self != Policy.empty() and any(
            (
                self.booking != BookingRule(),
                self.booking_users,
                self.booking_groups,
                self.quotas != Quota(),
                self.quota_users,
                self.quota_groups,
            )
        )

    __hash__ = object.__hash__  # its tables are dicts

    # -- who a rule applies to --

    def _rules(
        self, users: Mapping[str, Any], groups: Mapping[str, Any], uid: int | None, gids: frozenset[int]
    ) -> list[Any]:
        """The caller's user table (as a one-item list), else its groups' tables; none for no one (uid None: a
        compose service's own label, which no one the kernel named wrote)."""
        if uid is None:
            return []
        if users:
            for key in _user_keys(uid):
                if key in users:
                    return [users[key]]
        if groups:
            return [groups[k] for g in sorted(gids) for k in _group_keys(g) if k in groups]
        return []

    def _pick(
        self, users: Mapping[str, Any], groups: Mapping[str, Any], top: Any, uid: int | None, gids: frozenset[int]
    ) -> Any:
        """Per field of a rule: the user's value, else the most generous of its groups' (None there is absent), else
        the top table's."""
        rules = self._rules(users, groups, uid, gids)
        values = {}
        for name in top.FIELDS:
            found = [getattr(r, name) for r in rules if getattr(r, name) is not None]
            values[name] = max(found) if found else getattr(top, name)
        return type(top)(**values)

    def booking_default(self, uid: int | None, gids: frozenset[int]) -> float | None:
        """The length of a booking that says no --for (None: unbounded), never past the caller's max."""
        rule: BookingRule = self._pick(self.booking_users, self.booking_groups, self.booking, uid, gids)
        longest = self.booking_max(uid, gids)
        if rule.default is None:
            return None
        return rule.default if longest is None else min(rule.default, longest)

    def booking_max(self, uid: int | None, gids: frozenset[int]) -> float | None:
        """The longest booking the caller may hold (--for, or --for plus extensions); None: no limit."""
        if uid == 0:
            return None
        rule: BookingRule = self._pick(self.booking_users, self.booking_groups, self.booking, uid, gids)
        return rule.max

    def quota(self, uid: int, gids: frozenset[int]) -> Quota:
        if uid == 0:
            return Quota()
        q: Quota = self._pick(self.quota_users, self.quota_groups, self.quotas, uid, gids)
        return q

    def may_exempt(self, uid: int, gids: frozenset[int]) -> bool:
        """Whether the caller's containers may carry the label gpupin.idle=exempt (root's always may)."""
        if uid == 0:
            return True
        if self.idle is None:
            return False
        return _named_in(self.idle.exempt, uid, gids)

    def may_read_usage(self, uid: int, gids: frozenset[int]) -> bool:
        """Whether the caller sees everyone's usage through the agent (root's always does); anyone else sees their
        own intervals alone: the record is root's, 0600."""
        return uid == 0 or _named_in(self.usage.readers, uid, gids)

    def summary(self) -> str:
        """One line: what the policy limits (policy check's OK line, the agent's log)."""
        parts = []
        b = self.booking
        if b.default is not None or b.max is not None:
            parts.append(
                "bookings "
                + ", ".join(
                    f"{k} {format_duration(v)}" for k, v in (("default", b.default), ("max", b.max)) if v is not None
                )
            )
        q = self.quotas
        quota = [f"{k} {getattr(q, k):g}" for k in q.FIELDS if getattr(q, k) is not None]
        if quota:
            parts.append("quota " + ", ".join(quota))
        n_over = len(self.booking_users) + len(self.booking_groups) + len(self.quota_users) + len(self.quota_groups)
        if n_over:
            parts.append(f"{n_over} user or group override{'s' if n_over != 1 else ''}")
        if self.idle is not None:
            parts.append(f"idle after {format_duration(self.idle.after)}: {self.idle.action}")
        if self.notify is not None:
            parts.append("notify " + " and ".join(k for k in ("command", "webhook") if getattr(self.notify, k)))
        if self.usage.readers:
            parts.append("usage readers " + ", ".join(self.usage.readers))
        e = self.enforce
        if e.mode != "off":
            parts.append(f"enforce {e.mode}" + ("" if e.grants else " (no grants)"))
        return "; ".join(parts) if parts else "nothing enforced"

    def as_json(self) -> JSONObject:
        """The policy as plain data (`policy check --json`, /api/info)."""
        return {
            "path": self.path,
            "booking": self.booking.as_json(),
            "booking_users": {k: v.as_json() for k, v in self.booking_users.items()},
            "booking_groups": {k: v.as_json() for k, v in self.booking_groups.items()},
            "quota": self.quotas.as_json(),
            "quota_users": {k: v.as_json() for k, v in self.quota_users.items()},
            "quota_groups": {k: v.as_json() for k, v in self.quota_groups.items()},
            "idle": self.idle.as_json() if self.idle else None,
            "notify": self.notify.as_json() if self.notify else None,
            "usage": {"readers": list(self.usage.readers)},
            "enforce": {"mode": self.enforce.mode, "grants": self.enforce.grants, "allow": list(self.enforce.allow)},
        }


def _named_in(names: Iterable[str], uid: int, gids: frozenset[int]) -> bool:
    """Whether a list of user names or uids and @groups (`idle.exempt`, `usage.readers`) names the caller."""
    caller = set(_user_keys(uid)) | {"@" + k for g in gids for k in _group_keys(g)}
    return any(n in caller for n in names)


def _user_keys(uid: int) -> list[str]:
    """How a policy may name this uid: its user name and its number."""
    import pwd

    keys = [str(uid)]
    with contextlib.suppress(KeyError):
        keys.insert(0, pwd.getpwuid(uid).pw_name)
    return keys


def _group_keys(gid: int) -> list[str]:
    import grp

    keys = [str(gid)]
    with contextlib.suppress(KeyError):
        keys.insert(0, grp.getgrgid(gid).gr_name)
    return keys


# --- the parser --------------------------------------------------------------------------------------------------


def _lines(text: str) -> dict[str, int]:
    """Where each key is written: dotted key -> line number (1-based), read from the text as written, so that a
    mistake can name its line (tomllib keeps none). Best effort: a key not found has no line."""
    where: dict[str, int] = {}
    table: list[str] = []
    header = re.compile(r"^\s*\[\[?\s*(.+?)\s*\]\]?\s*(#.*)?$")
    keyline = re.compile(
        r"^\s*((?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'))*)\s*="
    )
    for n, line in enumerate(text.splitlines(), 1):
        m = header.match(line)
        if m:
            table = _split_key(m[1])
            where.setdefault(".".join(table), n)
            continue
        m = keyline.match(line)
        if m:
            where.setdefault(".".join([*table, *_split_key(m[1])]), n)
    return where


def _split_key(text: str) -> list[str]:
    parts = re.findall(r"\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_-]+)", text)
    return [a or b or c for a, b, c in parts]


class _Mistakes:
    """Collects mistakes while the tables are read, each named by its dotted key and, where found, its line."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.where = _lines(text)
        self._found: list[tuple[int, str]] = []
        self._warned: list[tuple[int, str]] = []

    def wrong(self, key: str, what: str) -> None:
        self._found.append(self._placed(key, what))

    def warn(self, key: str, what: str) -> None:
        """Said, yet the policy is good: a name this host does not have (now) limits no one, and is kept."""
        self._warned.append(self._placed(key, what))

    def _placed(self, key: str, what: str) -> tuple[int, str]:
        line = self.where.get(key)
        if line is None:  # a key inside an inline table: name the table's line
            parent = key
            while "." in parent and line is None:
                parent = parent.rsplit(".", 1)[0]
                line = self.where.get(parent)
        place = f"{printable(self.path)}:{line}" if line else printable(self.path)
        return (line or 0, f"{place}: {printable(key)}: {what}")

    @property
    def mistakes(self) -> list[str]:
        """In the file's order."""
        return [m for _, m in sorted(self._found, key=lambda found: found[0])]

    @property
    def warnings(self) -> list[str]:
        return [m for _, m in sorted(self._warned, key=lambda found: found[0])]

    def table(self, data: Any, key: str, allowed: Iterable[str]) -> TOMLTable:
        if not isinstance(data, dict):
            self.wrong(key, f"must be a table, not {_kind(data)}")
            return {}
        known = set(allowed)
        for k in data:
            if k not in known:
                import difflib

                near = difflib.get_close_matches(k, sorted(known), 1)
                said = f"did you mean {near[0]}? " if near else ""
                self.wrong(f"{key}.{k}" if key else k, f"unknown key ({said}known here: {', '.join(sorted(known))})")
        return {k: v for k, v in data.items() if k in known}

    def duration(self, data: TOMLTable, key: str, name: str) -> float | None:
        if name not in data:
            return None
        try:
            return parse_duration(data[name])
        except ValueError as err:
            self.wrong(f"{key}.{name}", str(err))
            return None

    def count(self, data: TOMLTable, key: str, name: str) -> int | None:
        v = data.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            self.wrong(f"{key}.{name}", f"must be a whole number, 0 or more, not {_shown(v)}")
            return None
        return v

    def hours(self, data: TOMLTable, key: str, name: str) -> float | None:
        v = data.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            self.wrong(f"{key}.{name}", f"must be a number of hours, 0 or more, not {_shown(v)}")
            return None
        return float(v)


def _kind(v: Any) -> str:
    return {dict: "a table", list: "an array", str: "text", bool: "true or false"}.get(type(v), type(v).__name__)


def _shown(v: Any) -> str:
    return (
        repr(printable(v)) if isinstance(v, str) else printable(str(v)) if not isinstance(v, (dict, list)) else _kind(v)
    )


_QUOTA_KEYS = ("cards", "gpu_hours_per_day", "gpu_hours_per_week", "waiters")


def _quota(r: _Mistakes, data: Any, key: str, nested: bool) -> tuple[Quota, dict[str, Quota], dict[str, Quota]]:
    t = r.table(data, key, (*_QUOTA_KEYS, "user", "group") if nested else _QUOTA_KEYS)
    q = Quota(
        cards=r.count(t, key, "cards"),
        gpu_hours_per_day=r.hours(t, key, "gpu_hours_per_day"),
        gpu_hours_per_week=r.hours(t, key, "gpu_hours_per_week"),
        waiters=r.count(t, key, "waiters"),
    )
    users, groups = _per_name(r, t, key, nested, _quota)
    return q, users, groups


def _booking(
    r: _Mistakes, data: Any, key: str, nested: bool
) -> tuple[BookingRule, dict[str, BookingRule], dict[str, BookingRule]]:
    t = r.table(data, key, ("default", "max", "user", "group") if nested else ("default", "max"))
    rule = BookingRule(default=r.duration(t, key, "default"), max=r.duration(t, key, "max"))
    if rule.default is not None and rule.max is not None and rule.default > rule.max:
        r.wrong(f"{key}.default", f"{format_duration(rule.default)} is longer than max, {format_duration(rule.max)}")
    users, groups = _per_name(r, t, key, nested, _booking)
    return rule, users, groups


def _per_name(
    r: _Mistakes,
    t: TOMLTable,
    key: str,
    nested: bool,
    parse: Callable[[_Mistakes, Any, str, bool], tuple[T, Any, Any]],
) -> tuple[dict[str, T], dict[str, T]]:
    """A table's `user` and `group` sub-tables, each entry read by `parse` (not nested again): (users, groups)."""
    found: tuple[dict[str, T], dict[str, T]] = ({}, {})
    if nested:
        for kind, into in zip(("user", "group"), found, strict=True):
            for name, sub in _named(r, t.get(kind), f"{key}.{kind}", kind).items():
                into[name] = parse(r, sub, f"{key}.{kind}.{name}", False)[0]
    return found


def _named(r: _Mistakes, data: Any, key: str, kind: str) -> TOMLTable:
    """The entries of a `user` or `group` table. A name this host does not have is a warning, and its entry is kept
    (it applies again if the name comes back): a misspelt name limits no one, and is said, but a user deleted
    after the file was written must not make the whole policy a file with mistakes."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        r.wrong(key, f"must be a table of {kind} names, not {_kind(data)}")
        return {}
    out = {}
    for name, sub in data.items():
        if not _exists(kind, name):
            r.warn(f"{key}.{name}", f"no such {kind} on this host (now): this rule limits no one")
        out[name] = sub
    return out


def _exists(kind: str, name: str) -> bool:
    if name.isascii() and name.isdigit():
        return True
    import grp
    import pwd

    try:
        (pwd.getpwnam if kind == "user" else grp.getgrnam)(name)
    except (KeyError, ValueError):
        return False
    return True


def _idle(r: _Mistakes, data: Any) -> IdleRule | None:
    t = r.table(data, "idle", ("after", "action", "grace", "exempt"))
    after = r.duration(t, "idle", "after")
    if "after" not in t:
        r.wrong("idle", 'needs `after` (e.g. after = "30m")')
    action = t.get("action", "warn")
    if action not in ("warn", "stop"):
        r.wrong("idle.action", f'must be "warn" or "stop", not {_shown(action)}')
        action = "warn"
    grace = r.duration(t, "idle", "grace") if "grace" in t else 0.0
    names = _names(r, t, "idle.exempt", "it exempts no one")
    if after is None or grace is None:
        return None
    return IdleRule(after=after, action=action, grace=grace, exempt=names)


def _names(r: _Mistakes, t: TOMLTable, key: str, unknown: str) -> tuple[str, ...]:
    """An array of user names or uids and @groups (`idle.exempt`, `usage.readers`): a name this host does not have
    is a warning (`unknown` says what it then does), anything but text a mistake."""
    found = t.get(key.rsplit(".", 1)[1], [])
    names: list[str] = []
    if not isinstance(found, list):
        r.wrong(key, f"must be an array of user names and @groups, not {_kind(found)}")
        return ()
    for e in found:
        if not isinstance(e, str) or not e.strip("@"):
            r.wrong(key, f"holds {_shown(e)}: each item is a user name or uid, or @group")
            continue
        kind = "group" if e.startswith("@") else "user"
        if not _exists(kind, e.removeprefix("@")):
            r.warn(key, f"names {_shown(e)}: no such {kind} on this host (now): {unknown}")
        names.append(e)
    return tuple(names)


def _usage(r: _Mistakes, data: Any) -> UsageRule:
    t = r.table(data, "usage", ("readers",))
    return UsageRule(readers=_names(r, t, "usage.readers", "it shows them no one's usage"))


# Compiled when a policy names a webhook (re caches it), not at import: a run without the agent imports this module.
_LOOPBACK = r"^http://(127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|localhost|\[::1\])(:[0-9]{1,5})?(/[^\s]*)?$"


def _notify(r: _Mistakes, data: Any) -> NotifyRule | None:
    t = r.table(data, "notify", ("command", "webhook", "before_end"))
    command = t.get("command")
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command)
    ):
        r.wrong("notify.command", 'must be an array of words, the program first (e.g. ["/usr/local/bin/gpupin-hook"])')
        command = None
    elif command is not None and not command[0].startswith("/"):
        r.wrong(
            "notify.command",
            f"{_shown(command[0])}: the program is named by its absolute path (the agent runs as root)",
        )
        command = None
    hook = t.get("webhook")
    if hook is not None and (not isinstance(hook, str) or not re.match(_LOOPBACK, hook)):
        r.wrong("notify.webhook", f"must be a loopback http:// URL (127.0.0.1, localhost, [::1]), not {_shown(hook)}")
        hook = None
    before = r.duration(t, "notify", "before_end") if "before_end" in t else BEFORE_END_S
    if command is None and hook is None:
        if "command" not in t and "webhook" not in t:
            r.wrong("notify", "needs a command or a webhook")
        return None
    return NotifyRule(command=command, webhook=hook, before_end=before or BEFORE_END_S)


def _enforce(r: _Mistakes, data: Any) -> EnforceRule:
    t = r.table(data, "enforce", ("mode", "grants", "allow"))
    mode = t.get("mode", "off")
    if mode not in ENFORCE_MODES:
        r.wrong("enforce.mode", f"must be one of {', '.join(repr(m) for m in ENFORCE_MODES)}, not {_shown(mode)}")
        mode = "off"
    grants = t.get("grants", True)
    if not isinstance(grants, bool):
        r.wrong("enforce.grants", f"must be true or false, not {_shown(grants)}")
        grants = True
    allow = t.get("allow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) and a in ESCAPES for a in allow):
        r.wrong("enforce.allow", f"must be an array of {', '.join(repr(e) for e in ESCAPES)}, not {_shown(allow)}")
        allow = []
    return EnforceRule(mode=mode, grants=grants, allow=tuple(dict.fromkeys(allow)))


def parse_policy(text: str, path: str = "<policy>") -> Policy:
    """A policy from the TOML text of `path`; PolicyError with every mistake."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the host extra installs tomli there
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise PolicyError(path, [f"{printable(path)}: nests too deeply to be read"]) from None
    except ValueError as err:  # tomllib.TOMLDecodeError, with its line and column
        raise PolicyError(path, [f"{printable(path)}: not valid TOML: {printable(str(err))}"]) from None
    r = _Mistakes(path, text)
    top = r.table(data, "", ("booking", "quota", "idle", "notify", "usage", "enforce"))
    booking, booking_users, booking_groups = _booking(r, top.get("booking", {}), "booking", nested=True)
    quotas, quota_users, quota_groups = _quota(r, top.get("quota", {}), "quota", nested=True)
    idle = _idle(r, top["idle"]) if "idle" in top else None
    notify = _notify(r, top["notify"]) if "notify" in top else None
    usage = _usage(r, top["usage"]) if "usage" in top else UsageRule()
    enforce = _enforce(r, top["enforce"]) if "enforce" in top else EnforceRule()
    if r.mistakes:
        raise PolicyError(path, r.mistakes)
    return Policy(
        booking=booking,
        booking_users=booking_users,
        booking_groups=booking_groups,
        quotas=quotas,
        quota_users=quota_users,
        quota_groups=quota_groups,
        idle=idle,
        notify=notify,
        usage=usage,
        path=path,
        warnings=tuple(r.warnings),
        enforce=enforce,
    )


def host_policy(warn: Callable[[str], None]) -> Policy:
    """This host's policy where a command reads it itself (a run without the agent, `compose render`): its file, or
    none when there is no file; one this user cannot read, or with mistakes, is said through `warn` and enforces
    nothing here (the agent keeps its last good one)."""
    import errno

    from gpupin.core.errors import GpupinError
    from gpupin.core.files import FileRefused

    try:
        return load_policy(policy_path())
    except FileRefused as err:
        if err.errno != errno.ENOENT:  # no file: no policy; one this user cannot read is said
            warn(f"warning: the policy is not applied: {err.message}")
    except GpupinError as err:
        warn(f"warning: the policy is not applied: {err.message}")
    return Policy.empty()


def load_policy(path: str) -> Policy:
    """The policy in `path`: PolicyError (64) with every mistake; FileRefused (64) when it cannot be read (a missing
    file too: a caller for whom no file means no policy checks that first)."""
    return read_policy(path)[0]


def read_policy(path: str) -> tuple[Policy, str]:
    """load_policy, and the text it was read from (the agent saves the last good one: serve.policy_in_force)."""
    from gpupin.core.files import FileRefused, read_bounded

    raw = read_bounded(path, FILE_LIMIT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileRefused(path, f"it is not UTF-8 text (byte {err.start})", "save the file as UTF-8") from None
    return parse_policy(text, path), text


def check_policy(path: str) -> list[str]:
    """Every mistake of the file at `path`, one line each; [] when it is a good policy."""
    try:
        load_policy(path)
    except PolicyError as err:
        return err.mistakes
    except UsageError as err:  # FileRefused: cannot be read
        return [err.message]
    return []

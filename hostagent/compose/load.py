"""Reading a compose file: bytes, then text, then YAML, then a plain tree; every limit is here, once (size,
encoding, depth, alias expansion, duplicate keys, tags: docs/compose.md, "Bad input").

Scalars are read as compose v2 reads them (YAML 1.2), the tool whose `config` is the model here. The result is
a tree in which every alias is its own copy, so that pinning one service never changes another that shared an
anchor with it.
"""

from __future__ import annotations

import os
import re

from gpupin.core import files
from gpupin.core.errors import UsageError
from gpupin.hostagent import INSTALL_HINT
from gpupin.hostagent.compose.problems import ServiceError, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_EXPANDED = 4_000_000  # nodes + scalar characters with every alias expanded; an alias-free 1 MiB file stays under
_FIX_YAML = "fix the YAML (`docker compose -f FILE config` shows what compose reads)"
_TAGS = ("str", "int", "float", "bool", "null", "map", "seq", "merge", "timestamp")  # merge: `<<`


class _Reset:
    """`!reset`: the key is dropped, whatever the files before it said."""

    def __repr__(self) -> str:
        return "RESET"


RESET = _Reset()


class Override:
    """`!override VALUE`: VALUE replaces what the files before it said, instead of being merged into it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Override({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Override) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise UsageError("PyYAML is not installed", INSTALL_HINT) from None
    return yaml


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "an unknown place"


def _refuse(message: str, hint: str) -> ServiceError:
    return ServiceError(None, message, hint)


_LOADER: Any = None


def _loader() -> Any:
    """The loader class (built once): PyYAML's safe loader with the limits and rules above."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    _yaml()  # a clear error when PyYAML is missing
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.nodes import ScalarNode
    from yaml.resolver import Resolver

    try:
        from yaml._yaml import CParser

        bases: tuple[type, ...] = (Composer, CParser)

        def events(loader: Any, stream: str) -> None:
            CParser.__init__(loader, stream)
    except ImportError:  # PyYAML without libyaml: the pure-Python reader, scanner and parser
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        bases = (Composer, Reader, Scanner, Parser)

        def events(loader: Any, stream: str) -> None:
            Reader.__init__(loader, stream)
            Scanner.__init__(loader)
            Parser.__init__(loader)

    class Resolver12(Resolver):
        """PyYAML's resolver with YAML 1.2's booleans and floats, as compose v2 reads them."""

    bool_tag, float_tag = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
    Resolver12.yaml_implicit_resolvers = {
        k: [(tag, r) for tag, r in v if tag not in (bool_tag, float_tag)]
        for k, v in Resolver.yaml_implicit_resolvers.items()
    }
    Resolver12.add_implicit_resolver(bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    Resolver12.add_implicit_resolver(
        float_tag,
        re.compile(
            r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)|[-+]?[0-9][0-9_]*\.[0-9_]*|[-+]?\.[0-9_]+"
            r"(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+0123456789."),
    )

    class Loader(*bases, SafeConstructor, Resolver12):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            events(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver12.__init__(self)
            self._depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise _refuse(
                        f"its YAML nests deeper than {MAX_DEPTH} levels (at {_where(self.peek_event().start_mark)})",
                        "compose files nest a few levels deep: check the brackets and indentation",
                    )
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_mapping_node(self, anchor: Any) -> Any:
            node = super().compose_mapping_node(anchor)
            seen: dict[tuple[str, str], Any] = {}
            for key, _ in node.value:
                if not isinstance(key, ScalarNode):
                    continue
                first = seen.setdefault((key.tag, key.value), key)
                if first is not key:
                    hint = (
                        "merge several anchors with one key: `<<: [*a, *b]`"
                        if key.value == "<<"
                        else "keep one of them"
                    )
                    raise _refuse(
                        f"the key {quoted(key.value)} is given twice in one mapping (at {_where(first.start_mark)} "
                        f"and {_where(key.start_mark)}): compose v2 refuses that, and docker-compose 1.x silently "
                        "keeps the last one",
                        hint,
                    )
            return node

        def get_single_node(self) -> Any:
            node = super().get_single_node()
            if node is not None:
                _weigh(node)
            return node

    def keep_text(base: Any) -> Any:
        def construct(loader: Any, node: Any) -> Any:
            if ":" in str(node.value):
                return loader.construct_scalar(node)  # YAML 1.1's base 60: text in YAML 1.2 and here
            try:
                value = base(loader, node)
            except ValueError:  # more digits than Python converts: not a number compose could use
                return loader.construct_scalar(node)
            if isinstance(value, int) and value.bit_length() > 63:
                return loader.construct_scalar(node)  # no compose field takes it; its repr could be huge
            return value

        return construct

    def undefined(loader: Any, node: Any) -> Any:
        tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
        if tag == "!reset":
            return RESET
        if tag == "!override":
            build = {"mapping": loader.construct_mapping, "sequence": loader.construct_sequence}.get(
                node.id, lambda n, deep: loader.construct_scalar(n)
            )
            return Override(build(node, deep=True))
        hint = (
            "remove it: compose files hold text, numbers, booleans, lists and mappings, and compose v2 "
            "reads !reset and !override"
        )
        raise _refuse(f"the YAML tag {quoted(tag)} (at {_where(node.start_mark)}) is not one compose files use", hint)

    Loader.yaml_constructors = {
        t: c for t, c in SafeConstructor.yaml_constructors.items() if t is not None and t.rsplit(":", 1)[-1] in _TAGS
    }
    add = Loader.add_constructor
    add("tag:yaml.org,2002:int", keep_text(SafeConstructor.construct_yaml_int))
    add("tag:yaml.org,2002:float", keep_text(SafeConstructor.construct_yaml_float))
    add(None, undefined)
    _LOADER = Loader
    return Loader


def _weigh(root: Any) -> None:
    """Refuse a node graph that contains itself, expands past MAX_EXPANDED, or nests deeper than MAX_DEPTH once
    its aliases are expanded. Aliases are shared nodes here, so this walk is as long as the file, whatever the
    expansion: each node is weighed once."""
    weight: dict[int, tuple[int, int]] = {}  # node -> (expanded size, expanded depth)
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if node.id == "scalar":
            weight[id(node)] = (1 + len(node.value), 1)
            continue
        children = [n for pair in node.value for n in pair] if node.id == "mapping" else list(node.value)
        if done:
            on_path.discard(id(node))
            size = 1 + sum(weight[id(c)][0] for c in children)
            depth = 1 + max((weight[id(c)][1] for c in children), default=0)
            weight[id(node)] = (size, depth)
            if size > MAX_EXPANDED:
                raise _refuse(
                    f"its YAML aliases expand it to more than {MAX_EXPANDED:,} nodes and characters "
                    f"(at {_where(node.start_mark)}): a YAML alias bomb, or aliases of aliases",
                    "write repeated values with one anchor and plain aliases, or write them out",
                )
            if depth > MAX_DEPTH:
                raise _refuse(
                    f"its YAML aliases nest it deeper than {MAX_DEPTH} levels (at {_where(node.start_mark)})",
                    "use aliases of plain values, not aliases of aliases",
                )
            continue
        if id(node) in weight:  # met before through another alias
            continue
        on_path.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise _refuse(
                    f"a YAML alias (at {_where(child.start_mark)}) refers to a node that contains it",
                    "an anchor cannot be used inside itself",
                )
            if id(child) not in weight:
                stack.append((child, False))


def _tree(value: Any) -> Any:
    """A copy in which no mapping or list is shared (aliases become copies); _weigh bounded its depth."""
    if isinstance(value, dict):
        return {k: _tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree(v) for v in value]
    if isinstance(value, Override):
        return Override(_tree(value.value))
    return value


def parse(text: str) -> Any:
    """The YAML document as a tree, or ServiceError(None, ...) that says where and why."""
    yaml = _yaml()
    try:
        doc = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        if getattr(err, "context", None) and "expected a single document" in err.context:
            what = "it holds more than one YAML document (`---`)"
        lines = text.splitlines()
        tab = mark is not None and mark.line < len(lines) and "\t" in lines[mark.line]
        hint = "indent with spaces: YAML does not allow tabs there" if tab else _FIX_YAML
        raise _refuse(f"not valid YAML: {what} (at {_where(mark)})", hint) from None
    if doc is None:
        raise _refuse(
            "it holds no YAML document (it is empty, or only comments)",
            "a compose file is a mapping with a `services:` key",
        )
    return _tree(doc)


def decode(data: bytes) -> str:
    """UTF-8 text (a BOM dropped), or ServiceError(None, ...) naming the first byte that is not."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise _refuse("it is UTF-16 text, not UTF-8", "save it as UTF-8, the encoding compose files use")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise _refuse(
            f"it is not UTF-8 text (byte 0x{data[err.start]:02x} at line {line}, column {column})",
            "save it as UTF-8, the encoding compose files use",
        ) from None


def read(path: str) -> bytes:
    """At most MAX_BYTES of the file, or ServiceError(None, ...): a FIFO, a device or /dev/zero is refused at once,
    never waited on (gpupin.core.files.read_bounded)."""
    if os.path.isdir(path):
        raise _refuse("it is a directory, not a compose file", "give the compose file itself (e.g. DIR/compose.yaml)")
    try:
        return files.read_bounded(path, MAX_BYTES)
    except files.FileRefused as err:
        if err.reason.startswith("it is larger than"):
            raise _refuse(
                f"it is larger than {MAX_BYTES >> 10} KiB, far beyond any compose file",
                "check that it is the compose file",
            ) from None
        raise _refuse(err.reason, err.hint or "give the path of a readable compose file") from None


def load(path: str) -> Any:
    """The compose file at `path` as a tree (bytes, text and YAML, with the limits above)."""
    return parse(decode(read(path)))


def larger_than(tree: Any, limit: int) -> bool:
    """Whether a tree (aliases already copies) weighs more than `limit` nodes and scalar characters, as _weigh
    counts them; the walk stops at the limit, so a tree of gigabytes costs no more than one of `limit`."""
    size = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        size += 1 + (len(node) if isinstance(node, str) else 0)
        if size > limit:
            return True
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def dump(doc: Any) -> str:
    """The tree as YAML both compose versions read alike: text that either YAML 1.1 (docker-compose 1.x) or YAML
    1.2 (compose v2) would read as something else is quoted (`yes`, `1e3`, `22:22`); keys keep their order."""
    yaml = _yaml()

    class Dumper(yaml.SafeDumper):  # type: ignore[name-defined,misc]
        pass

    Dumper.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
    )
    text: str = yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096)
    return text

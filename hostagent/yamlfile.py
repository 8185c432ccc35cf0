"""YAML read with limits, for every YAML file hostagent reads that a user or anyone who can write a folder wrote
(compose files, CDI specs): PyYAML's safe loader with a depth limit, aliases weighed before any walk (a "billion
laughs" file is refused), duplicate keys refused, scalars read as YAML 1.2 (compose v2's go-yaml v3), only the tags
compose files use; the result a tree in which every alias is its own copy (docs/compose.md, "Bad input")."""

from __future__ import annotations

import re

from gpupin.core.errors import UsageError, quoted
from gpupin.hostagent import INSTALL_HINT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    # An edge: a mapping of a YAML document (a compose file, a service in it) as loaded, read and rewritten as a
    # document: compose keeps every key it does not know.
    YAMLMapping: TypeAlias = dict[str, Any]

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


def yaml_module() -> Any:
    try:
        import yaml
    except ImportError:
        raise UsageError("PyYAML is not installed", INSTALL_HINT) from None
    return yaml


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "an unknown place"


class YamlRefused(UsageError):
    """YAML that is refused: where and why (compose names the file it came from)."""


def _refuse(message: str, hint: str) -> YamlRefused:
    return YamlRefused(message, hint)


_LOADER: Any = None


def _loader() -> Any:
    """The loader class (built once): PyYAML's safe loader with the limits and rules above."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    yaml_module()  # a clear error when PyYAML is missing
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
    """The YAML document as a tree, or YamlRefused that says where and why."""
    yaml = yaml_module()
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

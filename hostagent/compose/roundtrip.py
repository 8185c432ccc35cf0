"""The lossless writer of `compose render`: the source text edited where the pin changes it, and nowhere else.

PyYAML's tree (hostagent.compose.load) forgets comments, quoting and spellings, so ruamel.yaml re-reads text
that load already accepted and `edit` applies only the difference the pin made, key by key. A node several
services share (an anchor, a `<<:` source) is never edited in place: the service gets its own copy first
(docs/compose.md, "The rendered file is the source, with only the GPU keys changed").
"""

from __future__ import annotations

import copy
import io
import re

from gpupin.hostagent.compose.problems import ServiceError, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

HEADER = "# Rendered by `hostagent compose render"
_NESTED = re.compile(r"^( *)(- +)?([^\s#][^#]*?):\s*(#.*)?$")  # a block key whose value is on the next lines


def without_header(text: str) -> str:
    """The text without the header comment of an earlier render, which ends at the first empty line (a rendered
    file renders to itself)."""
    if not text.startswith(HEADER):
        return text
    lines = text.splitlines(keepends=True)
    first = next((i for i, ln in enumerate(lines) if not ln.startswith("#")), len(lines))
    return "".join(lines[first + (first < len(lines) and not lines[first].strip()) :])


def _yaml() -> Any:
    try:
        from ruamel.yaml import YAML
    except ImportError:
        from gpupin.core.errors import UsageError

        raise UsageError(
            "ruamel.yaml is not installed (compose render keeps the file as written through it)",
            "install the host side: pip install 'gpupin[host]'",
        ) from None
    return YAML


def indentation(text: str) -> tuple[int, int, int]:
    """(mapping indent, sequence indent, dash offset) as the file writes them, for ruamel's `indent()`: the first
    nested mapping and the first nested block sequence decide; a file without them gets compose's usual 2."""
    mapping = sequence = offset = None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for above, below in zip(lines, lines[1:]):
        m = _NESTED.match(above)
        if m is None:
            continue
        column = len(m.group(1)) + len(m.group(2) or "")
        inner = len(below) - len(below.lstrip(" "))
        if inner <= column and not below.lstrip().startswith("- "):
            continue
        if below.lstrip().startswith("- "):
            if offset is None and inner >= column:
                offset = inner - column
                dash = below.lstrip()
                sequence = offset + len(dash) - len(dash[1:].lstrip(" "))
        elif mapping is None:
            mapping = inner - column
        if mapping is not None and offset is not None:
            break
    mapping = mapping or 2
    if offset is None:
        return mapping, mapping, 0
    return mapping, max(sequence or 2, offset + 2), offset


def _reader(text: str) -> Any:
    yaml = _yaml()(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # long lines stay on one line, as written
    mapping, sequence, offset = indentation(text)
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    return yaml


def _merged(node: Any) -> list[Any]:
    """The mappings a `<<:` of this mapping brings, in order (ruamel.yaml before 0.18.7 keeps (position, mapping)
    pairs, later ones a MergeValue)."""
    from ruamel.yaml.comments import merge_attrib

    return [m[1] if isinstance(m, tuple) else m for m in getattr(node, merge_attrib, None) or ()]


def _own_keys(node: Any) -> set[Any]:
    """The keys written in the mapping itself (a `<<:` brings the others)."""
    return {k for k, _ in node.non_merged_items()}


def _children(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        yield from node.values()  # merged keys included: a merged value is the source's own node
        yield from _merged(node)
    elif isinstance(node, list):
        yield from node


def _references(root: Any) -> dict[int, int]:
    """How many places refer to each mapping or list (aliases, merge sources and merged keys count)."""
    count: dict[int, int] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in _children(node):
            if isinstance(child, (dict, list)):
                count[id(child)] = count.get(id(child), 0) + 1
                if count[id(child)] == 1:
                    stack.append(child)
    return count


def _keep_anchors(root: Any) -> None:
    """Write every anchor the source wrote, aliased or not (ruamel drops an anchor nothing refers to)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        anchor = getattr(node, "anchor", None)
        if anchor is not None and anchor.value:
            anchor.always_dump = True
        stack.extend(c for c in _children(node) if hasattr(c, "anchor"))


def _private(node: Any) -> Any:
    """A copy that shares no mapping or list with the tree and defines no anchor (a second definition would
    rebind the aliases after it); comments and styles come along, `<<:` sources stay the shared originals."""
    from ruamel.yaml.comments import Comment, CommentedMap, CommentedSeq, Format, LineCol, merge_attrib

    try:
        from ruamel.yaml.tag import Tag
    except ImportError:  # ruamel.yaml before 0.17.22
        from ruamel.yaml.comments import Tag  # type: ignore[attr-defined,no-redef,unused-ignore]

    if isinstance(node, CommentedMap):
        out: Any = CommentedMap()
        for key, value in node.non_merged_items():
            out[key] = _private(value)
        sources = getattr(node, merge_attrib, None)
        if sources:  # the same sources (never edited), in a merge of the copy's own
            out.add_yaml_merge(copy.copy(sources))
    elif isinstance(node, CommentedSeq):
        out = CommentedSeq(_private(v) for v in node)
    else:
        return node
    for attrib in (Comment.attrib, Format.attrib, LineCol.attrib, Tag.attrib):
        if hasattr(node, attrib):
            setattr(out, attrib, copy.deepcopy(getattr(node, attrib)))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as the plain tree has them, bools and numbers apart (True == 1 in Python, not in YAML)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _scalar(value: Any) -> Any:
    """A new scalar that both compose versions read as the plain tree has it: text that YAML 1.1 or 1.2 would
    read as something else (`yes`, `0777`, `1e3`, base-60 `12:30`) is quoted (ruamel quotes what YAML's syntax
    needs)."""
    if not isinstance(value, str):
        return value
    import yaml
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    try:
        plain_11 = yaml.safe_load(value) if value else ""
    except yaml.YAMLError:
        return DoubleQuotedScalarString(value)
    looks_12 = re.fullmatch(
        r"[-+]?(\.inf|\.nan|[0-9][0-9_]*(\.[0-9]*)?([eE][-+]?[0-9]+)?|0o[0-7]+|0x[0-9a-fA-F]+)"
        r"|true|false|null|~",
        value,
        re.IGNORECASE,
    )
    if plain_11 != value or looks_12 or value != value.strip():
        return DoubleQuotedScalarString(value)
    return value


def _new(value: Any) -> Any:
    """A plain value as ruamel nodes (block mappings and lists), its text quoted where it has to be."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, dict):
        out = CommentedMap()
        for k, v in value.items():
            out[_scalar(k)] = _new(v)
        return out
    if isinstance(value, list):
        return CommentedSeq(_new(v) for v in value)
    return _scalar(value)


class _Editor:
    """Applies plain differences to the ruamel tree, copying a shared node before it is changed."""

    def __init__(self, root: Any) -> None:
        self.refs = _references(root)

    def shared(self, node: Any) -> bool:
        return self.refs.get(id(node), 0) > 1

    def own(self, node: Any, key: Any) -> Any:
        """node[key] as a node only this path holds: a merged or shared value becomes a private copy."""
        child = node[key]
        inherited = isinstance(node, dict) and key not in _own_keys(node)
        if isinstance(child, (dict, list)) and (inherited or self.shared(child)):
            child = _private(child)
            node[key] = child
        elif inherited:
            node[key] = child
        return child

    def unmerge(self, node: Any) -> None:
        """Write the keys `<<:` brings as the mapping's own, and drop the `<<:`."""
        from ruamel.yaml.comments import merge_attrib

        own = _own_keys(node)
        for key in list(node):
            if key not in own:
                self.own(node, key)
        delattr(node, merge_attrib)

    def prepare(self, node: Any, old: dict[Any, Any], new: dict[Any, Any]) -> None:
        """Before any edit: the keys this mapping changes become its own, private nodes."""
        own = _own_keys(node)
        for key in old:  # a key to drop that a `<<:` brings would still be read through it
            if key not in new and key in node and (key not in own or any(key in m for m in _merged(node))):
                self.unmerge(node)
                break
        for key in set(old) | set(new):
            if key in node and not _same(old.get(key, _MISSING), new.get(key, _MISSING)):
                self.own(node, key)

    def apply(self, node: Any, old: Any, new: Any) -> Any:
        """`node` (ruamel) changed as `old` (plain) became `new` (plain); what to put in its place."""
        if _same(old, new):
            return node
        if isinstance(node, dict) and isinstance(old, dict) and isinstance(new, dict):
            for key in [k for k in old if k not in new]:
                if any(key in m for m in _merged(node)):
                    self.unmerge(node)
                if key in node:
                    del node[key]
            for key, value in new.items():
                if key in old and _same(old[key], value):
                    continue  # untouched, even where ruamel reads the key otherwise (`NO:` is False to PyYAML)
                if key not in old or key not in node:
                    node[_scalar(key)] = _new(value)
                elif not _same(old[key], value):
                    child = self.own(node, key)
                    replaced = self.apply(child, old[key], value)
                    if replaced is not child:
                        node[key] = replaced
            return node
        if isinstance(node, list) and isinstance(old, list) and isinstance(new, list) and not self.shared(node):
            return self.apply_list(node, old, new)
        return _new(new)

    def apply_list(self, node: Any, old: list[Any], new: list[Any]) -> Any:
        """Entries that stay keep their own node (quotes, style); changed mappings are edited at their place."""
        items: list[Any] = []
        unused = list(range(len(old)))
        for i, value in enumerate(new):
            match = next((j for j in unused if _same(old[j], value)), None)
            if match is not None:
                unused.remove(match)
                items.append(node[match])
            elif len(old) == len(new) and isinstance(value, dict) and isinstance(old[i], dict) and i in unused:
                unused.remove(i)
                items.append(self.apply(self.own(node, i), old[i], value))
            else:
                items.append(_new(value))
        node[:] = items
        return node


_MISSING = object()


def edit(text: str, before: dict[Any, Any], after: dict[Any, Any]) -> str:
    """`text` changed as its plain tree changed from `before` to `after` (what load read, and what the pin made
    of it); the rest of the text as written."""
    from ruamel.yaml.error import YAMLError

    yaml = _reader(text)
    try:
        root = yaml.load(text)
    except YAMLError as err:  # load accepted it: a reading the two libraries do not share
        raise ServiceError(
            None,
            f"ruamel.yaml cannot read it as PyYAML does ({str(err).splitlines()[0]})",
            "report it with the file; meanwhile write the file in plain block style",
        ) from None
    _keep_anchors(root)
    try:
        _apply(root, before, after)
    except KeyError as err:  # a key the two libraries read differently (`on`, `0o17` under `%YAML 1.1`)
        raise ServiceError(
            None,
            f"the key {quoted(err.args[0] if err.args else None)} reads differently in the YAML library that edits "
            "the file (a `%YAML 1.1` directive makes `on`, `yes`, `0o17`... booleans or numbers there)",
            "quote the key, or drop the `%YAML 1.1` directive (compose v2 reads YAML 1.2)",
        ) from None
    out = io.StringIO()
    yaml.dump(root, out)
    return out.getvalue()


def _apply(root: Any, before: dict[Any, Any], after: dict[Any, Any]) -> None:
    editor = _Editor(root)
    old, new = before.get("services") or {}, after.get("services") or {}
    changed = [n for n in new if n in old and not _same(old[n], new[n])]
    if changed:
        svcs = editor.own(root, "services")
        for name in changed:  # every copy is made before any edit, from what each service read
            editor.own(svcs, name)
            editor.prepare(svcs[name], old[name], new[name])
        for name in changed:
            svcs[name] = editor.apply(svcs[name], old[name], new[name])
    rest = {k: v for k, v in before.items() if k != "services"}
    editor.apply(root, rest, {k: v for k, v in after.items() if k != "services"})

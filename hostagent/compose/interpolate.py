"""Variables in compose files, as compose substitutes them: `.env` files and `${VAR}`, `${VAR:-default}`,
`${VAR:?message}`, `${VAR:+other}` (and their forms without `:`) and `$$`, in every value, extension keys
included; keys are not substituted. The environment wins over the `.env` file (docs/compose.md, "Projects").
"""

from __future__ import annotations

import re

from gpupin.hostagent.compose.load import Override
from gpupin.hostagent.compose.problems import ServiceError, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


def _closing(text: str, start: int) -> int:
    """The index of the `}` that closes the `${` before `start` (nested `${...}` counted), or -1."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _braced(body: str, variables: Mapping[str, str], text: str) -> str:
    m = _NAME.match(body)
    if m is None:
        raise ServiceError(
            None,
            f"invalid variable {quoted('${' + body + '}')} in {quoted(text)}",
            "write ${NAME}, ${NAME:-default} or ${NAME?message}; $$ for a literal $",
        )
    name, rest = m.group(), body[m.end() :]
    if not rest:
        return variables.get(name, "")
    op = next((o for o in _OPERATORS if rest.startswith(o)), None)
    if op is None:
        raise ServiceError(
            None,
            f"invalid variable {quoted('${' + body + '}')} in {quoted(text)}",
            "write ${NAME}, ${NAME:-default} or ${NAME?message}; $$ for a literal $",
        )
    arg = rest[len(op) :]
    value = variables.get(name)
    present = value is not None and (value != "" or ":" not in op)
    if op.endswith("-"):
        return value if present and value is not None else substitute(arg, variables)
    if op.endswith("?"):
        if present and value is not None:
            return value
        raise ServiceError(
            None,
            f"the variable {name} is required{': ' + arg if arg else ''} (in {quoted(text)})",
            f"set {name} in the environment or in the .env file",
        )
    return substitute(arg, variables) if present else ""


def substitute(text: str, variables: Mapping[str, str]) -> str:
    """`text` with its variables substituted, or ServiceError(None, ...) for a required one that is unset."""
    if "$" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        j = text.find("$", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        if text.startswith("$$", j):
            out.append("$")
            i = j + 2
        elif text.startswith("${", j):
            end = _closing(text, j + 2)
            if end < 0:
                raise ServiceError(
                    None, f"an unclosed ${{ in {quoted(text)}", "close it with }, or write $$ for a literal $"
                )
            out.append(_braced(text[j + 2 : end], variables, text))
            i = end + 1
        else:
            m = _NAME.match(text, j + 1)
            if m is None:
                out.append("$")
                i = j + 1
            else:
                out.append(variables.get(m.group(), ""))
                i = m.end()
    return "".join(out)


def tree(value: Any, variables: Mapping[str, str]) -> Any:
    """A copy of a compose tree with every string value substituted (keys are kept as written)."""
    if isinstance(value, dict):
        return {k: tree(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [tree(v, variables) for v in value]
    if isinstance(value, Override):
        return Override(tree(value.value, variables))
    if isinstance(value, str):
        return substitute(value, variables)
    return value


def escaped(value: Any) -> Any:
    """A copy with every `$` of a string written `$$`: a model that was substituted, written for compose to read
    again, must not be substituted twice."""
    if isinstance(value, dict):
        return {k: escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escaped(v) for v in value]
    if isinstance(value, str):
        return value.replace("$", "$$")
    return value


def unescaped(value: Any) -> Any:
    """The inverse of `escaped`: compose's `config` writes each literal `$` as `$$`."""
    if isinstance(value, dict):
        return {k: unescaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unescaped(v) for v in value]
    if isinstance(value, str):
        return value.replace("$$", "$")
    return value


def dotenv(text: str, variables: Mapping[str, str]) -> dict[str, str]:
    """A `.env` file: KEY=VALUE lines (`export` allowed, `#` comments, quotes); unquoted and double-quoted values
    may use the variables before them. A refusal names the line by number and never shows its text (the file may be
    one the reader of the message may not read)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not _NAME.fullmatch(key):
            raise ServiceError(  # the line itself is not shown: errors never echo a file's content
                None,
                f"line {number} is not KEY=VALUE",
                "write one KEY=VALUE a line (# starts a comment)",
            )
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            out[key] = value[1:-1]
            continue
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace("\\n", "\n").replace('\\"', '"')
        else:
            value = re.sub(r"\s+#.*$", "", value)
        try:
            out[key] = substitute(value, {**out, **variables}) if sep else ""
        except ServiceError:
            raise ServiceError(
                None,
                f"line {number}: a variable in its value is malformed or required and unset",
                "write ${NAME}, ${NAME:-default} or ${NAME?message}; $$ for a literal $",
            ) from None
    return out

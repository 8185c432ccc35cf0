"""JSON on hostagent's wire (the resident agent's socket, the Engine API), through the C codec that the standard
library's json module uses itself, without importing json: json's import compiles its regular expressions, and
with `re` that is about 9 ms of `hostagent run`'s start-up through the agent (docs/benchmarks.md). The results
are json.loads's and json.dumps's with their defaults; a malformed text raises json's JSONDecodeError (a
ValueError: json is imported then). Where CPython's _json is missing, json itself does it all."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"  # json's whitespace around a document


class _Decoder:
    """What json.decoder.JSONDecoder gives the C scanner: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, Any] = {}  # noqa: RUF012 (the scanner's own: it keeps none between calls)

    @staticmethod
    def parse_constant(name: str) -> float:
        return float({"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[name])


def _unserializable(o: object) -> Any:
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


_scan: Any = None
_encode: Any = None
try:
    from _json import encode_basestring_ascii, make_encoder, make_scanner

    _scan = make_scanner(_Decoder())  # type: ignore[arg-type]  # the context is duck-typed (its attributes)
    # json.dumps's defaults: circular references checked, ASCII only, ", " and ": ", keys unsorted, NaN allowed.
    _encode = make_encoder({}, _unserializable, encode_basestring_ascii, None, ": ", ", ", False, False, True)
except (ImportError, TypeError):  # not CPython, or a _json of another signature
    pass


def loads(text: str | bytes) -> Any:
    if _scan is None:
        import json

        return json.loads(text)
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", "surrogatepass")
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        obj, end = _scan(text, start)
    except StopIteration as err:
        import json

        raise json.JSONDecodeError("Expecting value", text, err.value) from None
    rest = text[end:]
    if rest.strip(_WHITESPACE):
        import json

        raise json.JSONDecodeError("Extra data", text, end + len(rest) - len(rest.lstrip(_WHITESPACE)))
    return obj


def dumps(obj: Any) -> str:
    if _encode is None:
        import json

        return json.dumps(obj)
    return "".join(_encode(obj, 0))

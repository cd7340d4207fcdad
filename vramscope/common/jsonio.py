"""JSON that round-trips every Python string, lone surrogates included.

Pickled strings may hold lone surrogates ('\\ud800'): Python keeps them, a snapshot carries
them into frame names, actions and settings, and vramscope keeps strings as given. orjson
(fast, used everywhere) refuses to write them ("str is not valid UTF-8") and to read their
escapes back, and it cannot write integers beyond 64 bits. For those rare documents `dumps`
falls back to the standard library, which writes such strings as `\\udXXXX` escapes (valid
JSON text, pure ASCII) and big integers as digits, and `loads` reads them back the same way.
The common case stays orjson's speed. numpy scalars and arrays are written as numbers.

`safe_text` turns a string into one that any UTF-8 stream accepts (for Markdown, CSV, a
terminal): lone surrogates become the same `\\udXXXX` escape text.
"""
from __future__ import annotations

import json
from typing import IO, Any

import numpy as np
import orjson


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    plain = getattr(type(o), "__plain__", None)     # a result held as columns (classifiers/iterations.py)
    if plain is not None:
        return plain(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def dumps(obj: Any, pretty: bool = False, *, indent: bool = False, sort_keys: bool = False) -> bytes:
    """UTF-8 JSON of `obj` (dict keys that are not strings become strings, as json does;
    `pretty`/`indent`: two-space indents). Raises TypeError for objects JSON cannot hold."""
    option = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
    if pretty or indent:
        option |= orjson.OPT_INDENT_2
    if sort_keys:
        option |= orjson.OPT_SORT_KEYS
    try:
        return orjson.dumps(obj, default=_default, option=option)
    except orjson.JSONEncodeError:
        pass
    # lone surrogates or integers beyond 64 bits: the standard library writes both
    try:
        text = json.dumps(_str_keys(obj), default=_default, ensure_ascii=True, allow_nan=False,
                          sort_keys=sort_keys, indent=2 if (pretty or indent) else None,
                          separators=None if (pretty or indent) else (",", ":"))
    except (ValueError, RecursionError) as e:
        raise TypeError(f"not representable as JSON: {e}") from None
    return text.encode("ascii")


def dumps_pretty(obj: Any) -> bytes:
    """Indented JSON with a final newline (what a user reads or a script diffs)."""
    return dumps(obj, pretty=True) + b"\n"


def write_pretty(obj: Any, out: IO[bytes]) -> None:
    """`dumps_pretty(obj)` written to `out`, the same bytes; a list held by a value with
    `__plain_parts__` (a million iterations' rows) is written a part at a time, never whole
    in memory (1.3 million rows as dicts held 1.5 GB, their JSON 0.4 GB more)."""
    parts: list = []
    doc = _with_marks(obj, parts)
    if not parts:
        out.write(dumps_pretty(obj))
        return
    text = dumps_pretty(doc)
    pos = 0
    for k, value in enumerate(parts):
        mark = dumps(_mark(k))
        at = text.index(mark, pos)
        line_start = text.rfind(b"\n", 0, at) + 1
        pad = b"\n" + b" " * (len(text[line_start:at]) - len(text[line_start:at].lstrip(b" ")))
        out.write(text[pos:at])
        first = True
        for rows in value.__plain_parts__():
            if not rows:
                continue
            body = dumps(rows, pretty=True)[1:-2]       # "[\n  {...},\n  {...}\n]": the rows
            out.write((b"[" if first else b",") + body.replace(b"\n", pad))
            first = False
        out.write(b"[]" if first else pad + b"]")
        pos = at + len(mark)
    out.write(text[pos:])               # (its final newline included)


def _mark(k: int) -> str:
    return f"\x00vramscope-rows-{k}\x00"


def _with_marks(obj: Any, parts: list) -> Any:
    """`obj` with each value that has `__plain_parts__` replaced by a mark string (in `parts`)."""
    if hasattr(type(obj), "__plain_parts__"):
        parts.append(obj)
        return _mark(len(parts) - 1)
    if type(obj) is dict:
        return {k: _with_marks(v, parts) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return [_with_marks(v, parts) for v in obj]
    return obj


def loads(data: bytes | str) -> Any:
    """Parse JSON written by `dumps` (or anybody). Raises ValueError for invalid JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    # orjson refuses escaped lone surrogates; json reads them back as they were
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except UnicodeDecodeError as e:
        raise ValueError(str(e)) from None


def safe_text(s: str) -> str:
    """`s` unchanged, or with lone surrogates written as `\\udXXXX` so that it encodes as UTF-8."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _str_keys(obj: Any) -> Any:
    """The standard encoder wants str keys where orjson takes ints (OPT_NON_STR_KEYS)."""
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(k)): _str_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_str_keys(v) for v in obj]
    return obj


__all__ = ["dumps", "dumps_pretty", "loads", "safe_text"]

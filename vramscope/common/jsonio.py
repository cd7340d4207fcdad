"""JSON that round-trips every Python string, lone surrogates included.

Pickled strings may hold lone surrogates ('\\ud800'): Python keeps them, a snapshot carries
them into frame names, actions and settings, and vramscope keeps strings as given. orjson
(fast, used everywhere) refuses to write them ("str is not valid UTF-8") and to read their
escapes back, and it cannot write integers beyond 64 bits. For those rare documents `dumps`
falls back to the standard library, which writes such strings as `\\udXXXX` escapes (valid
JSON text, pure ASCII) and big integers as digits, and `loads` reads them back the same way.
The common case stays orjson's speed.

`safe_text` turns a string into one that any UTF-8 stream accepts (for Markdown, CSV, a
terminal): lone surrogates become the same `\\udXXXX` escape text.
"""
from __future__ import annotations

import json

import orjson


def dumps(obj, *, indent: bool = False, sort_keys: bool = False) -> bytes:
    """UTF-8 JSON of `obj` (dict keys that are not strings become strings, as json does).
    Raises TypeError for objects JSON cannot hold."""
    option = orjson.OPT_NON_STR_KEYS
    if indent:
        option |= orjson.OPT_INDENT_2
    if sort_keys:
        option |= orjson.OPT_SORT_KEYS
    try:
        return orjson.dumps(obj, option=option)
    except orjson.JSONEncodeError:
        pass
    # lone surrogates or integers beyond 64 bits: the standard library writes both
    try:
        text = json.dumps(obj, ensure_ascii=True, allow_nan=False, sort_keys=sort_keys,
                          indent=2 if indent else None, separators=None if indent else (",", ":"))
    except (ValueError, RecursionError) as e:
        raise TypeError(f"not representable as JSON: {e}") from None
    return text.encode("ascii")


def loads(data: bytes | str):
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


def safe_text(s: str) -> str:
    """`s` unchanged, or with lone surrogates written as `\\udXXXX` so that it encodes as UTF-8."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


__all__ = ["dumps", "loads", "safe_text"]

"""JSON out and in for every document we write (summary, report, cache manifests, notes).

orjson is fast but refuses strings that are not valid UTF-8, and a pickled snapshot may
hold lone surrogates (legal in a pickled str: a frame name cut in the middle of a
character). Such a document falls back to the standard library's encoder, which writes
them as `\\udXXX` escapes: valid JSON that reads back to the same string.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def dumps(obj: Any, pretty: bool = False) -> bytes:
    opts = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 if pretty else 0)
    try:
        return orjson.dumps(obj, default=_default, option=opts)
    except orjson.JSONEncodeError:
        text = json.dumps(_str_keys(obj), default=_default, ensure_ascii=True, indent=2 if pretty else None,
                          separators=None if pretty else (",", ":"))
        return text.encode("ascii")


def dumps_pretty(obj: Any) -> bytes:
    return dumps(obj, pretty=True) + b"\n"


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(str(e)) from None


def _str_keys(obj: Any) -> Any:
    """The standard encoder wants str keys where orjson takes ints (OPT_NON_STR_KEYS)."""
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(k)): _str_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_str_keys(v) for v in obj]
    return obj


__all__ = ["dumps", "dumps_pretty", "loads"]

"""Text made inert for the formats we write: Qt rich text (HTML) and Markdown.

Strings from a snapshot (frame names, file names, the allocator config, notes) come from
strangers: a frame name with backticks, `<script>` or a newline must never break out of
its place in a report that a user pastes into an issue tracker.
"""
from __future__ import annotations

import re
from html import escape as _escape

# what can start inline markup anywhere in a line (block markup needs a line start, and we
# never put quoted text at one): code, emphasis, links and images, raw HTML and entities,
# table cells, strikethrough, math; `_` only where it is not inside a word (GFM ignores
# intraword underscores, so `expandable_segments` stays readable)
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|~&$]|(?<!\w)_|_(?!\w))")
_NEWLINES = re.compile(r"[\r\n\u2028\u2029\x0b\x0c\x85]+")


def one_line(s) -> str:
    """Line breaks (every kind Markdown or a browser honours) as spaces."""
    return _NEWLINES.sub(" ", str(s))


def html(s) -> str:
    """Escaped for the text of HTML / Qt rich text (`html.escape`: & < >). Quotes stay as they
    are: they mean nothing there, and nothing of ours puts quoted text in an attribute."""
    return _escape(str(s), quote=False)


def md_text(s) -> str:
    """Plain text inside Markdown prose or a table cell: every character that could start
    markup is backslash-escaped, and line breaks become spaces (no new block can start)."""
    return _MD_SPECIAL.sub(r"\\\1", one_line(s))


def md_code(s, in_table: bool = False) -> str:
    """An inline code span holding `s` verbatim (CommonMark): fenced with more backticks
    than the longest run inside it, padded when it starts or ends with a backtick. Inside
    a code span nothing is markup, raw HTML included. In a table cell `|` is escaped
    (GitHub's tables split cells before reading code spans)."""
    s = one_line(s)
    if in_table:
        s = s.replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ") and s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}" if s else "` `"


def middle(text: str, limit: int) -> str:
    """`text` cut in the middle to `limit` characters ('run_with_a…long_name.pickle'): a file
    name's start and its end say most."""
    return text if len(text) <= limit else text[:limit // 2 - 1] + "…" + text[-(limit - limit // 2):]


def cut_words(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters at a word's end, with an ellipsis ('the
    loss spike before…'), never mid-word unless one word is longer than the limit."""
    if len(text) <= limit:
        return text
    head = text[:limit - 1]
    space = head.rfind(" ")
    return (head[:space] if space >= limit // 2 else head).rstrip(" ,;:-") + "…"


__all__ = ["one_line", "html", "md_text", "md_code", "middle", "cut_words"]

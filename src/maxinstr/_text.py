"""Names as text any view can show: what a user or a trace calls a stage or a kernel is data.

A name can hold what no terminal, file or page should receive raw: control characters
(an ESC starts a terminal escape sequence, a newline breaks a table row), line separators, and
lone surrogates (``os.fsdecode`` of a non-UTF-8 file name: they cannot be encoded, so printing
or writing them raises). :func:`visible` shows those as Python-style escapes and leaves every
other character as it is. Markup (rich's ``[...]``, Markdown, HTML) is each renderer's own
business: they escape it with their library's tools.
"""

from __future__ import annotations

import re

_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(name: object) -> str:
    """``name`` as a str with control characters, line separators and lone surrogates escaped
    (``\\n``, ``\\x1b``, ``\\u2028``, ``\\udcff``); anything else unchanged."""
    s = name if isinstance(name, str) else str(name)
    return _HIDDEN.sub(_escape, s) if _HIDDEN.search(s) else s


DISPLAY_CHARS = 1000
"""What a view shows of one text (a name, a note, a command): a name of 3 MB took the text report
33 s and 25 MB of output, 10 MB past 120 s (rich folds it into a hundred thousand lines). The
JSON report keeps every name whole: it is data."""


def clip_text(s: str, limit: int = DISPLAY_CHARS) -> str:
    """``s`` cut to ``limit`` characters, the cut said; unchanged when it is not longer."""
    return s if len(s) <= limit else f"{s[:limit]}… (+{len(s) - limit:,} characters)"


def shown(value: object, limit: int = DISPLAY_CHARS) -> str:
    """:func:`visible` of ``value`` cut to ``limit`` characters, the cut said
    (``… (+9,999,000 characters)``): what every view (text, Markdown, HTML, Perfetto) shows."""
    return visible(clip_text(value if isinstance(value, str) else str(value), limit))


_UNKEEPABLE = re.compile("[\x00\ud800-\udfff]")


def safe_name(name: str) -> str:
    """``name`` with lone surrogates and NUL escaped (``\\udcff``, ``\\x00``), otherwise the same
    string: what a reader keeps as a name. A surrogate cannot be encoded (printing or writing
    it raises) and a NUL ends a C string and is dropped from the end of numpy strings (``"a\\0"``
    would become ``"a"``)."""
    return _UNKEEPABLE.sub(_escape, name) if _UNKEEPABLE.search(name) else name

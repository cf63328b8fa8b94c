"""Names as text any view can show: a name is data, and may hold what no terminal, file or page should get
raw (control characters: ESC starts an escape sequence; line separators; lone surrogates: printing raises).
"""

from __future__ import annotations

import re

_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _SHORT.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def visible(name: object) -> str:
    """``name`` as a str with control characters, line separators and lone surrogates escaped
    (``\\n``, ``\\x1b``, ``\\u2028``, ``\\udcff``); anything else unchanged."""
    s = name if isinstance(name, str) else str(name)
    return _HIDDEN.sub(_escape, s) if _HIDDEN.search(s) else s


# What a view shows of one text: a name of 3 MB took the text report 33 s and 25 MB of output, 10 MB past
# 120 s (rich folds it into a hundred thousand lines). The JSON report keeps every name whole.
DISPLAY_CHARS = 1000


def clip_text(s: str, limit: int = DISPLAY_CHARS) -> str:  # cut to ``limit`` characters, the cut said
    return s if len(s) <= limit else f"{s[:limit]}… (+{len(s) - limit:,} characters)"


def shown(value: object, limit: int = DISPLAY_CHARS) -> str:
    """:func:`visible` of ``value`` cut to ``limit`` characters (``… (+9,999,000 characters)``): what views show."""
    return visible(clip_text(value if isinstance(value, str) else str(value), limit))


_UNKEEPABLE = re.compile("[\x00\ud800-\udfff]")


def safe_name(name: str) -> str:
    """``name`` with lone surrogates and NUL escaped (``\\udcff``, ``\\x00``): what a reader keeps as a
    name (a surrogate cannot be encoded; numpy strings drop a trailing NUL)."""
    return _UNKEEPABLE.sub(_escape, name) if _UNKEEPABLE.search(name) else name


KERNEL_LABEL_SCAN = 4096  # characters a label is made from (real names run to ~5,000; a hostile one to megabytes)
_NAMESPACE = re.compile(r"\(anonymous namespace\)::|<unnamed>::|\b[A-Za-z_][A-Za-z0-9_]*::")
_CAST = re.compile(r"\((?:unsigned |signed )?(?:int|bool|long|short|char|long long)\)(?=-?\d)")
# Templates that only wrap the kernel that tells one apart (CUTLASS's device_kernel<GemmUniversal<...>>)
_WRAPPERS = ("device_kernel<", "enable_3x_kernel_for_sm9x<", "enable_sm90_or_later<", "enable_sm80_to_sm89<",
             "Kernel<", "Kernel2<")


def _top_level(s: str, stop: str) -> int:
    """Index of the first ``stop`` outside template brackets and parentheses (``(8)>(0)`` compares), or -1."""
    angle = paren = 0
    for i, c in enumerate(s):
        if c == stop and angle == 0 and paren == 0 and i > 0:
            return i
        if c == "(":
            paren += 1
        elif c == ")":
            paren = max(paren - 1, 0)
        elif paren == 0 and c == "<":
            angle += 1
        elif paren == 0 and c == ">":
            angle = max(angle - 1, 0)
    return -1


def kernel_label(name: str) -> str:
    """A kernel's name as a reader tells kernels apart by: no ``void``, namespaces, parameter list or ``(int)``
    casts, CUTLASS's wrapper templates unwrapped, whitespace collapsed (--format json keeps the name)."""
    s = name[:KERNEL_LABEL_SCAN].strip()
    if not (s.startswith("void ") or "::" in s or "<" in s):
        return s  # not a C++ signature: a copy ("Memcpy HtoD (Pageable -> Device)"), a mangled or plain name
    if s.startswith("void "):
        s = s[5:]
    s = _NAMESPACE.sub("", s)
    s = _CAST.sub("", s)
    if s.startswith("enable_if<") and _top_level(s, " ") > 0:  # a return type spelled out before it
        s = s[_top_level(s, " ") + 1:]
    at = _top_level(s, "(")  # the parameter list
    s = s[:at] if at > 0 else s
    s = " ".join(s.replace("void ", "").split())  # and the return type of function-type template arguments
    while w := next((w for w in _WRAPPERS if s.startswith(w) and s.endswith(">") and len(s) > len(w) + 1), None):
        s = s[len(w):-1].strip()
    return s or name[:KERNEL_LABEL_SCAN]

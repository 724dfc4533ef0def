"""Text a server (or a file a service user writes) chose, made safe to print on a terminal.

A vLLM server's error message, model name or version, a host's verify result and a gate flag's
text reach the operator's terminal. Control characters in them would act on it: ESC sequences
retitle the window, clear the screen or recolour what follows, a CR overwrites the line, C1
codes (0x80-0x9f) are ESC sequences of their own on some terminals, bidirectional overrides
reorder what is shown. `safe` writes each such character as a visible escape (`\\x1b`,
`\\u202e`) and keeps every other character, printable unicode included, as it is.

The standard library only: the collection's filters use it too (the verify role's table).
"""

from __future__ import annotations

import re

# C0 but TAB and LF, DEL, C1, lone surrogates (they cannot even be encoded to UTF-8), the
# bidirectional marks, embeddings, overrides and isolates, and the line/paragraph separators
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\t\n]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object, *, one_line: bool = False) -> str:
    """`text` (str() of it) with every control character written as an escape; `one_line`:
    TAB and LF too."""
    return (_UNSAFE_LINE if one_line else _UNSAFE).sub(_escaped, str(text))

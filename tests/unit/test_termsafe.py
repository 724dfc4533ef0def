"""Terminal-safe output: a server's text never acts on the terminal, nor on rich's markup."""

from __future__ import annotations

import io
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmctl.terminal import output, waits
from warmctl.terminal.termsafe import safe

# reproducible, no example database left in the checkout (tests/fuzz's profile does the same)
FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=300)
EVIL = "\x1b]0;owned\x07\x1b[2J\x1b[31m\u009b1m\u202e[bold]b[/bold]\r:smile:"


def _unsafe(ch: str) -> bool:
    code = ord(ch)
    return (
        (code < 0x20 and ch not in "\t\n")
        or 0x7F <= code <= 0x9F
        or 0xD800 <= code <= 0xDFFF
        or ch in "\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e"
        or 0x2066 <= code <= 0x2069
    )


@FIXED
@given(st.text())
def test_nothing_unsafe_is_left_and_the_rest_is_kept(text: str) -> None:
    out = safe(text)
    assert not any(_unsafe(ch) for ch in out)
    assert safe(out) == out  # escaping is done once: what is left is printable
    assert out == "".join(safe(ch) for ch in text)  # character by character
    for ch in text:  # each one kept, or written as its code
        code = ord(ch)
        escaped = f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"
        assert safe(ch) == (escaped if _unsafe(ch) else ch)


@FIXED
@given(st.text(st.characters(categories=["L", "N", "P", "S", "Zs"])))
def test_printable_unicode_is_kept_as_it_is(text: str) -> None:
    assert safe(text) == text


def test_each_control_character_is_written_as_an_escape() -> None:
    assert safe(EVIL) == (
        "\\x1b]0;owned\\x07\\x1b[2J\\x1b[31m\\x9b1m\\u202e[bold]b[/bold]\\x0d:smile:"
    )
    assert safe("a\tb\nc") == "a\tb\nc"
    assert safe("a\tb\nc", one_line=True) == "a\\x09b\\x0ac"
    assert safe("\ud800") == "\\ud800"  # a lone surrogate (JSON can carry one) prints


def test_every_category_c_character_but_tab_and_newline_is_escaped() -> None:
    for code in range(0x100):
        ch = chr(code)
        if unicodedata.category(ch) == "Cc" and ch not in "\t\n":
            assert safe(ch).startswith("\\x"), hex(code)


def test_error_lines_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    output.error_line(f"server said {EVIL}")
    output.warning_line(EVIL)
    output.info_line(EVIL)
    out, err = capsys.readouterr()
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "\r" not in text and "\x9b" not in text
    assert err.startswith("warmctl: error: server said \\x1b]0;owned\\x07")


def _render(renderable: object, terminal: bool = False) -> str:
    buf = io.StringIO()
    con = output.SafeConsole(
        file=buf, width=200, markup=False, emoji=False, highlight=False, force_terminal=terminal
    )
    con.print(renderable)
    return buf.getvalue()


def test_console_prints_plain_text_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _render(f"model {EVIL}")
    assert "\x1b" not in text and "[bold]b[/bold]" in text and ":smile:" in text
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert isinstance(output.console(), output.SafeConsole)


def test_table_cells_and_title_are_plain_text_and_styled_is_warmctl_s_own() -> None:
    t = output.table(f"title {EVIL}", ["A", "B"], [[EVIL, output.styled("[red]{}[/]", EVIL)]])
    text = _render(t, terminal=True)  # rich's own colours are there; the server's are not
    assert "\x1b[2J" not in text and "\x1b]0;" not in text and "\u202e" not in text
    assert text.count("[bold]b[/bold]") == 3
    assert text.count("\\x1b[2J") == 3
    assert "\x1b[31m" in text  # styled: red, warmctl's own


def test_status_style_colours_only_the_known_words() -> None:
    assert output.status_style("PASS (attempt 2)").plain == "PASS (attempt 2)"
    assert output.status_style("[bold]x").plain == "[bold]x"


def test_a_wait_s_live_line_is_escaped_and_never_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, width=200)
    monkeypatch.setattr(output, "console", lambda stderr=False: con)
    with waits.board(True) as track:
        tracker = track("host")
        assert tracker is not None
        tracker.say(f"waiting: {EVIL}")
        tracker("warm [bold]x[/]", 1, 2)
        tracker.say(f"waiting: {EVIL}")
    text = buf.getvalue()
    assert "\x1b[2J" not in text and "\x1b]0;" not in text and "\u202e" not in text
    assert "[bold]b[/bold]" in text and "\\x1b[2J" in text


def test_the_verify_role_s_plain_table_is_escaped() -> None:
    """The role's table (the play's output, through the collection's filter): a host's JSON."""
    from warmctl.observe.verify_table import fleet_lines

    result = {"target": "h:8000", "instance": f"i{EVIL}", "status": "FAIL", "reasons": [EVIL]}
    lines = fleet_lines({"host": [result]})
    text = "\n".join(lines)
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    assert text.count("\\x1b]0;owned\\x07") == 2

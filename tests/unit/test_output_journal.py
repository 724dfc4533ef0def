"""sd-daemon priority prefixes: only on the stream JOURNAL_STREAM names, on every line."""

from __future__ import annotations

import io
import os
import tempfile

import pytest

from warmctl.terminal.output import _Prefixed, journal_attached


def test_prefixes_every_line_even_when_written_in_pieces() -> None:
    sink = io.StringIO()
    out = _Prefixed(sink, 6)
    out.write("a table ")
    out.write("row\nnext ")
    out.write("row\n\nlast\n")
    assert sink.getvalue() == "<6>a table row\n<6>next row\n<6>\n<6>last\n"


def test_attached_only_to_the_named_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryFile("w") as named, tempfile.TemporaryFile("w") as other:
        st = os.fstat(named.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert journal_attached(named)
        assert not journal_attached(other)  # a child whose output was redirected
        assert not journal_attached(io.StringIO())  # no file descriptor at all
        monkeypatch.setenv("JOURNAL_STREAM", "garbage")
        assert not journal_attached(named)
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not journal_attached(named)

"""Any string as a HOST argument: parsed, or one line and exit 2 (never a traceback)."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import budget, invoke, one_line
from warmctl.errors import WarmctlError
from warmctl.server.target import parse_target

# shaped like what operators type, plus any text at all
PIECES = st.sampled_from(
    [
        "http://",
        "https://",
        "[",
        "]",
        ":",
        "/",
        "::1",
        "llm-1",
        "8000",
        "%",
        "@",
        "?",
        "#",
        " ",
        ".",
        "0",
        "65536",
        "-",
        "\x00",
        "é",
    ]
)
HOSTS = st.one_of(st.text(max_size=40), st.lists(PIECES, max_size=8).map("".join))


@settings(max_examples=budget(400))
@given(HOSTS)
@example("http://[abc")  # urlsplit: "Invalid IPv6 URL" was a ValueError traceback
@example("http://[::1")
@example("https://[v1.x]:80")
@example("::%@")  # ipaddress takes any zone: accepted, and its URL http://[::%@]:8000 was bad
@example("fe80::1%eth0")
def test_parse_target_returns_a_target_or_one_input_error(text: str) -> None:
    try:
        target = parse_target(text)
    except WarmctlError as err:
        assert err.kind == "input" and "\n" not in str(err)
        return
    assert 1 <= target.port <= 65535
    assert target.base_url.startswith(("http://", "https://"))
    parse_target(target.base_url)  # what it prints parses again


@settings(max_examples=budget(150))
@given(text=HOSTS)
@example(text="http://[abc")
def test_any_host_argument_is_one_line_and_exit_2(tmp_path_factory, text: str) -> None:
    """`sleep HOST 127.0.0.1:9 --gate G` refuses before any request: either HOST is bad, or
    --gate is given two instances (127.0.0.1:9 alone: nothing listens, one line too)."""
    gate = tmp_path_factory.getbasetemp() / "absent" / "g"
    result = invoke("sleep", "--gate", str(gate), "--timeout", "0.5", "--", text, "127.0.0.1:9")
    one_line(result)

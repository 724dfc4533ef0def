import pytest

from warmctl.errors import WarmctlError
from warmctl.server.target import Target, parse_target


@pytest.mark.parametrize(
    ("text", "base_url", "label"),
    [
        ("llm-1", "http://llm-1:8000", "llm-1:8000"),
        ("LLM-1.example.com", "http://llm-1.example.com:8000", "llm-1.example.com:8000"),
        ("llm-1:9000", "http://llm-1:9000", "llm-1:9000"),
        ("10.0.0.7", "http://10.0.0.7:8000", "10.0.0.7:8000"),
        ("10.0.0.7:8001", "http://10.0.0.7:8001", "10.0.0.7:8001"),
        ("[::1]:8001", "http://[::1]:8001", "[::1]:8001"),
        ("[fe80::1]", "http://[fe80::1]:8000", "[fe80::1]:8000"),
        ("::1", "http://[::1]:8000", "[::1]:8000"),
        ("http://llm-1:8000", "http://llm-1:8000", "llm-1:8000"),
        ("https://llm-1:8443", "https://llm-1:8443", "https://llm-1:8443"),
        ("https://llm-1", "https://llm-1:443", "https://llm-1:443"),
        ("http://gw/vllm/a/", "http://gw:80/vllm/a", "gw:80/vllm/a"),
        ("http://[::1]:9000/p", "http://[::1]:9000/p", "[::1]:9000/p"),
        ("  llm-1:8000  ", "http://llm-1:8000", "llm-1:8000"),
    ],
)
def test_parse_target_accepts(text: str, base_url: str, label: str) -> None:
    target = parse_target(text)
    assert target.base_url == base_url
    assert target.label == label


def test_default_port_is_a_parameter() -> None:
    assert parse_target("llm-1", default_port=9100).port == 9100
    assert parse_target("llm-1:1", default_port=9100).port == 1


def test_with_name_changes_only_the_label() -> None:
    target = parse_target("10.0.0.1:8001").with_name("gpu-1/chat")
    assert target.label == "gpu-1/chat"
    assert target.base_url == "http://10.0.0.1:8001"
    assert isinstance(target, Target)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("llm-1:", "missing port"),
        ("llm-1:http", "not a number"),
        ("llm-1:0", "out of range"),
        ("llm-1:65536", "out of range"),
        ("llm 1", "not a host name"),
        ("llm-1/v1", "needs a URL"),
        ("ftp://llm-1", "scheme"),
        ("http://llm-1:99999", "out of range"),
        ("http://llm-1:8000/?x=1", "query"),
        ("[::1", "unclosed"),
        ("[llm-1]:8000", "not an IPv6"),
        ("[::1]8000", "unexpected"),
        ("a:b:c", "too many"),
        ("http://:8000", "empty host"),
    ],
)
def test_parse_target_rejects_with_one_line(text: str, why: str) -> None:
    with pytest.raises(WarmctlError) as info:
        parse_target(text)
    message = str(info.value)
    assert why in message
    assert "\n" not in message
    assert info.value.exit_code == 2
    assert info.value.kind == "input"

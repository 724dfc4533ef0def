import json
from pathlib import Path

import pytest

from warmctl.errors import WarmctlError
from warmctl.warmth.prompts import (
    TOKENS_PER_WORD,
    default_prompts,
    read_prompt_file,
    resolve_prompts,
)


def test_explicit_prompts_win_over_environment() -> None:
    env = {"WARMCTL_PROMPTS": "from env", "VLLM_PREWARM_PROMPT": "prewarm"}
    got = resolve_prompts(["a", "b"], env=env)
    assert got.prompts == ["a", "b"] and got.source == "--prompt"


def test_prompt_file_paragraphs_and_json(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first line\ncontinues\n\n\nsecond\n")
    assert read_prompt_file(text) == ["first line\ncontinues", "second"]
    js = tmp_path / "p.json"
    js.write_text(json.dumps(["x", "", "y"]))
    assert read_prompt_file(js) == ["x", "y"]
    got = resolve_prompts(["cli"], text, env={})
    assert got.prompts == ["cli", "first line\ncontinues", "second"]
    assert got.source.startswith("--prompt-file")


@pytest.mark.parametrize(
    ("content", "why"),
    [("", "no prompt"), ("[1, 2]", "list of strings"), ("[not json", "not a valid JSON list")],
)
def test_bad_prompt_files(tmp_path: Path, content: str, why: str) -> None:
    p = tmp_path / "p.txt"
    p.write_text(content)
    with pytest.raises(WarmctlError, match=why):
        read_prompt_file(p)


def test_missing_prompt_file_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(WarmctlError) as info:
        resolve_prompts(prompt_file=tmp_path / "nope.txt", env={})
    assert info.value.kind == "input" and "not found" in str(info.value)
    with pytest.raises(WarmctlError, match="is a directory"):
        read_prompt_file(tmp_path)


def test_environment_sources_in_order() -> None:
    got = resolve_prompts(env={"WARMCTL_PROMPTS": "one\n\ntwo", "VLLM_PREWARM_PROMPT": "p"})
    assert got.prompts == ["one", "two"] and got.source == "WARMCTL_PROMPTS"
    got = resolve_prompts(env={"WARMCTL_PROMPTS": " ", "VLLM_PREWARM_PROMPT": "p q"})
    assert got.prompts == ["p q"] and got.source == "VLLM_PREWARM_PROMPT"


def test_defaults_are_short_medium_long_and_bounded() -> None:
    got = resolve_prompts(env={}, max_model_len=32768)
    assert got.source == "default" and len(got.prompts) == 3
    lengths = [len(p.split()) for p in got.prompts]
    assert lengths == sorted(lengths)
    for mml in (256, 1024, 4096, 32768):
        for p in default_prompts(mml, max_tokens=16):
            assert len(p.split()) * TOKENS_PER_WORD + 16 <= mml
    assert len(default_prompts(100_000)[-1].split()) <= 2000 + 10


def test_empty_prompt_option_is_an_error() -> None:
    with pytest.raises(WarmctlError, match="--prompt is empty"):
        resolve_prompts(["  "], env={})


def test_prompt_tokens_parse_and_size() -> None:
    from warmctl.warmth.prompts import TOKENS_PER_WORD_TYPICAL, parse_prompt_tokens, sized_prompts

    assert parse_prompt_tokens("300, 600,300,900") == [300, 600, 900]
    for bad in ("", "0", "a,b", "-5"):
        with pytest.raises(WarmctlError, match="bad prompt tokens"):
            parse_prompt_tokens(bad)
    short, long = sized_prompts([10, 900])
    assert len(short.split()) == round(10 / TOKENS_PER_WORD_TYPICAL)
    assert len(long.split()) == round(900 / TOKENS_PER_WORD_TYPICAL)

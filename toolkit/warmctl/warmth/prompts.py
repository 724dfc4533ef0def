"""Where warmup prompts come from: `--prompt`, `--prompt-file`, the environment, or defaults.

Precedence: `--prompt` (repeatable) and `--prompt-file` together; else `WARMCTL_PROMPTS`; else
`VLLM_PREWARM_PROMPT` (articles describe a vLLM flag of that name that does not exist; operators
copy it, so it is honoured here); else a default set of short, medium and long inputs.

A prompt file (and `WARMCTL_PROMPTS`) is either a JSON list of strings or plain text with one
prompt per paragraph (prompts separated by a blank line).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from warmctl.errors import WarmctlError

ENV_PROMPTS = "WARMCTL_PROMPTS"
ENV_PREWARM = "VLLM_PREWARM_PROMPT"
# rough upper bound of tokens per English word for the tokenizers vLLM serves
TOKENS_PER_WORD = 1.5
# typical tokens per word of that English text (Qwen3's tokenizer: 1.2-1.3)
TOKENS_PER_WORD_TYPICAL = 1.25

_SHORT = "Hello! In one sentence, what is a GPU?"
_MEDIUM = (
    "You are a helpful assistant for a platform team. Explain, step by step, how a web service "
    "should be deployed so that the first request after a restart is as fast as later ones. "
    "Cover caches that must survive a restart, warming the service before it takes traffic, "
    "and how to check the result with a latency measurement. Answer in a short list."
)
_LONG_PARAGRAPH = (
    "The operations log records each deploy, each restart and each sleep cycle of the inference "
    "hosts, with the time to first token of the first request and of the steady requests after "
    "it, the batch sizes that were warmed, and the state of the compile caches on disk. "
)


@dataclass(frozen=True)
class PromptSet:
    prompts: list[str]
    source: str  # "--prompt", "--prompt-file PATH", "WARMCTL_PROMPTS", ..., "default"
    # token lengths of the generated prompts at the end of `prompts` (--prompt-tokens): the
    # warmup sizes them again with the server's own tokenizer
    sized: tuple[int, ...] = ()


def split_prompts(text: str, where: str) -> list[str]:
    """A JSON list of strings, or paragraphs separated by blank lines."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except ValueError as exc:
            raise WarmctlError(f"{where}: not a valid JSON list: {exc}", kind="input") from None
        if not isinstance(data, list) or not all(isinstance(p, str) for p in data):
            raise WarmctlError(f"{where}: the JSON must be a list of strings", kind="input")
        prompts = [p for p in data if p.strip()]
    else:
        paragraphs: list[str] = []
        current: list[str] = []
        for line in text.splitlines():
            if line.strip():
                current.append(line.rstrip())
            elif current:
                paragraphs.append("\n".join(current))
                current = []
        if current:
            paragraphs.append("\n".join(current))
        prompts = paragraphs
    if not prompts:
        raise WarmctlError(f"{where}: no prompt in it", kind="input")
    return prompts


def read_prompt_file(path: str | Path) -> list[str]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WarmctlError(f"prompt file {str(p)!r} not found", kind="input") from None
    except IsADirectoryError:
        raise WarmctlError(f"prompt file {str(p)!r} is a directory", kind="input") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WarmctlError(f"cannot read prompt file {str(p)!r}: {exc}", kind="input") from None
    return split_prompts(text, f"prompt file {str(p)!r}")


def default_prompts(max_model_len: int | None = None, max_tokens: int = 16) -> list[str]:
    """Short, medium and long prompts; the long one fills about half of `max_model_len`
    (estimated generously at 1.5 tokens a word, and never more than ~2,000 words)."""
    budget_tokens = ((max_model_len or 4096) // 2) - max_tokens
    words_each = len(_LONG_PARAGRAPH.split())
    max_words = int(min(budget_tokens / TOKENS_PER_WORD, 2000))
    repeats = max(1, max_words // words_each)
    long_prompt = "Summarise this log:\n" + _LONG_PARAGRAPH * repeats
    prompts = [_SHORT]
    medium_words = len(_MEDIUM.split())
    if medium_words * TOKENS_PER_WORD + max_tokens < (max_model_len or 4096):
        prompts.append(_MEDIUM)
    if repeats * words_each > medium_words * 2:
        prompts.append(long_prompt.strip())
    return prompts


def parse_prompt_tokens(text: str) -> list[int]:
    """`300,600,900` -> [300, 600, 900] (each >= 1, in the order given, no repeats)."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise WarmctlError(
            f"bad prompt tokens {text!r}: expected numbers separated by commas, e.g. 300,600",
            kind="input",
        ) from None
    if not values or min(values) < 1:
        raise WarmctlError(f"bad prompt tokens {text!r}: each must be >= 1", kind="input")
    return list(dict.fromkeys(values))


def sized_prompts(
    lengths: Sequence[int], tokens_per_word: float = TOKENS_PER_WORD_TYPICAL
) -> list[str]:
    """One prompt of about each of `lengths` tokens (English text at `tokens_per_word`), so a
    warmup replays the prompt lengths a host's traffic has."""
    words = _LONG_PARAGRAPH.split()
    out = []
    for n in lengths:
        want = max(1, round(n / tokens_per_word))
        body = (words * (want // len(words) + 1))[:want]
        out.append(" ".join(body))
    return out


def resolve_prompts(
    prompts: Sequence[str] = (),
    prompt_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    max_model_len: int | None = None,
    max_tokens: int = 16,
) -> PromptSet:
    """Pick the prompt source by the precedence in this module's docstring."""
    environ = os.environ if env is None else env
    given = [p for p in prompts if p.strip()]
    if prompts and not given:
        raise WarmctlError("--prompt is empty", kind="input")
    if prompt_file is not None:
        from_file = read_prompt_file(prompt_file)
        src = f"--prompt-file {prompt_file}" + (" + --prompt" if given else "")
        return PromptSet(given + from_file, src)
    if given:
        return PromptSet(given, "--prompt")
    if environ.get(ENV_PROMPTS, "").strip():
        return PromptSet(split_prompts(environ[ENV_PROMPTS], ENV_PROMPTS), ENV_PROMPTS)
    if environ.get(ENV_PREWARM, "").strip():
        return PromptSet([environ[ENV_PREWARM].strip()], ENV_PREWARM)
    return PromptSet(default_prompts(max_model_len, max_tokens), "default")

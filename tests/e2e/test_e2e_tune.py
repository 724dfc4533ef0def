"""`warmctl tune --inventory` against the deployed test hosts, and a deploy that applies the
snippet it writes (issue 14): `ansible-playbook site.yml -i INVENTORY -i SNIPPET`.

Runs in the e2e session after test_e2e_site.py (it needs the deployed hosts)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import requests
import yaml
from e2e_support import BATCH, UNIT, Lab, PlayRun, record, unit_show, wait_active, warmctl
from tests.lib.testhosts import DEFAULT_PORT, VERIFY_MAX_RATIO

WORDS = ["status", "of", "the", "nightly", "deploy", "on", "host", "after", "restart", "ok"]


def _load(address: str, n: int = 12) -> None:
    """n completions of 80-300 words, 2 at a time (the lab model's max_model_len is 1024)."""
    rng = random.Random(14)
    prompts = [
        f"[e2e-tune-{i}] " + " ".join(rng.choices(WORDS, k=rng.randint(80, 300))) for i in range(n)
    ]

    def one(prompt: str) -> None:
        resp = requests.post(
            f"http://{address}:{DEFAULT_PORT}/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0},
            timeout=300,
        )
        resp.raise_for_status()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, prompts))


def test_tune_snippet_is_what_the_deploy_applies(
    lab: Lab, deployed: PlayRun, base_inventory
) -> None:
    fleet = lab.fleet
    loaded, idle = fleet.hosts
    for host in fleet.hosts:  # earlier checks may have left a unit restarting
        wait_active(fleet, host)
    start = lab.dir / "tune-t0.json"
    run = warmctl(
        "tune", "-i", str(base_inventory), "--window", "1", "--save", str(start), log=lab.log
    )
    assert run.rc == 0, run.describe()
    _load(loaded.address)
    snippet = lab.dir / "tuned.yml"
    run = warmctl(
        "tune", "-i", str(base_inventory), "--since", str(start), "--write", str(snippet),
        log=lab.log,
    )  # fmt: skip
    record("tune --inventory --since", run.seconds)
    assert run.rc == 0, run.describe()
    hosts = yaml.safe_load(snippet.read_text())["all"]["hosts"]
    (tuned,) = hosts[loaded.name]["vllm_service_instances"]
    (same,) = hosts[idle.name]["vllm_service_instances"]
    # CPU hosts, eager instances: no capture sizes, no KV cache; the warmup plan from the load
    assert "compilation_config" not in tuned
    assert "--num-gpu-blocks-override" not in tuned.get("extra_args", [])
    assert tuned["warmup_args"][0] == "--prompt-tokens", tuned
    # the host without traffic: its instance exactly as the inventory has it
    assert same == lab.instance()

    pid = unit_show(fleet, loaded, UNIT, "MainPID")["MainPID"]
    run = lab.playbook(
        base_inventory,
        "-i",
        str(snippet),
        *BATCH,  # the hosts restart side by side
        stage="tune: deploy with the snippet",
    )
    assert run.rc == 0, run.describe()
    post = unit_show(fleet, loaded, UNIT, "ExecStartPost")["ExecStartPost"]
    assert "--prompt-tokens" in post, post
    assert unit_show(fleet, loaded, UNIT, "MainPID")["MainPID"] != pid, "not restarted"
    # (earlier checks may have left the idle host's instance changed: only its warmup matters)
    assert "--prompt-tokens" not in unit_show(fleet, idle, UNIT, "ExecStartPost")["ExecStartPost"]
    verify = warmctl(
        "verify", f"{loaded.address}:{DEFAULT_PORT}", "--max-ratio", str(VERIFY_MAX_RATIO),
        "--attempts", "3", log=lab.log,
    )  # fmt: skip
    assert verify.rc == 0, verify.describe()

import json

from tests.double import VllmDouble


def test_status_table(run, vllm_double: VllmDouble) -> None:
    result = run("status", vllm_double.address)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for needle in (vllm_double.address, "ok", "double-model", "4096", "0.26.0", "awake"):
        assert needle in out
    assert result.stderr == ""


def test_status_json_reports_load_and_sleep(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.extra_waiting = 3
    vllm_double.put_to_sleep(1)
    result = run("status", vllm_double.url, "--json")
    assert result.exit_code == 0
    [r] = json.loads(result.stdout)["results"]
    assert r["healthy"] is True
    assert r["models"] == [{"id": "double-model", "max_model_len": 4096}]
    assert r["version"] == "0.26.0"
    assert (r["sleeping"], r["sleep_level"], r["sleep"]) == (True, 1, "asleep (level 1)")
    assert (r["running"], r["waiting"]) == (0.0, 3.0)


def test_status_dev_mode_off_says_unknown(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.dev_mode = False
    vllm_double.config.sleep_state_metric = False
    result = run("status", vllm_double.address)
    assert result.exit_code == 0
    assert "unknown (dev mode off)" in result.stdout


def test_status_dev_mode_off_reads_the_sleep_gauge(run, vllm_double: VllmDouble) -> None:
    """Behind a proxy (its dev routes 404), vLLM's own vllm:engine_sleep_state still tells."""
    vllm_double.config.dev_mode = False
    vllm_double.put_to_sleep(2)
    result = run("status", vllm_double.address, "--json")
    [r] = json.loads(result.stdout)["results"]
    assert result.exit_code == 0, result.output
    assert (r["sleeping"], r["sleep_level"], r["sleep"]) == (True, 2, "asleep (level 2)")


def test_status_many_hosts_one_down(run, vllm_double_factory) -> None:
    up = vllm_double_factory()
    down = vllm_double_factory()
    down.stop()
    result = run("status", up.address, down.address, "--json")
    assert result.exit_code == 2
    by_target = {r["target"]: r for r in json.loads(result.stdout)["results"]}
    assert by_target[up.address]["healthy"] is True
    assert by_target[down.address]["error_kind"] == "refused"
    assert result.stderr.count("\n") == 1 and "connection refused" in result.stderr


def test_status_api_key_from_option_and_environment(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.api_key = "k1"
    denied = run("status", vllm_double.address)
    assert denied.exit_code == 2 and "--api-key" in denied.stderr
    assert run("status", vllm_double.address, "--api-key", "k1").exit_code == 0
    assert run("status", vllm_double.address, env={"VLLM_API_KEY": "k1"}).exit_code == 0


def test_status_engine_dead(run, vllm_double: VllmDouble) -> None:
    vllm_double.config.engine_dead = True
    result = run("status", vllm_double.address)
    assert result.exit_code == 2
    assert "engine dead" in result.stderr


def test_status_from_inventory(run, vllm_double_factory, tmp_path) -> None:
    a = vllm_double_factory()
    b = vllm_double_factory(dev_mode=False, sleep_state_metric=False)
    inv = tmp_path / "hosts.ini"
    inv.write_text(
        f"[vllm]\nllm-a ansible_host=127.0.0.1 warmctl_port={a.port}\n"
        f"llm-b ansible_host=127.0.0.1 warmctl_port={b.port}\n"
    )
    result = run("status", "--inventory", str(inv), "--json")
    assert result.exit_code == 0, result.output
    reports = {r["target"]: r for r in json.loads(result.stdout)["results"]}
    assert reports[f"llm-a:{a.port}"]["sleep"] == "awake"
    assert reports[f"llm-b:{b.port}"]["sleep"] == "unknown (dev mode off)"

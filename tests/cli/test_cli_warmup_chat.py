"""The warmup asks the chat route only when the model may have a chat template: vLLM answers a
chat request for a model without one with 400 and logs it as an ERROR line in the unit's
journal ("Exception caught"), which paged operators at every deploy."""

import json
from pathlib import Path

import pytest
from tests.double import VllmDouble


def model_folder(tmp_path: Path, config: dict, extra: str | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if extra:
        (folder / extra).write_text("{{ messages }}")
    return folder


def chat_requests(double: VllmDouble) -> int:
    return sum(1 for _, path in double.counters.requests if path.startswith("/v1/chat/"))


def test_no_chat_request_when_the_model_files_have_no_template(
    run, vllm_double: VllmDouble, tmp_path: Path
) -> None:
    folder = model_folder(tmp_path, {"tokenizer_class": "PreTrainedTokenizerFast"})
    vllm_double.config.model = str(folder)  # vLLM: the id and root of an unnamed model
    vllm_double.config.chat_template = False
    result = run("warmup", vllm_double.address, "--batch-sizes", "1", "--json")
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["results"]
    assert chat_requests(vllm_double) == 0  # nothing the server would log as an ERROR
    assert vllm_double.counters.generations == report["requests"] > 0
    assert report["chat"] is False
    assert report["chat_note"] == "skipped: the model has no chat template (tokenizer_config.json)"
    # --chat still insists (and fails as before: the operator asked)
    forced = run("warmup", vllm_double.address, "--batch-sizes", "1", "--chat")
    assert forced.exit_code == 2 and "chat template" in forced.stderr


@pytest.mark.parametrize(
    ("config", "extra"),
    [({"chat_template": "{{ messages }}"}, None), ({}, "chat_template.jinja")],
)
def test_the_chat_route_is_warmed_when_the_files_have_a_template(
    run, vllm_double: VllmDouble, tmp_path: Path, config: dict, extra: str | None
) -> None:
    vllm_double.config.model = str(model_folder(tmp_path, config, extra))
    result = run("warmup", vllm_double.address, "--batch-sizes", "1", "--json")
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["results"]
    assert report["chat"] is True and chat_requests(vllm_double) == report["prompts"]

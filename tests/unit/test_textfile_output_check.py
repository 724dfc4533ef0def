"""The wake's output check in the metrics: warmctl_wake_output_check_ok is 1 when the answers
matched, 0 when they did not (and the wake counts as failed), absent when no check ran. The
wake's report carries outputcheck's `status`; the metric was never written (seen on the GPU
host: a passed check, no metric)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from warmctl.observe.textfile import record


def samples(path: Path) -> dict[str, float]:
    return {
        s.name + (f"{{{s.labels['command']}}}" if "command" in s.labels else ""): s.value
        for f in text_string_to_metric_families(path.read_text())
        for s in f.samples
    }


@pytest.mark.parametrize(
    ("status", "metric", "success"),
    [("passed", 1.0, 1.0), ("failed", 0.0, 0.0), ("not_recorded", None, 1.0),
     ("other_model", None, 1.0)],
)  # fmt: skip
def test_wake_output_check_metric(tmp_path: Path, status: str, metric, success: float) -> None:
    report = {"level": 1, "total_s": 0.2, "output_check": {"status": status, "answers": 3}}
    path = record(str(tmp_path), "wake", "qwen", "127.0.0.1", report)
    got = samples(path)
    assert got.get("warmctl_wake_output_check_ok") == metric
    assert got["warmctl_last_run_success{wake}"] == success

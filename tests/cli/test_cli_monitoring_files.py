"""The shipped dashboard and alert rules (docs/monitoring/) against metrics warmctl really
writes: textfiles produced here by the CLI against the loopback vLLM double.

promtool (Prometheus' own checker) comes from scripts/promtool.sh: PATH, else Debian's
`prometheus` package unpacked into the cache (only skipped on a machine without apt-get). The
checks without promtool (PyYAML, metric names) always run."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from tests.double import VllmDouble
from tests.waker.support import GateFiles, Held, Waker

from warmctl.observe.textfile import METRICS
from warmctl.waker.metrics import METRICS as WAKER_METRICS

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "docs" / "monitoring"
DASHBOARD = MONITORING / "warmctl-dashboard.json"
RULES = MONITORING / "warmctl-alerts.yml"
DOC = ROOT / "docs" / "MONITORING.md"

# the vLLM metrics the dashboard may query: names vLLM 0.26 exports
# (vllm/v1/metrics/loggers.py; the histogram's series carry _bucket/_sum/_count)
VLLM_METRICS = {
    "vllm:time_to_first_token_seconds",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:engine_sleep_state",
}
NAME = re.compile(r"\b(warmctl_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
# the waker's series (its histogram's as _bucket/_sum/_count)
WAKER_SERIES = {
    f"{name}{part}"
    for name in WAKER_METRICS
    for part in (
        ("_bucket", "_sum", "_count")
        if name.endswith("_seconds") and "timestamp" not in name
        else ("",)
    )
}


def _warmctl(*args: str) -> int:
    from warmctl.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False).exit_code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def textfiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a fleet's hosts write: a passing instance that slept in a window and woke, one
    asleep in its window, one put to sleep by hand, one whose sleep failed, one failing
    verify, one unreachable (all against one double: the instance name tells them apart)."""
    folder = tmp_path_factory.mktemp("textfiles")
    tf = ["--textfile-dir", str(folder)]
    with VllmDouble() as srv:
        srv.config.ttft = 0.01  # steady enough that the first/steady ratio is about 1
        a = srv.address
        assert _warmctl("warmup", a, "--batch-sizes", "1", *tf, "--instance", "ok") == 0
        # a PASS whatever the machine's load: the ratio bound is not what is tested here
        assert (
            _warmctl("verify", a, "--steady", "3", "--max-ratio", "100", *tf, "--instance", "ok")
            == 0
        )
        sleep = ["--next-wake", "30 7 * * *"]
        assert _warmctl("sleep", a, *sleep, *tf, "--instance", "ok") == 0
        assert _warmctl("wake", a, *tf, "--instance", "ok") == 0
        assert _warmctl("sleep", a, *sleep, *tf, "--instance", "asleep") == 0
        assert _warmctl("sleep", a, *tf, "--instance", "manual") == 0  # by hand: no window
        assert _warmctl("wake", a, "--no-warmup", *tf, "--instance", "stuck") == 0
        srv.config.extra_waiting = 1
        assert _warmctl("sleep", a, "--drain-timeout", "0.2", *tf, "--instance", "stuck") == 2
        srv.config.extra_waiting = 0
        srv.config.first_ttft, srv.first_pending = 0.3, True  # 300 ms first vs 10 ms: FAIL
        assert _warmctl("verify", a, *tf, "--instance", "slow") == 1
        # asleep by idle sleep (the waker's, not a window's nor a person's)
        assert _warmctl("sleep", a, "--cause", "idle", *tf, "--instance", "idle-asleep") == 0
    assert _warmctl("verify", f"127.0.0.1:{_free_port()}", *tf, "--instance", "down") == 2
    _waker_files(folder, tmp_path_factory.mktemp("gates"))
    return folder


def _waker_files(folder: Path, gates: Path) -> None:
    """What two wakers write: one woke the requests it held, one whose wake failed and whose
    later request waited past the hold."""
    for name, hold in (("woken", 60.0), ("unwakeable", 0.3)):
        gate = GateFiles(gates / name, name)
        gate.dir.mkdir()
        waker = Waker(gate, "127.0.0.1:9", gates / f"{name}.log", hold=hold,
                      failed_backoff=0, textfile_dir=folder).start()  # fmt: skip
        try:
            gate.wakeable.write_text("asleep\n")
            if name == "woken":
                held = Held(waker.hold).start(2, waker.wait_holding)
                gate.wakeable.unlink()
            else:
                held = Held(waker.hold).start(1, waker.wait_holding)
                gate.wake_request.unlink()  # the wake service ended, still asleep: failed
                assert [a[:2] for a in held.join()] == [(403, "failed")]
                held = Held(waker.hold)  # the next request waits past --hold
                assert waker.hold()[:2] == (403, "timeout")
            held.join()
        finally:
            assert waker.stop() == 0  # its last write


def written_names(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.glob("*.prom"):
        for family in text_string_to_metric_families(path.read_text()):
            names.update(s.name for s in family.samples)
    return names


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])
    return exprs


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


@pytest.fixture(scope="module")
def promtool() -> str:
    if shutil.which("promtool") is None and shutil.which("apt-get") is None:
        pytest.skip("no promtool and no apt-get to fetch Debian's prometheus package")
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "promtool.sh")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_every_metric_the_dashboard_and_rules_query_is_written(textfiles: Path) -> None:
    written = written_names(textfiles)
    assert written <= set(METRICS) | WAKER_SERIES, written - set(METRICS) - WAKER_SERIES
    queried = {n for e in dashboard_exprs() + rule_exprs() for n in NAME.findall(e)}
    ours = {n for n in queried if n.startswith("warmctl_")}
    theirs = {re.sub(r"_(bucket|sum|count)$", "", n) for n in queried - ours}
    assert ours and ours <= written, ours - written
    assert theirs <= VLLM_METRICS, theirs - VLLM_METRICS
    assert {"vllm:time_to_first_token_seconds", "vllm:kv_cache_usage_perc"} <= theirs


def test_the_dashboard_is_provisionable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and "id" not in dash  # provisioned, not exported
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert set(p["gridPos"]) == {"x", "y", "w", "h"}
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
    provider = yaml.safe_load((MONITORING / "grafana-dashboards.yml").read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["type"] == "file"


def test_rules_have_what_alertmanager_needs() -> None:
    doc = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert {"WarmctlVerifyFailing", "WarmctlWakeMissed", "WarmctlAsleepOutsideWindow"} <= set(
        alerts
    )
    for rule in alerts.values():
        assert rule["labels"]["severity"] in ("page", "warning")
        assert rule["annotations"]["summary"]


def test_promtool_checks_rules_and_the_written_metrics(promtool: str, textfiles: Path) -> None:
    rules = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    for path in textfiles.glob("*.prom"):  # Prometheus' own naming lint
        lint = subprocess.run(
            [promtool, "check", "metrics"], input=path.read_text(), capture_output=True, text=True
        )
        assert lint.returncode == 0, (path.name, lint.stdout + lint.stderr)


def _series(folder: Path, wake_at: float) -> list[dict[str, str]]:
    """promtool input series from the real textfiles: each sample held for 40 minutes (next
    wake times moved to `wake_at`, on the test's clock that starts at 0)."""
    out = []
    for path in sorted(folder.glob("*.prom")):
        for family in text_string_to_metric_families(path.read_text()):
            for s in family.samples:
                labels = ", ".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                value = wake_at if s.name.endswith("next_wake_timestamp_seconds") else s.value
                values = f"{value:g}x40"
                if s.name.startswith("warmctl_waker_") and s.name.endswith("_total"):
                    values = f"0x5 {value:g}x35"  # what the waker counted, 5 minutes in
                out.append({"series": f"{s.name}{{{labels}}}", "values": values})
    return out


def test_alerts_fire_on_the_written_metrics(promtool: str, textfiles: Path, tmp_path: Path) -> None:
    host = socket.gethostname()

    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}

    def annotations(name: str, labels: dict[str, str]) -> dict[str, str]:
        """The rule's annotations with its `{{ $labels.x }}` filled in."""

        def fill(text: str) -> str:
            return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)

        return {k: fill(v) for k, v in rules[name]["annotations"].items()}

    def case(name: str, at: str, *expected: dict[str, str]) -> dict:
        return {
            "alertname": name,
            "eval_time": at,
            "exp_alerts": [
                {"exp_labels": labels, "exp_annotations": annotations(name, labels)}
                for labels in expected
            ],
        }

    page, warn = {"severity": "page"}, {"severity": "warning"}
    # "asleep" and "manual" only slept: a sleep does not learn the model (the unit's warmup
    # at the start of a real instance does, and later commands keep it)
    asleep = {"host": host, "vllm_instance": "asleep", "state": "asleep"}
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                # "asleep"'s window said it wakes at 60 s (on promtool's clock)
                "input_series": _series(textfiles, wake_at=60),
                "alert_rule_test": [
                    case(
                        "WarmctlVerifyFailing",
                        "10m",
                        {**page, "host": host, "vllm_instance": "down"},  # refused: error
                        {**page, "host": host, "vllm_instance": "slow"},  # over its ratio
                    ),
                    case("WarmctlWakeMissed", "5m"),  # its wake is not 10 minutes late yet
                    case("WarmctlWakeMissed", "20m", {**page, **asleep}),
                    case(
                        "WarmctlSleepOrWakeFailed",
                        "5m",
                        # no command told its model (a wake without warmup, a failed sleep)
                        {**warn, "host": host, "vllm_instance": "stuck", "command": "sleep"},
                    ),
                    case("WarmctlAsleepOutsideWindow", "20m"),  # not for 30 minutes yet
                    case(  # idle-asleep: the waker's idle sleep, not a sleep by hand
                        "WarmctlAsleepOutsideWindow",
                        "35m",
                        {**warn, "host": host, "vllm_instance": "manual", "state": "asleep"},
                    ),
                    case("WarmctlWakeOnRequestFailed", "4m"),  # nothing failed yet
                    case(
                        "WarmctlWakeOnRequestFailed",
                        "10m",
                        {**page, "host": host, "vllm_instance": "unwakeable"},
                    ),
                    case("WarmctlWakeOnRequestFailed", "35m"),  # over: nothing failed since
                    case(
                        "WarmctlWakeOnRequestSlow",
                        "10m",
                        {**warn, "host": host, "vllm_instance": "unwakeable"},
                    ),
                ],
            }
        ],
    }
    path = tmp_path / "tests.yml"
    path.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_monitoring_doc_lists_every_metric() -> None:
    text = DOC.read_text()
    missing = [name for name in [*METRICS, *WAKER_METRICS] if f"`{name}`" not in text]
    assert not missing, missing

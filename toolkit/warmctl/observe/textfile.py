"""What warmctl learns, as a Prometheus textfile for node_exporter's textfile collector.

One file per instance (`warmctl_<instance>.prom`) in the directory given by `--textfile-dir`.
Each command (verify, warmup, sleep, wake) rewrites its own metrics in that file and keeps the
ones an earlier command wrote (read back with prometheus_client's text parser), so a sleep does
not erase the last verify. The file holds prometheus_client's text, written
as its `write_to_textfile` would (a temporary file renamed over the old one: node_exporter never
reads half a file) but through warmctl.host.safefs (root writes here: no link followed), under a
lock, so a timer's sleep and an operator's verify of the same instance do not lose each other's
metrics.

Labels: `vllm_instance` (the instance's name, else HOST:PORT), `model`, `host` (the machine
the instance runs on) — one series per instance, not per request. The instance label is not
called `instance`: Prometheus sets `instance` on everything it scrapes (here: the
node_exporter), and would rename ours to `exported_instance`.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from warmctl.errors import WarmctlError
from warmctl.host import safefs
from warmctl.server.target import Target
from warmctl.sleepwake.gate import CAUSES

INSTANCE_LABELS = ("vllm_instance", "model", "host")
RESULTS = ("pass", "fail", "asleep", "error")
STATES = ("awake", "asleep", "error")
COMMANDS = ("verify", "warmup", "sleep", "wake")


@dataclass(frozen=True)
class Spec:
    help: str
    labels: tuple[str, ...] = ()  # beyond INSTANCE_LABELS
    owner: str | None = None  # the command whose run replaces every sample of it
    kind: str = "gauge"  # or "counter": kept across runs, each run adds to it


# every metric warmctl writes; docs/MONITORING.md lists the same (a test compares them)
METRICS: dict[str, Spec] = {
    "warmctl_verify_result": Spec(
        "Result of the last verify: 1 for the result it had (pass, fail, asleep, error), 0 else.",
        ("result",),
        "verify",
    ),
    "warmctl_verify_first_ttft_seconds": Spec(
        "Time to the first token of the first request of the last verify.", owner="verify"
    ),
    "warmctl_verify_first_total_seconds": Spec(
        "Total time of the first request of the last verify.", owner="verify"
    ),
    "warmctl_verify_steady_ttft_median_seconds": Spec(
        "Median time to first token of the last verify's steady requests.", owner="verify"
    ),
    "warmctl_verify_steady_ttft_p90_seconds": Spec(
        "90th percentile time to first token of the last verify's steady requests.",
        owner="verify",
    ),
    "warmctl_verify_first_steady_ratio": Spec(
        "First-request TTFT divided by the steady median TTFT (last verify).", owner="verify"
    ),
    "warmctl_verify_decode_seconds_per_token": Spec(
        "Decode time per generated token of the last verify's long request.", owner="verify"
    ),
    "warmctl_verify_attempts": Spec(
        "Measurements the last verify made (more than 1: earlier attempts failed).",
        owner="verify",
    ),
    "warmctl_verify_duration_seconds": Spec(
        "Wall time of the last verify of the instance.", owner="verify"
    ),
    "warmctl_warmup_duration_seconds": Spec(
        "Wall time of the last `warmctl warmup` (the unit's start runs one).",
        owner="warmup",
    ),
    "warmctl_warmup_requests": Spec("Requests the last warmup sent.", owner="warmup"),
    "warmctl_sleep_duration_seconds": Spec(
        "Wall time of the last sleep, drain included, by its cause.", ("cause",), "sleep"
    ),
    "warmctl_sleep_drain_seconds": Spec(
        "Seconds the last sleep waited for in-flight requests, by its cause.", ("cause",), "sleep"
    ),
    "warmctl_sleep_level": Spec(
        "vLLM sleep level of the last sleep (1 or 2), by its cause.", ("cause",), "sleep"
    ),
    "warmctl_sleep_next_wake_timestamp_seconds": Spec(
        "When the sleep window of the last sleep says the instance wakes (Unix time).",
        ("cause",),
        "sleep",
    ),
    "warmctl_wake_duration_seconds": Spec(
        "Wall time of the last wake, its warmup included, by its cause.", ("cause",), "wake"
    ),
    "warmctl_wake_level": Spec(
        "Sleep level the last wake woke from (0: it was already awake), by its cause.",
        ("cause",),
        "wake",
    ),
    "warmctl_wake_output_check_ok": Spec(
        "1 when the output check after the last wake matched, 0 when it did not (absent: "
        "no check ran).",
        ("cause",),
        "wake",
    ),
    "warmctl_sleeps_total": Spec(
        "Sleeps of the instance by cause (window, idle, request, manual) and result (ok, failed).",
        ("cause", "result"),
        kind="counter",
    ),
    "warmctl_wakes_total": Spec(
        "Wakes of the instance by cause (window, idle, request, manual) and result (ok, failed).",
        ("cause", "result"),
        kind="counter",
    ),
    "warmctl_window_skipped_timestamp_seconds": Spec(
        "When a window's sleep or wake last did not happen, by action, window and reason (the "
        "unit's state then, or error: its state could not be read).",
        ("action", "window", "reason"),
    ),
    "warmctl_state": Spec(
        "What the last command left the instance in: 1 for its state (awake, asleep, error).",
        ("state",),
    ),
    "warmctl_last_run_timestamp_seconds": Spec(
        "When a command last ran on the instance (Unix time).", ("command",)
    ),
    "warmctl_last_success_timestamp_seconds": Spec(
        "When a command last succeeded on the instance (Unix time).", ("command",)
    ),
    "warmctl_last_failure_timestamp_seconds": Spec(
        "When a command last failed on the instance (Unix time).", ("command",)
    ),
    "warmctl_last_run_success": Spec(
        "1 when the command's last run succeeded, 0 when it failed.", ("command",)
    ),
}

Key = tuple[str, tuple[tuple[str, str], ...]]  # (metric, sorted labels)
# the most a textfile is read: one instance's file is a few KiB; a bigger one is not ours
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Instance:
    """Whom the metrics are about."""

    name: str
    host: str
    model: str = ""

    @property
    def labels(self) -> dict[str, str]:
        return {"vllm_instance": self.name, "model": self.model, "host": self.host}


def machine_host(target_host: str) -> str:
    """The host an instance runs on: this machine's name for a loopback target."""
    if target_host in ("127.0.0.1", "::1", "localhost") or target_host.startswith("127."):
        return socket.gethostname()
    return target_host


def file_name(instance: str) -> str:
    """`warmctl_<instance>.prom`, with anything unsafe in a file name made `_`."""
    return "warmctl_" + re.sub(r"[^A-Za-z0-9_.-]", "_", instance) + ".prom"


def read_samples(path: Path) -> dict[Key, float]:
    """The warmctl samples a textfile holds ({} when there is none, or it is not ours)."""
    try:
        with safefs.folder(path.parent) as folder:
            return _read_samples(folder, path.name)
    except OSError:  # no folder, or one root may not go through
        return {}


def _read_samples(folder: int, name: str) -> dict[Key, float]:
    """`read_samples` in an open folder: a regular file of at most MAX_BYTES, else {} (a link,
    a FIFO, a device or a file too big is not ours: rewritten from scratch)."""
    try:
        data, _ = safefs.read_regular(folder, name, MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    except safefs.UnsafeFileError:
        return {}
    if len(data) > MAX_BYTES:
        return {}
    out: dict[Key, float] = {}
    try:
        for family in text_string_to_metric_families(data.decode(errors="replace")):
            for s in family.samples:
                if s.name in METRICS:
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    except ValueError:
        return {}  # unreadable (not ours): rewritten from scratch
    return out


class _Samples:
    """A prometheus_client collector over stored samples (gauges, and the counters of sleeps and
    wakes)."""

    def __init__(self, samples: Mapping[Key, float]) -> None:
        self.samples = samples

    def collect(self) -> Iterator[Metric]:
        for name, spec in METRICS.items():
            rows = [(dict(lbl), v) for (n, lbl), v in sorted(self.samples.items()) if n == name]
            if not rows:
                continue
            names = list(INSTANCE_LABELS) + list(spec.labels)
            kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = kind(name, spec.help, labels=names)
            for labels, value in rows:
                family.add_metric([labels.get(n, "") for n in names], value)
            yield family


def _key(name: str, labels: Mapping[str, str]) -> Key:
    return (name, tuple(sorted(labels.items())))


def update(
    directory: str | os.PathLike[str],
    instance: Instance,
    command: str,
    values: Mapping[str, float | Mapping[str, float] | None],
    *,
    ok: bool,
    state: str | None = None,
    now: float | None = None,
) -> Path:
    """Merge one command's results into the instance's textfile; return its path.

    `values`: metric -> value, or -> {label value: value} for the metric's one extra label
    (warmctl_verify_result's result), or -> {(label values...): value} for a metric of several
    extra labels; None leaves the metric out. Every metric `command` owns
    is replaced (a failed verify leaves no stale TTFT behind); the others are kept. A counter's
    value is added to what the file holds.
    """
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}")
    folder = Path(directory)
    path = folder / file_name(instance.name)
    stamp = time.time() if now is None else now
    dir_fd = _open_folder(folder)
    try:
        # read-only is enough for flock: a lock file another user created (root's verify,
        # the vllm user's timers, both in the directory's group) still locks
        fd = safefs.open_lock(dir_fd, f".{path.stem}.lock", 0o664)
        with os.fdopen(fd) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            samples, base = _kept(dir_fd, path.name, instance, command)
            _add_values(samples, base, values)
            if state is not None:
                for s in STATES:
                    samples[_key("warmctl_state", {**base, "state": s})] = float(s == state)
            cmd = {**base, "command": command}
            samples[_key("warmctl_last_run_timestamp_seconds", cmd)] = stamp
            samples[_key("warmctl_last_run_success", cmd)] = float(ok)
            outcome = "success" if ok else "failure"
            samples[_key(f"warmctl_last_{outcome}_timestamp_seconds", cmd)] = stamp
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Samples(samples))  # type: ignore[arg-type]
            # prometheus_client's text, written as write_to_textfile would (a new file renamed
            # over the old one: node_exporter never reads half a file), but never through a
            # link; 0644: readable by node_exporter's user whatever the unit's UMask (0027)
            safefs.replace(dir_fd, path.name, generate_latest(registry), 0o644)
    except OSError as err:
        raise WarmctlError(
            f"cannot write metrics to {str(path)!r}: {err.strerror or err}", kind="input"
        ) from None
    finally:
        os.close(dir_fd)
    return path


def _open_folder(folder: Path) -> int:
    """The textfile folder, opened: root (the deploy's verify, window-check) writes here, in a
    folder the service user's group may write: nothing is followed, created through a link or
    read unbounded (warmctl.host.safefs)."""
    try:
        return safefs.open_folder(folder)
    except (FileNotFoundError, NotADirectoryError):
        raise WarmctlError(
            f"--textfile-dir {str(folder)!r} is not a directory", kind="input"
        ) from None
    except OSError as err:
        raise WarmctlError(
            f"--textfile-dir {str(folder)!r}: {err.strerror or err}", kind="input"
        ) from None


def _kept(
    dir_fd: int, name: str, instance: Instance, command: str
) -> tuple[dict[Key, float], dict[str, str]]:
    """The file's samples of `instance` that `command` does not own, and the labels of the
    instance's samples (the model: the newest one told; a sleep does not tell, keep it)."""
    kept = {
        k: v
        for k, v in _read_samples(dir_fd, name).items()
        if dict(k[1]).get("vllm_instance") == instance.name and METRICS[k[0]].owner != command
    }
    model = instance.model or next((dict(k[1]).get("model", "") for k in kept), "")
    base = {**instance.labels, "model": model}
    samples = {_key(n, {**dict(lbl), "model": model}): v for (n, lbl), v in kept.items()}
    return samples, base


def _add_values(
    samples: dict[Key, float],
    base: dict[str, str],
    values: Mapping[str, float | Mapping[str, float] | None],
) -> None:
    """`values` (see update) into `samples`: a counter's added to what is there."""
    for name, value in values.items():
        if value is None:
            continue
        spec = METRICS[name]
        if isinstance(value, Mapping):
            for label_values, v in value.items():
                vals = label_values if isinstance(label_values, tuple) else (label_values,)
                extra = dict(zip(spec.labels, vals, strict=True))
                key = _key(name, {**base, **extra})
                added = samples.get(key, 0.0) if spec.kind == "counter" else 0.0
                samples[key] = added + float(v)
        else:
            samples[_key(name, base)] = float(value)


def results_onehot(result: str) -> dict[str, float]:
    return {r: float(r == result) for r in RESULTS}


def verify_values(report: Mapping[str, Any]) -> dict[str, Any]:
    """Metric values from `VerifyReport.to_dict()`."""
    status = str(report.get("status") or "ERROR").lower()
    decode = report.get("decode_ms_per_token")
    return {
        "warmctl_verify_result": results_onehot(status if status in RESULTS else "error"),
        "warmctl_verify_first_ttft_seconds": report.get("first_ttft_s"),
        "warmctl_verify_first_total_seconds": report.get("first_total_s"),
        "warmctl_verify_steady_ttft_median_seconds": report.get("steady_median_ttft_s"),
        "warmctl_verify_steady_ttft_p90_seconds": report.get("steady_p90_ttft_s"),
        "warmctl_verify_first_steady_ratio": report.get("ratio"),
        "warmctl_verify_decode_seconds_per_token": None if decode is None else decode / 1000,
        "warmctl_verify_attempts": report.get("attempt") or 1,
        "warmctl_verify_duration_seconds": report.get("total_s"),
    }


def _output_check(report: Mapping[str, Any]) -> float | None:
    """The post-wake output check's verdict when the report carries one."""
    check = report.get("output_check")
    if isinstance(check, Mapping):
        # outputcheck's verdict: passed or failed; not_recorded / other_model: no check ran
        status = check.get("status")
        check = {"passed": True, "failed": False}.get(str(status)) if status else check.get("ok")
    return None if check is None else float(bool(check))


def record(
    directory: str,
    command: str,
    instance: str,
    target_host: str,
    result: Any,
    *,
    next_wake: float | None = None,
    cause: str = "manual",
) -> Path:
    """Write one command's outcome for one instance: `result` is its report, or the
    `WarmctlError` it failed with (or a report's `to_dict()`). A sleep's or a wake's metrics
    carry its `cause` (CAUSES), and count it in warmctl_sleeps_total / warmctl_wakes_total."""
    if cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}")
    report: dict[str, Any] = (
        dict(result)
        if isinstance(result, Mapping)
        else result.to_dict()
        if hasattr(result, "to_dict")
        else {}
    )
    failed = isinstance(result, BaseException)
    kind = getattr(result, "kind", None)
    model = str(report.get("model") or (report.get("warmup") or {}).get("model") or "")
    who = Instance(instance, machine_host(target_host), model)
    values: dict[str, Any] = {}
    state: str | None = None
    if command == "verify":
        values = verify_values(report)
        status = str(report.get("status"))
        from warmctl.observe.verify import STATE_OF, passes

        ok = passes(status)
        state = STATE_OF.get(status, "error")
    elif command == "warmup":
        ok = not failed
        values = {
            "warmctl_warmup_duration_seconds": report.get("total_s"),
            "warmctl_warmup_requests": report.get("requests"),
        }
        state = "awake" if ok else "error"
    elif command == "sleep":
        ok = not failed
        drain = report.get("drain") or {}
        values = {
            "warmctl_sleep_duration_seconds": report.get("total_s"),
            "warmctl_sleep_drain_seconds": drain.get("seconds"),
            "warmctl_sleep_level": report.get("level"),
            "warmctl_sleep_next_wake_timestamp_seconds": next_wake if ok else None,
        }
        # a drain that timed out, or a server that cannot sleep, was left awake
        left_awake = kind in ("drain_timeout", "unsupported")
        state = "asleep" if ok else ("awake" if left_awake else "error")
    else:
        ok = not failed
        values = {
            "warmctl_wake_duration_seconds": report.get("total_s"),
            "warmctl_wake_level": (0 if report.get("already_awake") else report.get("level"))
            if report
            else None,
            "warmctl_wake_output_check_ok": _output_check(report),
        }
        if report.get("output_check") is not None and values["warmctl_wake_output_check_ok"] == 0:
            ok = False
        state = "awake" if ok else "error"
    if command in ("sleep", "wake"):
        values = {k: None if v is None else {cause: v} for k, v in values.items()}
        count = "warmctl_sleeps_total" if command == "sleep" else "warmctl_wakes_total"
        values[count] = {(cause, "ok" if ok else "failed"): 1}
    return update(directory, who, command, values, ok=ok, state=state)


def record_window_skip(
    directory: str, instance: str, action: str, window: str, reason: str
) -> Path:
    """A window's sleep or wake that did not happen: its command's last run counts as failed
    (the alert on warmctl_last_run_success fires), and when and why is kept per window."""
    if action not in ("sleep", "wake"):
        raise ValueError(f"unknown window action {action!r}")
    who = Instance(instance, socket.gethostname())
    count = "warmctl_sleeps_total" if action == "sleep" else "warmctl_wakes_total"
    values = {
        "warmctl_window_skipped_timestamp_seconds": {(action, window, reason): time.time()},
        count: {("window", "failed"): 1},
    }
    return update(directory, who, action, values, ok=False)


def write_metrics(
    textfile_dir: str | None,
    instance_name: str | None,
    command: str,
    targets: Sequence[Target],
    results: Sequence[object],
    *,
    next_wake: float | None = None,
    cause: str = "manual",
) -> int:
    """Write each target's outcome to its textfile (when --textfile-dir is given).
    0, or 2 after one line on stderr per file that could not be written."""
    if not textfile_dir:
        return 0
    from warmctl.terminal.output import error_line

    code = 0
    for t, r in zip(targets, results, strict=True):
        try:
            record(
                textfile_dir,
                command,
                instance_name or t.label,
                t.host,
                r,
                next_wake=next_wake,
                cause=cause,
            )
        except WarmctlError as err:
            error_line(err.message)
            code = 2
    return code

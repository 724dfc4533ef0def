"""`/metrics` scrapes for `warmctl tune`: the histograms, counters and gauges tune reads (through
`warmctl.server.metrics`, the one parser), their difference between two scrapes, and the scrapes
saved
by `--save` for a later `--since`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from warmctl.errors import WarmctlError
from warmctl.server.client import Client
from warmctl.server.metrics import (
    CACHE_INFO,
    E2E_TIME,
    GENERATION_TOKENS,
    INFERENCE_TIME,
    KV_USAGE,
    PREEMPTIONS,
    PROMPT_TOKENS,
    QUEUE_TIME,
    RUNNING,
    SLEEP_STATE,
    STEP_TOKENS,
    SUCCESS,
    WAITING,
    Histogram,
    read_families,
)

HISTOGRAMS = (STEP_TOKENS, PROMPT_TOKENS, GENERATION_TOKENS, INFERENCE_TIME, QUEUE_TIME, E2E_TIME)
COUNTERS = (PREEMPTIONS, SUCCESS)
GAUGES = (RUNNING, WAITING, KV_USAGE)
SAVE_FORMAT = "warmctl-tune-scrapes/1"


@dataclass
class Scrape:
    """One `/metrics` read: histograms and counters summed over label sets (engines)."""

    at: float  # unix time
    text: str
    histograms: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    cache_info: dict[str, str] = field(default_factory=dict)
    sleep_metric: bool = False


def parse_scrape(text: str, at: float, label: str = "server") -> Scrape:
    families = read_families(text, label, histograms=HISTOGRAMS)
    out = Scrape(at=at, text=text, histograms=families.histograms)
    for name in COUNTERS:
        if name in families.samples:
            out.counters[name] = sum(families.values(name, f"{name}_total"))
    for name in GAUGES:
        values = families.values(name)
        if values:
            # KV usage of several engines: the fullest one counts
            out.gauges[name] = max(values) if name == KV_USAGE else sum(values)
    for s in families.samples.get(CACHE_INFO, [])[:1]:
        out.cache_info = {k: v for k, v in s.labels.items() if k != "engine"}
    out.sleep_metric = SLEEP_STATE in families.samples
    return out


def scrape(client: Client) -> Scrape:
    return parse_scrape(client.metrics_text(), time.time(), client.target.label)


def delta(end: Histogram, start: Histogram | None, what: str, label: str) -> Histogram:
    """The observations between two reads of one histogram."""
    if start is None or not start.buckets:
        return end
    if [le for le, _ in end.buckets] != [le for le, _ in start.buckets]:
        raise WarmctlError(
            f"{label}: {what} changed its buckets between the scrapes (a restart with other "
            "settings?): take a new window",
            kind="input",
        )
    out = Histogram(
        buckets=[(le, e - s) for (le, e), (_, s) in zip(end.buckets, start.buckets, strict=True)],
        count=end.count - start.count,
        total=end.total - start.total,
    )
    if out.count < 0 or any(c < 0 for _, c in out.buckets):
        raise WarmctlError(
            f"{label}: {what} went down between the scrapes (the server restarted): "
            "take a new window",
            kind="input",
        )
    return out


# -- saved scrapes (--save / --since) ----------------------------------------------------------
def save_scrapes(path: str | Path, scrapes: dict[str, Scrape]) -> None:
    body = {
        "format": SAVE_FORMAT,
        "scrapes": {url: {"at": s.at, "text": s.text} for url, s in scrapes.items()},
    }
    try:
        Path(path).write_text(json.dumps(body) + "\n", encoding="utf-8")
    except OSError as exc:
        raise WarmctlError(f"cannot write {str(path)!r}: {exc.strerror}", kind="input") from None


def load_scrapes(path: str | Path) -> dict[str, tuple[float, str]]:
    """base URL -> (unix time, /metrics text) from a file `--save` wrote."""
    where = f"scrape file {str(path)!r}"
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise WarmctlError(f"{where} not found", kind="input") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WarmctlError(f"{where} is unreadable: {exc}", kind="input") from None
    if not isinstance(body, dict) or body.get("format") != SAVE_FORMAT:
        raise WarmctlError(f"{where} was not written by `warmctl tune --save`", kind="input")
    out: dict[str, tuple[float, str]] = {}
    for url, item in (body.get("scrapes") or {}).items():
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            out[str(url)] = (float(item.get("at", 0.0)), item["text"])
    return out

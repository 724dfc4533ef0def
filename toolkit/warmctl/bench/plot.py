"""Each start of a benchmark document drawn as one stacked bar of its startup phases (and the
unit's warmup on top), side by side, from the JSON alone. Needs matplotlib (the `bench` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warmctl.bench.starts import starts
from warmctl.errors import WarmctlError

WARMUP = "unit warmup (ExecStartPost)"


def bars(doc: dict[str, Any]) -> tuple[list[str], list[str], dict[str, list[float]]]:
    """(start labels, phase names in startup order, seconds per phase per start)."""
    steps = [
        s for s in starts(doc) if "skipped" not in s and (s.get("startup") or {}).get("phases")
    ]
    names: list[str] = []
    for s in steps:
        for p in s["startup"]["phases"]:
            if p["name"] not in names:
                names.append(p["name"])
    if any((s.get("warmup") or {}).get("seconds") for s in steps):
        names.append(WARMUP)
    values: dict[str, list[float]] = {n: [] for n in names}
    for s in steps:
        own: dict[str, float] = {}
        for p in s["startup"]["phases"]:
            own[p["name"]] = own.get(p["name"], 0.0) + max(0.0, p["end_s"] - p["start_s"])
        own[WARMUP] = float((s.get("warmup") or {}).get("seconds") or 0.0)
        for n in names:
            values[n].append(own.get(n, 0.0))
    labels = [_label(s) for s in steps]
    return labels, names, values


def _label(step: dict[str, Any]) -> str:
    total = step.get("warm_s") or step.get("ready_s")
    text = f"{step['name']}\n{total:.1f} s" if isinstance(total, (int, float)) else step["name"]
    return text


def draw(doc: dict[str, Any], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise WarmctlError(
            "drawing needs matplotlib: pip install 'warmctl[bench]'", kind="missing_dependency"
        ) from None
    labels, names, values = bars(doc)
    if not labels:
        raise WarmctlError("no start with startup phases in this document", kind="input")
    meta = doc.get("meta", {})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(labels) + 3.5), 6.0))
    cmap = plt.get_cmap("tab20")
    bottom = [0.0] * len(labels)
    for i, name in enumerate(names):
        vals = values[name]
        ax.bar(labels, vals, bottom=bottom, label=name, color=cmap(i % 20), edgecolor="white")
        for x, (b, v) in enumerate(zip(bottom, vals, strict=True)):
            if v >= 4.0:  # label the phases tall enough to read
                ax.text(x, b + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=7)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("seconds since the process started")
    ax.set_title(
        f"start -> warm, by phase: vLLM {meta.get('vllm_version', '?')} on "
        f"{meta.get('device_name') or meta.get('device', '?')}",
        fontsize=10,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

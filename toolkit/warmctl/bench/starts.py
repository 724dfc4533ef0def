"""Every start of a benchmark document, relaunches included: a launcher configuration's
relaunch (SIGHUP, the server forked again from the imported interpreter) is measured like a
start and shown beside the others as `NAME relaunch`, state "relaunch"."""

from __future__ import annotations

from typing import Any


def starts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in doc.get("steps", []):
        out.append(step)
        again = step.get("relaunch")
        if isinstance(again, dict) and "skipped" not in step:
            out.append(
                {
                    **again,
                    "name": f"{step['name']} relaunch",
                    "config": step.get("config"),
                    "state": "relaunch",
                }
            )
    return out

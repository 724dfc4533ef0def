"""The waker's configuration file (`warmctl waker --config FILE`): the JSON object the role renders
from the instance's plan (warmctl.plan.units.waker_config), read and checked here. A bad file is
one line (WarmctlError, exit 2) before anything is bound or written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.server.target import parse_target
from warmctl.sleepwake.gate import Flags
from warmctl.sleepwake.triggers import BY_CAUSE
from warmctl.waker.detector import Trigger, detector_class
from warmctl.waker.service import WakerConfig
from warmctl.waker.wakehere import WakeHere

# key: (the types it takes, required); None among the types: the key may be null
_PATH = (str,)
_MAYBE = (str, type(None))
_NUMBER = (int, float)
KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": (_PATH, True),
    "target": (_PATH, True),
    "socket": (_PATH, True),
    "activity_socket": (_MAYBE, False),
    "socket_group": (_MAYBE, False),
    "max_connections": ((int,), False),
    "flags": ((dict,), True),
    "triggers": ((list,), False),
    "hold": (_NUMBER, False),
    "failed_backoff": (_NUMBER, False),
    "wake_here": ((bool,), False),
    "output_check": (_MAYBE, False),
    "textfile_dir": (_MAYBE, False),
}
FLAG_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "wakeable": (_PATH, True),
    "closed": (_PATH, True),
    "warming": (_PATH, True),
    "draining": (_PATH, True),
    "wake_request": (_PATH, True),
    "holding": (_MAYBE, False),
}
# one of `triggers`: a sleep trigger's detector (warmctl.sleepwake.triggers, by its cause)
TRIGGER_KEYS: dict[str, tuple[tuple[type, ...], bool]] = {
    "cause": (_PATH, True),
    "request_file": (_PATH, True),
    "settings": ((dict,), True),
}
_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true/false",
               dict: "an object", list: "a list", type(None): "null"}  # fmt: skip
# the lowest value of each number (the command's options had the same bounds)
MINIMA = {"max_connections": 1, "hold": 0.1, "failed_backoff": 0}
DEFAULTS = {"max_connections": 1024, "hold": 120.0, "failed_backoff": 30.0}


def _problems(
    data: dict[str, Any], keys: dict[str, tuple[tuple[type, ...], bool]], where: str
) -> list[str]:
    problems = [
        f"{where}{k}: not a key of the waker's configuration" for k in data if k not in keys
    ]
    for key, (types, required) in keys.items():
        if key not in data:
            problems += [f"{where}{key}: missing"] if required else []
            continue
        value = data[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            found = _JSON_NAMES.get(type(value), type(value).__name__)
            problems.append(f"{where}{key}: {found} where {_names(types)} goes")
        elif key in MINIMA and value < MINIMA[key]:
            problems.append(f"{where}{key}: {value} is below {MINIMA[key]}")
    return problems


def _names(types: tuple[type, ...]) -> str:
    names = [_JSON_NAMES[t] for t in types if t is not int or float not in types]
    return " or ".join(names)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise WarmctlError(
            f"waker: --config {path}: cannot read it ({exc})", kind="input"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WarmctlError(f"waker: --config {path}: not JSON ({exc})", kind="input") from None
    if not isinstance(data, dict):
        raise WarmctlError(f"waker: --config {path}: not a JSON object", kind="input")
    return data


def _trigger(item: Any, where: str) -> tuple[list[str], Trigger | None]:
    """One of `triggers`: its problems, or the trigger."""
    if not isinstance(item, dict):
        return [f"{where}: {_JSON_NAMES.get(type(item), type(item).__name__)} where an object "
                "goes"], None  # fmt: skip
    problems = _problems(item, TRIGGER_KEYS, f"{where}.")
    if problems:
        return problems, None
    kind = BY_CAUSE.get(item["cause"])
    if kind is None:
        known = ", ".join(BY_CAUSE)
        return [f"{where}.cause: {item['cause']!r} is no sleep trigger's (one of {known})"], None
    problems = detector_class(kind).problems(item["settings"])
    if problems:
        return [f"{where}.settings.{p}" for p in problems], None
    return [], Trigger(kind, Path(item["request_file"]), item["settings"])


def _triggers(items: Any) -> tuple[list[str], list[Trigger]]:
    """Every problem of `triggers`, or the triggers."""
    problems: list[str] = []
    triggers: list[Trigger] = []
    for index, item in enumerate(items if isinstance(items, list) else []):
        found, trigger = _trigger(item, f"triggers[{index}]")
        problems += found
        triggers += [trigger] if trigger is not None else []
    return problems, triggers


def _wake(data: dict[str, Any], flags: dict[str, Any]) -> WakeHere | None:
    """The waker's own wake (vLLM sleep mode: `wake_here`), as the wake service runs it
    (`warmctl wake TARGET --gate CLOSED --gate WAKEABLE --cause request`); None: a wake is
    systemd's (a start of the unit)."""
    if not data.get("wake_here"):
        return None
    return WakeHere(
        target=data["target"],
        gates=(flags["closed"], flags["wakeable"]),
        check_file=data.get("output_check") or None,
        textfile_dir=data.get("textfile_dir") or None,
        instance=data["name"],
    )


def load_config(path: Path) -> WakerConfig:
    """The waker's configuration in `path`; every problem of it in one line (WarmctlError)."""
    data = _read(path)
    problems = _problems(data, KEYS, "")
    flags = data.get("flags")
    if isinstance(flags, dict):
        problems += _problems(flags, FLAG_KEYS, "flags.")
    found, triggers = _triggers(data.get("triggers"))
    problems += found
    if not problems and data.get("output_check") and not data.get("wake_here"):
        problems.append("output_check goes with wake_here")
    if not problems:
        try:
            target = parse_target(data["target"])
        except WarmctlError as exc:
            problems.append(f"target: {exc.message}")
        else:
            if target.prefix or target.scheme != "http":
                problems.append(f"target {data['target']!r}: HOST:PORT of vLLM on this host")
    if problems:
        raise WarmctlError(f"waker: --config {path}: " + "; ".join(problems), kind="input")
    assert isinstance(flags, dict)
    values = {**DEFAULTS, **data}

    def optional(value: Any) -> Path | None:
        return Path(value) if value else None

    return WakerConfig(
        name=data["name"],
        socket=Path(data["socket"]),
        activity_socket=optional(data.get("activity_socket")),
        flags=Flags(
            wakeable=Path(flags["wakeable"]),
            closed=Path(flags["closed"]),
            warming=Path(flags["warming"]),
            draining=Path(flags["draining"]),
            wake_request=Path(flags["wake_request"]),
            asks=tuple(t.request for t in triggers if t.kind.action == "sleep"),
            holding=optional(flags.get("holding")),
        ),
        target=data["target"],
        triggers=tuple(triggers),
        hold=float(values["hold"]),
        failed_backoff=float(values["failed_backoff"]),
        textfile_dir=data.get("textfile_dir") or None,
        wake=_wake(data, flags),
        socket_group=data.get("socket_group") or None,
        max_connections=int(values["max_connections"]),
    )

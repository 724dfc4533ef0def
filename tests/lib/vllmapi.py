"""The unit checked against a vLLM release's own code: what the rendered units pass to vLLM
(arguments, VLLM_* variables) and every route warmctl calls, asked of that release in one
subprocess (`vllm_api_probe.py`, run by the vLLM venv's python).

    report = probe(python, Question(argvs=..., routes=..., env=...))
    report.problems()   # one line per argument, route or variable the release does not take
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.lib.common import LabError

PROBE = Path(__file__).with_name("vllm_api_probe.py")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Question:
    argvs: list[list[str]] = field(default_factory=list)  # [MODULE, ARG...] each
    routes: list[tuple[str, str, list[str]]] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)  # imported by name (-m, the launcher)

    def to_json(self) -> str:
        routes = [list(r) for r in self.routes]
        return json.dumps(
            {"argvs": self.argvs, "routes": routes, "env": self.env, "modules": self.modules}
        )


@dataclass
class Report:
    version: str
    raw: dict[str, Any]

    def argv_errors(self) -> dict[tuple[str, ...], str]:
        return {tuple(a["argv"]): a["error"] for a in self.raw["argvs"] if a["error"]}

    def route_errors(self) -> dict[tuple[str, str], str]:
        return {
            (r["route"][0], r["route"][1]): r["error"] for r in self.raw["routes"] if r["error"]
        }

    def unknown_env(self) -> list[str]:
        return sorted(name for name, known in self.raw["env"].items() if not known)

    def module_errors(self) -> dict[str, str]:
        return {name: error for name, error in self.raw["modules"].items() if error}

    def problems(self) -> list[str]:
        lines = [f"cannot import {name}: {error}" for name, error in self.module_errors().items()]
        lines += [f"{' '.join(argv)}: {error}" for argv, error in self.argv_errors().items()]
        lines += list(self.route_errors().values())
        lines += [
            f"{name} is not a variable vLLM {self.version} reads" for name in self.unknown_env()
        ]
        return lines


def probe(python: Path, question: Question, timeout: float = 300.0) -> Report:
    """Ask the vLLM of `python` (one process: its imports are most of the time)."""
    proc = subprocess.run(
        [str(python), str(PROBE)],
        input=question.to_json(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",  # nothing of the checkout may shadow a module vLLM imports
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    try:
        raw = json.loads(last)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LabError(f"the vLLM probe failed (exit {proc.returncode}): {tail}") from None
    return Report(version=str(raw["version"]), raw=raw)


def rendered_units() -> list[tuple[str, Any]]:
    """(label, warmctl.plan.render.RenderedInstance) of every instance of the example inventory and
    the test inventories (tests/ansible/cases.GOOD), each rendered for a GPU and a CPU host
    (an instance one kind of host refuses is left out for that kind)."""
    from tests.ansible.cases import GOOD
    from warmctl.plan.inventory import host_vars
    from warmctl.plan.render import RenderError, render_instance

    hosts: list[tuple[str, Mapping[str, Any]]] = [
        (f"example/{name}", hv) for name, hv in host_vars(ROOT / "inventories/example/hosts.yml")
    ]
    hosts += [(f"cases/{name}", hv) for name, hv in GOOD.items()]
    out = []
    for label, hv in hosts:
        settings = {k: v for k, v in hv.items() if k != "vllm_service_instances"}
        for device in ("gpu", "cpu"):
            for instance in hv.get("vllm_service_instances") or []:
                try:
                    r = render_instance(
                        instance, {**settings, "vllm_preflight_device_kind": device}, label
                    )
                except RenderError:
                    continue
                out.append((f"{label}/{instance['name']} ({device})", r))
    return out


def question_for(units: Iterable[Any], routes: Iterable[Any]) -> Question:
    """What the units pass to vLLM: each server's `-m MODULE ARGS` (under the launcher, its
    launch file's arguments), the VLLM_* variables of its env and launch files, the modules
    it runs and the launcher imports by name (its DEFAULT_PRELOAD); and the routes
    (warmctl.plan.vllmmatrix.ROUTES)."""
    from warmctl.launcher.vllm_launch import DEFAULT_PRELOAD

    argvs: dict[tuple[str, ...], None] = {}
    env: dict[str, None] = {}
    for r in units:
        argv = list(r.plan.server_argv)
        if argv[1:2] != ["-m"]:
            raise LabError(f"{r.name}: the server does not run `python -m MODULE`: {argv[:3]}")
        argvs[tuple(argv[2:])] = None
        for name in {**r.env, **r.plan.launch_env}:
            if name.startswith("VLLM_"):
                env[name] = None
    modules = {a[0]: None for a in argvs} | dict.fromkeys(DEFAULT_PRELOAD)
    return Question(
        argvs=[list(a) for a in argvs],
        routes=[(r.method, r.path, list(r.params)) for r in routes],
        env=sorted(env),
        modules=list(modules),
    )

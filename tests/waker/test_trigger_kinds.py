"""A new sleep trigger is data: its setting in the argument spec, a row of
warmctl.sleepwake.triggers.KINDS and its detector, and nothing else (docs/ARCHITECTURE.md, "What
a change touches"). A fake kind (`nap_sleep`, its detector below) is added the way a new one
would be, in a fresh interpreter, before anything else imports the kinds; the unchanged plan,
validation, gate model, units, templates and waker then carry it from the inventory to the
request file its detector creates."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from warmctl.sleepwake.triggers import TriggerKind

ROOT = Path(__file__).resolve().parents[2]
NAP = TriggerKind(
    key="nap_sleep",
    cause="nap",
    action="sleep",
    request="nap-request",
    detector="tests.waker.test_trigger_kinds:NapWatch",
    purpose="nap",
    asked="a nap after {after} s",
    watch="after {after} s it asks for a nap; ",
    durations=("after",),
    watched=("after",),
)
# the spec entry a new trigger adds to the instance's options
SPEC = {"type": "dict", "options": {"after": {"type": "raw", "required": True},
                                    "level": {"type": "int", "choices": [1, 2]}}}  # fmt: skip
NAPPER = {
    "name": "napper",
    "model": "/srv/m",
    "port": 8000,
    "nap_sleep": {"after": "2m", "level": 2},
}
UNITS = "/etc/systemd/system"


class NapWatch:
    """The fake kind's detector: asks for its nap at once."""

    pause = 0.1

    def __init__(self, watch: Any) -> None:
        self.watch = watch

    @classmethod
    def problems(cls, settings: Mapping[str, Any]) -> list[str]:
        return [] if settings.get("after", 0) > 0 else ["after: not above 0"]

    async def run(self) -> None:
        from warmctl.sleepwake.gate import ask

        ask(self.watch.request, "a nap")
        await asyncio.Event().wait()

    def activity(self, count: int) -> None:
        raise AssertionError("the nap reads no activity log")

    def state(self) -> dict[str, Any]:
        return {"naps": 1}

    def summary(self) -> str:
        return f"a nap after {self.watch.settings['after']:g} s"


def _add_the_kind() -> None:
    """What a new trigger's files do: a row of KINDS (and its spec entry, here in memory)."""
    from warmctl.sleepwake import triggers

    triggers.KINDS = (*triggers.KINDS, NAP)
    triggers.BY_CAUSE[NAP.cause] = NAP
    from warmctl.plan.validate import variable_specs

    variable_specs()["vllm_service_instances"]["options"]["nap_sleep"] = SPEC


def _plan(tmp: Path) -> None:
    from warmctl.errors import WarmctlError
    from warmctl.plan.render import render_instance
    from warmctl.sleepwake.gate import CAUSES

    assert "nap" in CAUSES  # the commands' --cause, the flag's text, the metrics
    rendered = render_instance(NAPPER, {"vllm_preflight_device_kind": "gpu"})
    files = rendered.files
    service = files[f"{UNITS}/vllm-napper-sleep-nap.service"]
    assert "Description=vLLM instance napper: sleep (a nap after 120 s; asked by the waker)" in (
        service
    )
    assert "--level 2 --gate /run/vllm-gate/napper.wakeable --cause nap" in service
    assert "ExecStopPost=-+/bin/rm -f /run/vllm-gate/napper.nap-request" in service
    path = files[f"{UNITS}/vllm-napper-sleep-nap.path"]
    assert "PathExists=/run/vllm-gate/napper.nap-request" in path and "(nap)" in path
    waker = json.loads(files["/etc/vllm/napper.waker.json"])
    request = "/run/vllm-gate/napper.nap-request"
    nap = {"cause": "nap", "request_file": request, "settings": {"after": 120}}
    assert waker["triggers"] == [nap]
    assert "after 120 s it asks for a nap; " in files[f"{UNITS}/vllm-napper-waker.service"]
    assert rendered.plan.units["proxy"]["activity_log"] == []  # it reads no activity log
    for value, host, said in (
        ({"after": "soon"}, {}, 'nap_sleep.after: is the string "soon" (seconds, or a duration'),
        ({"after": 60}, {"vllm_proxy_enabled": False}, "nap_sleep: is set without the proxy"),
    ):
        try:
            render_instance({**NAPPER, "nap_sleep": value}, host)
        except WarmctlError as err:
            assert said in err.message, err.message
        else:
            raise AssertionError(f"{value} {host}: not refused")
    (tmp / "plan.ok").write_text("")


async def _waker(tmp: Path) -> None:
    from tests.waker.support import GateFiles, waker_config, write_config
    from warmctl.waker.config import load_config
    from warmctl.waker.service import check, serve

    gate = GateFiles(tmp / "gate", "napper")
    gate.dir.mkdir()
    request = gate.path("nap-request")
    config = waker_config(gate, "127.0.0.1:9")
    config["triggers"] = [{"cause": "nap", "request_file": str(request), "settings": {"after": 1}}]
    cfg = load_config(write_config(config, tmp / "napper.waker.json"))
    assert [t.kind for t in cfg.triggers] == [NAP] and cfg.flags.asks == (request,)
    check(cfg)
    stop = asyncio.Event()
    served = asyncio.create_task(serve(cfg, stop))

    async def asked() -> None:
        while not request.exists():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(asked(), 60)
    assert "a nap" in request.read_text() and not cfg.flags.awake()
    stop.set()
    await asyncio.wait_for(served, 60)
    (tmp / "waker.ok").write_text("")


def scenario(tmp: str) -> None:
    _add_the_kind()
    _plan(Path(tmp))
    asyncio.run(_waker(Path(tmp)))


def test_a_new_trigger_is_its_spec_entry_its_kind_and_its_detector(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = f"from tests.waker.test_trigger_kinds import scenario; scenario({str(tmp_path)!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "plan.ok").exists() and (tmp_path / "waker.ok").exists()
    assert "a nap after 1 s" in done.stdout + done.stderr  # the waker's start line


def test_the_idle_sleep_is_a_kind_and_its_cause_is_the_gates() -> None:
    from warmctl.sleepwake.gate import CAUSES
    from warmctl.sleepwake.triggers import BY_CAUSE, KINDS

    assert [k.cause for k in KINDS] == ["idle"] and BY_CAUSE["idle"].key == "idle_sleep"
    assert CAUSES == ("window", "idle", "request", "manual")  # the CLI's --cause order


def test_a_kind_is_on_when_its_key_is_a_mapping_whatever_settings_it_has() -> None:
    """Off: unset or empty (None); on: its settings, even a kind's with none to read ({})."""
    bare = TriggerKind(key="wake_at_boot", cause="boot", action="wake", request="boot-request",
                       detector="x:Y", purpose="", asked="", watch="")  # fmt: skip
    assert (bare.settings(None, "n"), bare.settings({}, "n")) == (None, None)
    assert bare.settings({"when": "always"}, "n") == {}
    assert NAP.settings({"after": "2m"}, "n") == {"after": 120, "level": 1}

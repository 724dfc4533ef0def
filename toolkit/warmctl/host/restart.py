"""Apply a changed configuration to an instance's unit, as a deploy does (`warmctl restart`, the
vllm_service role's restart): restart it, or with `reload` asked (only the launch file changed,
or the restart playbook's relaunch) reload it where that applies the change.

A reload applies it when the unit can reload (systemd's CanReload: its ExecReload, which only a
unit under the pre-imported launcher has), runs, and its launcher says a relaunch can apply its
launch file as it is now (warmctl.launcher.relaunch.check, with vLLM's own verdict from the
launcher's standby): root reads only the files the instance's plan gives it (own_files), whatever
the launcher's command line names. What only a restart applies (a variable vLLM read at import, a
launcher upgraded on disk) restarts, and says why; a launch file the launcher cannot read or vLLM
rejects fails with nothing done, the server it runs serving on. After a reload, the launcher's
state must show its new server launched from the file as it is now.

systemctl runs as root over systemd's private socket (warmctl.host.unitstate); each job waits at
most `job_timeout` seconds (the unit's own stop and start timeouts bound it first)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

from warmctl.errors import WarmctlError
from warmctl.launcher import relaunch

PROPERTIES = ("ActiveState", "MainPID", "CanReload")
SHOW_TIMEOUT = 30.0
SAID_MAX = 300  # the most of systemctl's own words repeated in a line


@dataclass(frozen=True)
class Applied:
    """What was done to the instance's unit."""

    name: str
    action: str  # "reloaded" or "restarted"
    why: str = ""  # a reload was asked and a restart applies the change: why
    generation: int | None = None  # reloaded: the launcher's count of servers
    argv: str = ""  # reloaded: what its new server runs (secrets masked)

    def line(self) -> str:
        if self.action == "reloaded":
            return (f"{self.name}: reloaded (launcher generation {self.generation or '?'} "
                    f"runs: {self.argv or '?'})")  # fmt: skip
        return f"{self.name}: restarted" + (f" (a reload cannot apply the change: {self.why})"
                                             if self.why else "")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {"instance": self.name, "action": self.action, "why": self.why or None,
                "generation": self.generation, "argv": self.argv or None}  # fmt: skip


def _systemctl(args: list[str], timeout: float, systemctl: str) -> str:
    argv = [systemctl, *args]
    what = " ".join(a for a in args if a != "--")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise WarmctlError(f"{systemctl}: not found", kind="unit_state") from None
    except subprocess.TimeoutExpired:
        raise WarmctlError(f"systemctl {what}: no end in {timeout:.0f} s") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout or "").split())[:SAID_MAX]
        raise WarmctlError(f"systemctl {what}: {said or f'exit status {done.returncode}'}")
    return done.stdout


def unit_properties(unit: str, systemctl: str = "systemctl") -> dict[str, str]:
    """PROPERTIES of `unit`, as systemctl show prints them (KEY=VALUE lines)."""
    args = ["show", *(f"--property={p}" for p in PROPERTIES), "--", unit]
    out = _systemctl(args, SHOW_TIMEOUT, systemctl)
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {p: found.get(p, "") for p in PROPERTIES}


def _reload(
    name: str, unit: str, config_dir: str, pid: int, vet_timeout: float, job: float, systemctl: str
) -> Applied:
    """Reload `unit` whose launcher `pid` can apply the change; WarmctlError (RESTART_NEEDED)
    when only a restart can, any other when the launch file cannot be applied."""
    expect = relaunch.own_files(config_dir, name)
    checked = relaunch.check(pid, expect=expect)
    relaunch.vet(pid, checked, vet_timeout)
    _systemctl(["reload", "--", unit], job, systemctl)
    try:  # reloaded: whatever this says, never a restart on top
        now = relaunch.check(pid, expect=expect)
    except WarmctlError as err:
        raise WarmctlError(f"{unit}: reloaded, but its launcher's state says: {err}") from None
    if now.current is False:  # only a change during the reload explains it
        raise WarmctlError(f"{unit}: reloaded, but its server runs an older launch file")
    state = now.state or {}
    return Applied(name, "reloaded", generation=state.get("generation"),
                   argv=str(state.get("argv") or ""))  # fmt: skip


def apply(
    name: str,
    unit: str,
    config_dir: str,
    *,
    reload: bool,
    vet_timeout: float,
    job_timeout: float,
    systemctl: str = "systemctl",
) -> Applied:
    """Restart `unit` of instance `name`, or reload it where asked and it applies the change."""
    why = ""
    if reload:
        props = unit_properties(unit, systemctl)
        pid = int(props["MainPID"] or 0)
        if props["CanReload"] == "yes" and props["ActiveState"] == "active" and pid > 1:
            try:
                return _reload(name, unit, config_dir, pid, vet_timeout, job_timeout, systemctl)
            except WarmctlError as err:
                if err.exit_code != relaunch.RESTART_NEEDED:
                    raise
                why = err.message
    _systemctl(["restart", "--", unit], job_timeout, systemctl)
    return Applied(name, "restarted", why=why)

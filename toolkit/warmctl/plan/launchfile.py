"""What an instance's launch file carries (the pre-imported launcher reads it at every
(re)launch, so a change of it is a `systemctl reload`, not a restart): vLLM's arguments, and of
the instance's environment the variables a relaunch can change.

The line is the launcher's (`vllm_launch.RELAUNCH_ENV`, with why): vLLM's own variables,
VLLM_*, which vLLM reads through `vllm.envs` at each access; a change of one that vLLM read
while the launcher imported it is refused at the relaunch, and a deploy restarts instead. Two of
them stay in the unit's environment file all the same: warmctl's own commands in the unit (the
warmup of ExecStartPost and ExecReload) read them (UNIT_ENV). Every other variable lives in the
environment file, whose change restarts the unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from warmctl.launcher.vllm_launch import RELAUNCH_ENV
from warmctl.warmth.prompts import ENV_PREWARM

# read by warmctl's commands in the unit (--api-key's variable, the warmup's prompt)
UNIT_ENV = ("VLLM_API_KEY", ENV_PREWARM)


def applies(name: str) -> bool:
    """Whether a variable of this name goes to the launch file (else the environment file)."""
    return bool(RELAUNCH_ENV.match(name)) and name not in UNIT_ENV


def launch_env(pairs: Iterable[Any]) -> dict[str, str]:
    """The launch file's variables from an instance's environment, (name, value) pairs in the
    environment file's order (a later pair wins, as systemd's later line does)."""
    out: dict[str, str] = {}
    for name, value in pairs:
        if applies(str(name)):
            out.pop(str(name), None)  # a later pair wins, at its own place
            out[str(name)] = str(value)
    return out

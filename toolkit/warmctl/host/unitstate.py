"""A systemd unit's state, read the way a window service can rely on: `systemctl show` run as
root talks to systemd over its private socket (/run/systemd/private), so it needs no D-Bus. As
an unprivileged user `systemctl` needs the system bus, which minimal images and containers do
not run: there `systemctl is-active` prints nothing and fails, and a window whose check asked
that way skipped every sleep without saying why."""

from __future__ import annotations

import subprocess

from warmctl.errors import WarmctlError

# ActiveState values (systemd.unit(5), org.freedesktop.systemd1.Unit)
KNOWN_STATES = frozenset(
    ("active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance")
)
# the state a window may act on
ACTIONABLE = "active"


def active_state(unit: str, systemctl: str = "systemctl", timeout: float = 30.0) -> str:
    """The unit's ActiveState; `WarmctlError` (kind "unit_state") when it cannot be read."""
    argv = [systemctl, "show", "--property=ActiveState", "--value", "--", unit]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise WarmctlError(
            f"cannot read the state of {unit}: {systemctl}: not found", kind="unit_state"
        ) from None
    except subprocess.TimeoutExpired:
        raise WarmctlError(
            f"cannot read the state of {unit}: {systemctl} gave no answer in {timeout:.0f} s",
            kind="unit_state",
        ) from None
    state = proc.stdout.strip()
    if proc.returncode != 0 or state not in KNOWN_STATES:
        said = " ".join((proc.stderr or proc.stdout or "").split())[:300]
        why = said or f"exit status {proc.returncode}, no output"
        raise WarmctlError(
            f"cannot read the state of {unit}: {systemctl}: {why}", kind="unit_state"
        )
    return state

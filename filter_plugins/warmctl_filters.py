"""Jinja2 filters of the project's templates, shared with `warmctl.render` (one implementation).

vllm_systemd_quote / vllm_env_quote: quoting for unit files and environment files;
vllm_oncalendar: cron or OnCalendar -> list of OnCalendar expressions (checked);
vllm_calendar_error: '' or the reason an expression is unusable (for preflight asserts);
vllm_validate: every problem of a host's role variables, one line each (warmctl.validate).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    import warmctl  # noqa: F401
except ImportError:  # a checkout without warmctl installed: use the source tree beside us
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "toolkit"))

from ansible.errors import AnsibleFilterError

from warmctl.calendar import CalendarError, calendar_error, to_oncalendar
from warmctl.unitfile import env_quote, systemd_quote
from warmctl.validate import validate


def vllm_oncalendar(expr: Any) -> list[str]:
    try:
        return to_oncalendar(expr)
    except CalendarError as exc:
        raise AnsibleFilterError(str(exc)) from None


def vllm_validate(variables: Any, host: str, device: str | None = None) -> list[str]:
    """`variables` (e.g. `vars`) checked as `warmctl render` checks them: one line per problem."""
    return validate(variables, host, device)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "vllm_systemd_quote": systemd_quote,
            "vllm_env_quote": env_quote,
            "vllm_oncalendar": vllm_oncalendar,
            "vllm_calendar_error": calendar_error,
            "vllm_validate": vllm_validate,
        }

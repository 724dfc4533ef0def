"""Jinja2 filters of the collection's templates, shared with `warmctl.render` (one implementation).

vllm_systemd_quote / vllm_env_quote: quoting for unit files and environment files;
vllm_oncalendar: cron or OnCalendar -> list of OnCalendar expressions (checked);
vllm_calendar_error: '' or the reason an expression is unusable (for preflight asserts);
vllm_instance_facts: an instance's derived facts (warmctl.facts; vllm_preflight sets them once per host);
vllm_validate: every problem of a host's role variables, one line each (warmctl.validate).

The code is warmctl's own: in an installed collection it comes from the warmctl wheel the
collection ships in files/ (the wheel the roles install on the hosts); in a checkout, from the
source tree beside this file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

_COLLECTION = Path(__file__).resolve().parents[2]


def _warmctl_path() -> str | None:
    source = _COLLECTION / "toolkit"
    if (source / "warmctl").is_dir():
        return str(source)
    wheels = sorted((_COLLECTION / "files").glob("warmctl-*-py3-none-any.whl"))
    return str(wheels[-1]) if wheels else None


_PATH = _warmctl_path()
if _PATH and _PATH not in sys.path:
    sys.path.insert(0, _PATH)
if _PATH and _PATH.endswith(".whl"):
    # ansible-core's collection loader puts a path hook first that claims every sys.path entry;
    # under Python 3.12 its finder does not read zip files, so the wheel is given its
    # zipimporter directly (the cache is where Python's path finder looks first)
    import zipfile
    import zipimport

    with zipfile.ZipFile(_PATH) as _wheel:
        _packages = {n.rsplit("/", 1)[0] for n in _wheel.namelist() if n.endswith("/__init__.py")}
    for _entry in [_PATH, *(f"{_PATH}/{p}" for p in sorted(_packages))]:
        sys.path_importer_cache[_entry] = zipimport.zipimporter(_entry)

from ansible.errors import AnsibleFilterError  # noqa: E402

from warmctl.calendar import CalendarError, calendar_error, to_oncalendar  # noqa: E402
from warmctl.facts import instance_facts  # noqa: E402
from warmctl.unitfile import env_quote, systemd_quote  # noqa: E402
from warmctl.validate import validate  # noqa: E402


def vllm_oncalendar(expr: Any) -> list[str]:
    try:
        return to_oncalendar(expr)
    except CalendarError as exc:
        raise AnsibleFilterError(str(exc)) from None


def vllm_instance_facts(instance: Any, settings: Any) -> dict[str, Any]:
    try:
        return instance_facts(instance, settings).as_dict()
    except ValueError as exc:
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
            "vllm_instance_facts": vllm_instance_facts,
            "vllm_validate": vllm_validate,
        }

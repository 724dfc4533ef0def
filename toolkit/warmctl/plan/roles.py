"""The collection's data that warmctl reads: its roles (defaults, argument specs, order) and its
templates. In a checkout they are the folders at the repository root; in the wheel, the same
files packed under `warmctl/_roles` and `warmctl/_templates` (one source, packed into both the
collection and the wheel)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from warmctl.errors import WarmctlError

PREFLIGHT_VARS = "vllm_preflight/vars/main.yml"
ROLES_KEY = "__vllm_preflight_roles"  # the one list of the collection's roles, in deploy order


class DataError(WarmctlError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 2, kind="input")


def _candidates(name: str) -> list[Path]:
    here = Path(__file__).resolve().parents[1]  # the warmctl package
    if here.parent.suffix == ".whl":
        # imported from the wheel an installed collection carries in files/ (its filters, on a
        # controller without warmctl): the collection's own folders, beside files/ (files
        # inside a zip are not folders to pathlib)
        return [here.parents[2] / name]
    return [here.parents[1] / name, here / f"_{name}"]


def _find(name: str) -> Path:
    for path in _candidates(name):
        if path.is_dir():
            return path
    raise DataError(f"cannot find the collection's {name}/ folder (looked in {_candidates(name)})")


def truthy(value: Any) -> bool:
    """A yes/no role variable as Ansible's bool reads it: true, yes, on or 1 (any case)."""
    return str(value).strip().lower() in ("true", "yes", "1", "on")


def integer(value: Any, what: str) -> int:
    """The one reading of an integer setting: a bool is not one; `what` names it in the error."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None


def templates_dir() -> Path:
    return _find("templates")


def roles_dir() -> Path:
    return _find("roles")


def _load_yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


@cache
def role_names() -> tuple[str, ...]:
    """The collection's roles in deploy order (roles/vllm_preflight/vars/main.yml)."""
    return tuple(_load_yaml(roles_dir() / PREFLIGHT_VARS)[ROLES_KEY])


def role_paths(relative: str) -> list[Path]:
    """`roles/<role>/<relative>` of every role that has it, in deploy order."""
    base = roles_dir()
    return [base / name / relative for name in role_names() if (base / name / relative).is_file()]


@cache
def role_defaults() -> dict[str, Any]:
    """Every role's defaults/main.yml merged (the one source of the defaults)."""
    merged: dict[str, Any] = {}
    for path in role_paths("defaults/main.yml"):
        merged.update(_load_yaml(path) or {})
    return merged


@cache
def argument_specs(role: str) -> dict[str, Any]:
    """The entry points of one role's meta/argument_specs.yml."""
    return (_load_yaml(roles_dir() / role / "meta/argument_specs.yml") or {})["argument_specs"]


def gpu_capture_sizes() -> tuple[int, ...]:
    """The GPU hosts' default CUDA-graph capture sizes (vllm_service_gpu_compilation_config)."""
    config = role_defaults()["vllm_service_gpu_compilation_config"]
    return tuple(int(size) for size in config["cudagraph_capture_sizes"])

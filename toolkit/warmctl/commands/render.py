"""`warmctl render VARS_FILE`: an instance's systemd files, as the roles would write them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from warmctl.commands.options import guard

if TYPE_CHECKING:
    from warmctl.plan.render import RenderedInstance


@click.command("render")
@click.argument("vars_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--instance", "names", multiple=True, metavar="NAME", help="Only this instance.")
@click.option(
    "--device",
    type=click.Choice(["gpu", "cpu"]),
    help="Kind of host (default: vllm_preflight_device_kind in VARS_FILE, else gpu).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Each instance's plan (what its unit runs, its files' paths) and files as JSON.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the files under this folder (at their host paths) instead of printing them.",
)
def command(
    vars_file: Path, names: tuple[str, ...], device: str | None, as_json: bool, out: Path | None
) -> None:
    """Render the unit, env file, timers and window services of each instance in VARS_FILE.

    VARS_FILE is YAML with the host's variables (e.g. a group_vars file): vllm_service_instances
    and any role variable to override; the roles' defaults fill in the rest. The same
    templates/ files as the Ansible roles, so this is exactly what a host would get.
    """

    def body() -> int:
        import json

        from warmctl.errors import WarmctlError
        from warmctl.plan.render import (
            InvalidVariables,
            check_variables,
            host_variables,
            render_instance,
        )
        from warmctl.terminal.output import error_line

        host = _load_vars(vars_file)
        if device:
            host["vllm_preflight_device_kind"] = device
        if not host.get("vllm_service_instances"):
            raise WarmctlError(f"{vars_file}: no vllm_service_instances list", kind="input")
        try:  # every problem, one line each, before anything is rendered
            check_variables(host_variables(host), str(vars_file))
        except InvalidVariables as err:
            for line in err.lines:
                error_line(line)
            return 2
        instances = host.pop("vllm_service_instances")
        known = [i.get("name") for i in instances if isinstance(i, dict)]
        unknown = sorted(set(names) - set(known))
        if unknown:
            have = ", ".join(map(str, known))
            raise WarmctlError(
                f"no instance {', '.join(unknown)} in {vars_file} (have: {have})", kind="input"
            )
        chosen = [
            i for i in instances if not names or (isinstance(i, dict) and i.get("name") in names)
        ]
        rendered = [render_instance(i, host, str(vars_file)) for i in chosen]
        if as_json:
            click.echo(json.dumps([_as_dict(r) for r in rendered], indent=2))
        elif out is not None:
            for r in rendered:
                for path, text in r.files.items():
                    target = out / path.lstrip("/")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
                    click.echo(str(target))
        else:
            for r in rendered:
                for path, text in r.files.items():
                    click.echo(f"# ==> {path} <==")
                    click.echo(text, nl=False)
                    click.echo()
        return 0

    guard(body)


def _load_vars(path: Path) -> dict:
    import yaml

    from warmctl.errors import WarmctlError

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise WarmctlError(f"cannot read {path}: {exc.strerror}", kind="input") from None
    except UnicodeDecodeError:
        raise WarmctlError(
            f"{path} is not UTF-8 text (a YAML file of variables)", kind="input"
        ) from None
    except yaml.YAMLError as exc:
        raise WarmctlError(
            f"{path} is not valid YAML: {' '.join(str(exc).split())}", kind="input"
        ) from None
    if not isinstance(data, dict):
        raise WarmctlError(f"{path}: expected a mapping of variables", kind="input")
    return data


def _as_dict(r: RenderedInstance) -> dict[str, Any]:
    """An instance's JSON: its plan (warmctl.plan.instance's fields) and its files."""
    return {"name": r.name, "device": r.device, "plan": r.plan.as_dict(), "files": r.files}

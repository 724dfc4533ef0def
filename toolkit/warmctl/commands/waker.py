"""`warmctl waker --target HOST:PORT --socket FILE ...`"""

from __future__ import annotations

from pathlib import Path

import click

from warmctl.options import guard, textfile_options


@click.command(name="waker")
@click.option(
    "--target",
    metavar="HOST:PORT",
    required=True,
    help="vLLM on this host (behind the proxy: 127.0.0.1:PORT+offset): its /load tells what is "
    "in flight before an idle sleep.",
)
@click.option(
    "--socket",
    "socket_path",
    metavar="FILE",
    required=True,
    help="The HTTP socket nginx's auth_request asks (GATE_DIR/NAME.waker.sock; mode 0660 with "
    "--socket-group, else 0600).",
)
@click.option(
    "--activity-socket",
    metavar="FILE",
    help="The datagram socket of nginx's access log of /v1/ (GATE_DIR/NAME.activity.sock; "
    "mode as --socket): each datagram is a request vLLM answered. Needed with --idle-after.",
)
@click.option(
    "--socket-group",
    metavar="GROUP",
    help="nginx's group (its workers' user's, e.g. www-data), name or number: both sockets get "
    "it, mode 0660, so only nginx and this user connect. This process must be in it (the "
    "unit's SupplementaryGroups=). Without it: mode 0600, this user only.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    metavar="N",
    help="Connections kept at once on --socket (nginx holds one per held request). Past it, the "
    "oldest one that sent nothing yet is closed to make room (one that sends nothing is "
    "closed after 5 s anyway); when each holds a request, the new one is refused (503 "
    "waking-failed). Lowered to what the descriptor limit holds, with a line.",
)
@click.option(
    "--wakeable",
    metavar="FILE",
    required=True,
    help="Flag: asleep, a request wakes it (GATE_DIR/NAME.wakeable).",
)
@click.option(
    "--closed",
    metavar="FILE",
    required=True,
    help="Flag: asleep, requests refused (GATE_DIR/NAME.closed).",
)
@click.option(
    "--warming",
    metavar="FILE",
    required=True,
    help="Flag: the unit's warmup runs (GATE_DIR/NAME.warming).",
)
@click.option(
    "--draining",
    metavar="FILE",
    required=True,
    help="Flag: out of rotation for a restart (GATE_DIR/NAME.draining).",
)
@click.option(
    "--holding",
    metavar="FILE",
    help="Flag: a restart or relaunch runs (GATE_DIR/NAME.holding, a single host's instance): "
    "requests are held until it is gone, then passed on if vLLM answers /health, else "
    "refused (503 relaunch-failed).",
)
@click.option(
    "--wake-request",
    metavar="FILE",
    required=True,
    help="Created to ask systemd for a wake (GATE_DIR/NAME.wake-request; its path unit runs "
    "the wake, whose service removes the file when it ends).",
)
@click.option(
    "--sleep-request",
    metavar="FILE",
    help="Created to ask systemd for an idle sleep (GATE_DIR/NAME.sleep-request). Needed with "
    "--idle-after.",
)
@click.option(
    "--idle-after",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    metavar="S",
    help="Ask for a sleep once no request finished for S seconds and none is in flight "
    "(0: no idle sleep).",
)
@click.option(
    "--hold",
    type=click.FloatRange(min=0.1),
    default=120.0,
    show_default=True,
    metavar="S",
    help="Longest a request is held while the instance wakes; past it, 503 wake-timeout.",
)
@click.option(
    "--failed-backoff",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="S",
    help="After a failed wake, refuse requests at once (503 waking-failed) for S seconds "
    "before a request asks for a wake again.",
)
@click.option(
    "--wake-here",
    is_flag=True,
    help="The instance sleeps in vLLM's sleep mode (GPU): wake it from this process, as "
    "`warmctl wake TARGET --gate CLOSED --gate WAKEABLE --cause request` would (with "
    "--output-check and the textfile options; the gate's lock keeps it from overlapping a "
    "sleep), instead of leaving the wake to systemd "
    "(a CPU host's wake is a start of the unit).",
)
@click.option(
    "--output-check",
    "check_file",
    metavar="FILE",
    help="With --wake-here: the answers recorded at the sleep, replayed before the gate opens.",
)
@textfile_options
def command(
    target: str,
    socket_path: str,
    activity_socket: str | None,
    wakeable: str,
    closed: str,
    warming: str,
    draining: str,
    holding: str | None,
    wake_request: str,
    sleep_request: str | None,
    idle_after: float,
    hold: float,
    failed_backoff: float,
    wake_here: bool,
    check_file: str | None,
    textfile_dir: str | None,
    instance_name: str | None,
    socket_group: str | None,
    max_connections: int,
) -> None:
    """Idle sleep and wake on request for one proxied instance (runs until stopped).

    Wake on request: while the wakeable flag exists, nginx asks this process (auth_request on
    --socket) before it passes a /v1/ request to vLLM. The first such request creates the
    wake-request file (systemd's path unit wakes the instance), every request waits for that one
    wake, and all are passed in the order they came once the wakeable, closed and warming flags
    are gone. A wake that fails (its request file removed, the instance still asleep) refuses
    them (503 waking-failed), and new ones for --failed-backoff; a request held past --hold gets
    503 wake-timeout; the closed flag appearing (a window that refuses) 503 asleep.

    Restarts of a single host (--holding FILE): while that flag exists (a restart or relaunch
    runs), nginx asks this process too and the requests wait for the flag to go; then they are
    passed on if vLLM answers /health, else refused (503 relaunch-failed); past --hold, 503
    relaunch-timeout.

    Idle sleep (--idle-after S): awake (no flag) and no request finished for S seconds (nginx's
    datagrams on --activity-socket) and vLLM's /load says none in flight: the sleep-request file
    is created (systemd's path unit runs the sleep, with its drain and gate).

    It needs no privileges: it reads and creates files in the gate folder and binds two sockets
    there, which only nginx's workers (--socket-group) and its own user can connect to. A storm
    of connections is bounded (--max-connections) and logged in one line per storm. Log lines
    go to stdout/stderr (journald priorities under systemd); metrics to --textfile-dir as
    warmctl_NAME.waker.prom. See docs/IDLE-SLEEP.md.

    Exit status: 0 when stopped (SIGTERM), 2 on bad options (nothing bound or written).
    """

    def body() -> int:
        from warmctl.errors import WarmctlError
        from warmctl.gate import Flags
        from warmctl.target import parse_target
        from warmctl.waker.service import WakerConfig, run
        from warmctl.waker.wakehere import WakeHere

        parsed = parse_target(target)
        if parsed.prefix or parsed.scheme != "http":
            raise WarmctlError(f"--target {target!r}: HOST:PORT of vLLM on this host", kind="input")
        flags = Flags(
            wakeable=Path(wakeable),
            closed=Path(closed),
            warming=Path(warming),
            draining=Path(draining),
            wake_request=Path(wake_request),
            sleep_request=Path(sleep_request) if sleep_request else None,
            holding=Path(holding) if holding else None,
        )
        wake = None
        if wake_here:
            wake = WakeHere(target, (closed, wakeable), check_file, textfile_dir, instance_name)
        elif check_file:
            raise WarmctlError("--output-check goes with --wake-here", kind="input")
        cfg = WakerConfig(
            name=instance_name or parsed.label,
            socket=Path(socket_path),
            activity_socket=Path(activity_socket) if activity_socket else None,
            flags=flags,
            target=target,
            idle_after=idle_after,
            hold=hold,
            failed_backoff=failed_backoff,
            textfile_dir=textfile_dir,
            wake=wake,
            socket_group=socket_group,
            max_connections=max_connections,
        )
        return run(cfg)

    guard(body)

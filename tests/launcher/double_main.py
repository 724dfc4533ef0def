"""The vLLM double as a server module for the launcher: `python -m tests.launcher.double_main
--port N` serves until SIGTERM (as `vllm serve` would under the launcher). `--max-num-seqs N`
is what its /server_info reports, as vLLM's; other arguments are taken and ignored (the launch
file's other vLLM flags). VLLM_DOUBLE_AT_IMPORT is read when the module
is imported, as vLLM's logging reads VLLM_LOGGING_LEVEL: a relaunch cannot change it.

Its arguments are parsed as vLLM parses its own: `make_arg_parser` and
`validate_parsed_serve_args`, the names vLLM's server module has, so the launcher's standby
checks a launch file with them as it checks vLLM's; a value vLLM's parser rejects (e.g.
`--max-model-len abc`) is rejected here the same way, and the server exits 2 on it.
`--max-num-seqs 99999` kills the process that checks it (a standby out of memory)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from tests.double.server import VllmDouble

AT_IMPORT = os.environ.get("VLLM_DOUBLE_AT_IMPORT", "")


class _Parser(argparse.ArgumentParser):
    """vLLM's flags the double has no use for are taken and ignored."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        return self.parse_known_args(args, namespace)[0]


def make_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    out = _Parser(prog="double_main")
    out.add_argument("--port", type=int, required=True)
    out.add_argument("--max-num-seqs", type=int, default=256)
    out.add_argument("--max-model-len", type=int)
    out.add_argument("--enable-server-load-tracking", action="store_true")
    return out


# a process that checks these arguments dies (as one killed for memory would)
DIE_CHECKING = 99999


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    if args.max_num_seqs == DIE_CHECKING:
        os._exit(9)
    if args.max_num_seqs < 1:  # as vLLM's configuration rejects it
        raise ValueError(f"max_num_seqs ({args.max_num_seqs}) must be at least 1")


def main(argv: list[str]) -> int:
    args = make_arg_parser().parse_args(argv)
    try:
        validate_parsed_serve_args(args)
    except ValueError as exc:
        print(f"double_main: error: {exc}", file=sys.stderr)
        return 2
    double = VllmDouble(
        port=args.port,
        server_load_tracking=args.enable_server_load_tracking,  # as vLLM: /load counts only then
        max_num_seqs=args.max_num_seqs,
    ).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    double.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The vLLM double as a server module for the launcher: `python -m tests.launcher.double_main
--port N` serves until SIGTERM (as `vllm serve` would under the launcher)."""

from __future__ import annotations

import signal
import sys
import threading

from tests.double.server import VllmDouble


def main(argv: list[str]) -> int:
    port = int(argv[argv.index("--port") + 1])
    tracking = "--enable-server-load-tracking" in argv  # as vLLM: /load counts only then
    double = VllmDouble(port=port, server_load_tracking=tracking).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    double.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The vLLM double as a server module for the launcher: `python -m tests.launcher.double_main
--port N` serves until SIGTERM (as `vllm serve` would under the launcher). `--max-num-seqs N`
is what its /server_info reports, as vLLM's; other arguments are taken and ignored (the launch
file's other vLLM flags). VLLM_DOUBLE_AT_IMPORT is read when the module
is imported, as vLLM's logging reads VLLM_LOGGING_LEVEL: a relaunch cannot change it."""

from __future__ import annotations

import os
import signal
import sys
import threading

from tests.double.server import VllmDouble

AT_IMPORT = os.environ.get("VLLM_DOUBLE_AT_IMPORT", "")


def main(argv: list[str]) -> int:
    port = int(argv[argv.index("--port") + 1])
    tracking = "--enable-server-load-tracking" in argv  # as vLLM: /load counts only then
    seqs = int(argv[argv.index("--max-num-seqs") + 1]) if "--max-num-seqs" in argv else 256
    double = VllmDouble(port=port, server_load_tracking=tracking, max_num_seqs=seqs).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    double.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

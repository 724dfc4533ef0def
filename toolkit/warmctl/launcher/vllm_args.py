"""vLLM's own verdict on a server's arguments, and what of the next server can be built before it
runs: the arguments parsed with vLLM's parser (as `vllm serve` and `python -m
vllm.entrypoints.openai.api_server` parse them), vLLM's configuration built from them
(`AsyncEngineArgs.from_cli_args(args).create_engine_config(...)`), the tokenizer loaded.

    prepare(module, argv, level) -> dict   # {"ok": bool, "checked": bool, "error": str, ...}
    parse_serve_args(module, argv) -> argparse.Namespace | None

Run by vLLM's interpreter: the launcher's standby loads this file by path (it sits beside
vllm_launch.py, in warmctl's package and in its venv's share/warmctl/) after its fork, once it
has imported vLLM, so the launcher itself stays stdlib-only. Importable by warmctl too (vLLM is
imported only inside the functions): anything that has vLLM can check a unit's arguments with it.

What each level does, all of it without the GPU (vLLM's API process does the same before it
starts its EngineCore: the device is probed through NVML, no CUDA context is created, nothing is
allocated), so it can run while the old server holds the GPU:
  - "parse": vLLM's parser and `validate_parsed_serve_args`; an argument vLLM rejects is one
    line (argparse's own message, e.g. `argument --max-model-len: invalid ... value: 'abc'`);
  - "config" (the default): and vLLM's configuration (the model's config read, the model
    architecture resolved, the scheduler/cache/compilation settings checked): what vLLM rejects
    only once it reads the model (a max_model_len above the model's, a bad dtype) is refused too;
  - "reuse": and the tokenizer loaded into vLLM's own cache (`cached_get_tokenizer`, an
    lru_cache the API server reads through), the model's class imported (an EngineCore forked
    from the server inherits it), and the configuration kept for the server: its first
    `create_engine_config` with the same arguments returns it instead of building it again.

A module that is not vLLM's server is checked with its own `make_arg_parser` and
`validate_parsed_serve_args` when it has them (the names vLLM's api_server module has imported
since 0.4); when they are vLLM's own, vLLM's configuration is built too. A module with neither
is not checked ("checked": false).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import time
from typing import Any

# vLLM's server modules whose arguments are `vllm serve`'s (the api_server's --model form)
API_SERVER_MODULES = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.launchers.api_server.entry",
)
CLI_MODULE = "vllm.entrypoints.cli.main"  # `-m vllm.entrypoints.cli.main serve MODEL ...`
# where vLLM keeps its serve parser and its validation, newest first
CLI_ARGS_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
PARSER_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")
TOKENIZER_MODULES = ("vllm.tokenizers", "vllm.transformers_utils.tokenizer")
LEVELS = ("parse", "config", "reuse")
MAX_LINE = 400


class Rejected(Exception):
    """vLLM rejects the arguments: str() is one line."""


def _say(text: str) -> None:
    sys.stderr.write(f"vllm-launch: {text}\n")  # the launcher's prefix: one line in the journal
    sys.stderr.flush()


def one_line(text: str) -> str:
    parts = [part.strip() for part in str(text).splitlines()]
    # pydantic's link under each of its errors says nothing about this one
    line = " ".join(p for p in parts if p and not p.startswith("For further information visit"))
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def _first(modules: tuple[str, ...], name: str) -> Any:
    for module in modules:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    raise ImportError(f"no {name} in {', '.join(modules)}")


def _run_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, its exit (argparse's error(), --help, --version) turned into Rejected with
    argparse's own message."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(argv)
    except SystemExit as exc:
        lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
        why = lines[-1] if lines else f"vLLM's parser exited with status {exc.code}"
        if ": error: " in why:
            why = why.split(": error: ", 1)[1]
        raise Rejected(one_line(why)) from None


def _validate(validate: Any, args: argparse.Namespace) -> None:
    try:
        validate(args)
    except SystemExit as exc:
        raise Rejected(f"vLLM's validation exited with status {exc.code}") from None
    except Exception as exc:
        raise Rejected(one_line(f"{exc.__class__.__name__}: {exc}")) from None


def parse_serve_args(module: str, argv: list[str]) -> argparse.Namespace | None:
    """The server's arguments as `module` parses them (vLLM's parser), validated as it validates
    them; Rejected (one line) when vLLM would exit on them; None when `module` is neither vLLM's
    server nor a module with its own make_arg_parser."""
    return _parse(module, argv)[0]


def _parse(module: str, argv: list[str]) -> tuple[argparse.Namespace | None, bool]:
    """parse_serve_args, and whether the parser was vLLM's (then vLLM's configuration can be
    built from what it parsed)."""
    if module == CLI_MODULE:
        if argv[:1] != ["serve"]:
            return None, False  # another subcommand: not a server this knows
        from vllm.entrypoints.cli.serve import ServeSubcommand

        flexible = _first(PARSER_MODULES, "FlexibleArgumentParser")
        top = flexible(description="vLLM CLI")
        serve = ServeSubcommand()
        parser = serve.subparser_init(top.add_subparsers(dest="subparser"))
        args = _run_parser(parser, argv[1:])
        _validate(serve.validate, args)
        if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does
            args.model = args.model_tag
        return args, True
    own = sys.modules.get(module)
    make = getattr(own, "make_arg_parser", None)
    validate = getattr(own, "validate_parsed_serve_args", None)
    if module in API_SERVER_MODULES and not (make and validate):
        make = _first(CLI_ARGS_MODULES, "make_arg_parser")
        validate = _first(CLI_ARGS_MODULES, "validate_parsed_serve_args")
    if not (make and validate):
        return None, False
    vllms = str(getattr(make, "__module__", "")).startswith("vllm.")
    if module in API_SERVER_MODULES or vllms:
        flexible = _first(PARSER_MODULES, "FlexibleArgumentParser")
        base: argparse.ArgumentParser = flexible(
            description="vLLM OpenAI-Compatible RESTful API server."
        )
    else:
        base = argparse.ArgumentParser(prog=module)
    args = _run_parser(make(base), argv)
    _validate(validate, args)
    return args, vllms


class _Kept:
    """The configuration built for the server, handed to its first create_engine_config."""

    original: Any = None  # vLLM's own create_engine_config
    engine_args: Any = None
    config: Any = None


def build_config(args: argparse.Namespace) -> tuple[Any, Any]:
    """vLLM's configuration from parsed arguments, as its API server builds it (Rejected: one
    line). Returns ((the engine args as they were before the build, or None when they cannot be
    copied; as after it), the VllmConfig)."""
    import copy

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    try:
        engine_args = AsyncEngineArgs.from_cli_args(args)
        try:  # what the server's own engine args must equal to take this configuration
            before = copy.deepcopy(engine_args)
        except Exception:
            before = None
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except SystemExit as exc:
        raise Rejected(f"vLLM's configuration exited with status {exc.code}") from None
    except Exception as exc:
        raise Rejected(one_line(f"{exc.__class__.__name__}: {exc}")) from None
    return (before, engine_args), config


def load_tokenizer(config: Any) -> bool:
    """The tokenizer into vLLM's cache (the API server's renderer reads it from there)."""
    try:  # where vLLM keeps it, newest first
        load = _first(TOKENIZER_MODULES, "cached_tokenizer_from_config")
    except ImportError:
        return False
    load(config.model_config)
    return True


def import_model_class(config: Any) -> bool:
    """The model's class imported (vLLM's registry resolves the architecture), as the EngineCore
    imports it to build the model: an EngineCore forked from the server (the unit's
    VLLM_WORKER_MULTIPROC_METHOD=fork) has it already. False: not done (no failure of the
    arguments: the EngineCore would try again and say why)."""
    try:
        from vllm.model_executor.models import ModelRegistry

        model_config = config.model_config
        ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    except Exception:
        return False
    return True


def keep_for_server(before: Any, built: Any, config: Any) -> bool:
    """The server's first `create_engine_config` whose engine args equal `before` (and whose
    usage context is the API server's) gets `config`, its engine args updated as the build
    updated them; any other call builds as usual. True: installed."""
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext
    except ImportError:
        return False
    if before is None:
        return False
    if _Kept.original is None:
        _Kept.original = EngineArgs.create_engine_config
    original = _Kept.original
    _Kept.engine_args, _Kept.config = (before, built), config

    def create_engine_config(self: Any, usage_context: Any = None, *a: Any, **kw: Any) -> Any:
        kept, _Kept.config = _Kept.config, None
        EngineArgs.create_engine_config = original  # type: ignore[method-assign]
        if kept is not None and not a and not kw.get("headless", False):
            same_context = usage_context == UsageContext.OPENAI_API_SERVER
            before_args, built_args = _Kept.engine_args
            try:
                same = same_context and type(self) is type(before_args) and self == before_args
            except Exception:  # a field that cannot be compared
                same = False
            if same:
                self.__dict__.update(built_args.__dict__)
                _say("the server took the configuration its standby built")
                return kept
            _say("the server builds its configuration again (its engine arguments differ "
                 "from those the standby built it with)")  # fmt: skip
        return original(self, usage_context, *a, **kw)

    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]
    return True


@contextlib.contextmanager
def _environment(env: dict[str, str | None]) -> Any:
    """os.environ with `env` applied (None: unset) while inside; restored after."""
    saved = dict(os.environ)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def prepare(
    module: str, argv: list[str], level: str = "config", env: dict[str, str | None] | None = None
) -> dict[str, Any]:
    """vLLM's verdict on `python -m module argv...` with `env` applied (restored after), and at
    level "reuse" what the server can take over. {"ok", "checked", "error", "seconds", "steps"}."""
    t = time.monotonic()
    steps: list[str] = []
    try:
        with _environment(env or {}):
            args, vllms = _parse(module, argv)
            if args is None:
                return {"ok": True, "checked": False, "error": "", "seconds": 0.0, "steps": []}
            steps.append("parse")
            if level in ("config", "reuse") and vllms:
                (before, built), config = build_config(args)
                steps.append("config")
                if level == "reuse":
                    if load_tokenizer(config):
                        steps.append("tokenizer")
                    if import_model_class(config):
                        steps.append("model_class")
                    if keep_for_server(before, built, config):
                        steps.append("kept")
    except Rejected as exc:
        return {"ok": False, "checked": True, "error": str(exc),
                "seconds": time.monotonic() - t, "steps": steps}  # fmt: skip
    except Exception as exc:  # vLLM's own code failed where its server would fail the same way
        return {"ok": False, "checked": True, "error": one_line(f"{exc.__class__.__name__}: {exc}"),
                "seconds": time.monotonic() - t, "steps": steps}  # fmt: skip
    return {"ok": True, "checked": True, "error": "", "seconds": time.monotonic() - t,
            "steps": steps}  # fmt: skip

"""The pre-imported vLLM launcher (`vllm_launch.py`): a stdlib-only script that vLLM's own
interpreter runs by path, and `vllm_args.py`, which its standby loads by path once it has
imported vLLM (vLLM's parser and configuration for the next server). Nothing else lives in this
folder: Python puts a script's folder first on `sys.path` (the launcher takes it off again), and
nothing here may shadow a module vLLM imports."""

from pathlib import Path

SCRIPT = Path(__file__).with_name("vllm_launch.py")
ARGS_SCRIPT = Path(__file__).with_name("vllm_args.py")

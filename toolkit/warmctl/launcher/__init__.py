"""The pre-imported vLLM launcher (`vllm_launch.py`): a stdlib-only script that vLLM's own
interpreter runs by path, so it lives alone in this folder (Python puts a script's folder first
on `sys.path`; nothing here may shadow a module vLLM imports)."""

from pathlib import Path

SCRIPT = Path(__file__).with_name("vllm_launch.py")

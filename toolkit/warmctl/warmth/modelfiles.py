"""What a model's own files say, read where the server runs (the unit's warmup runs on the
host, as the server's user): whether its tokenizer has a chat template.

vLLM answers a chat request for a model without one with 400, and logs it as an ERROR line
("Exception caught") in the unit's journal: a warmup must not ask when the files say no.
"""

from __future__ import annotations

import json
from pathlib import Path

# where transformers keeps a tokenizer's chat template(s), besides tokenizer_config.json's key
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TEMPLATE_DIR = "additional_chat_templates"


def chat_template(model_dir: str) -> tuple[bool | None, str]:
    """(has a chat template, where that was read); (None, why) when the folder cannot tell
    (not a local folder: a hub id, another machine; no tokenizer_config.json; unreadable)."""
    folder = Path(model_dir)
    try:
        if not folder.is_dir():
            return None, f"{model_dir} is not a folder here"
        for name in TEMPLATE_FILES:
            if (folder / name).is_file():
                return True, name
        extra = folder / TEMPLATE_DIR
        if extra.is_dir() and any(extra.iterdir()):
            return True, TEMPLATE_DIR
        config = folder / "tokenizer_config.json"
        if not config.is_file():
            return None, f"no tokenizer_config.json in {model_dir}"
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return None, f"{model_dir}: {err.__class__.__name__}"
    if not isinstance(data, dict):
        return None, "tokenizer_config.json is not a mapping"
    return bool(data.get("chat_template")), "tokenizer_config.json"

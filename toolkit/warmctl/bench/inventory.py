"""What a server start wrote to disk: bytes per cache folder under the folders the benchmark
gave it (persistent cache dir, HOME, TMPDIR). Shows which caches exist and whether any of them
landed outside the unit's persistent cache dir (a cache that a restart or reboot loses)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_bytes(root: Path, depth: int = 3) -> dict[str, int]:
    """Bytes per folder `depth` levels below `root` (files higher up count for their folder)."""
    sizes: dict[str, int] = {}
    if not root.is_dir():
        return sizes
    for dirpath, _dirs, files in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts[:depth]
        key = "/".join(rel) or "."
        for name in files:
            try:
                size = (Path(dirpath) / name).lstat().st_size
            except OSError:
                continue
            sizes[key] = sizes.get(key, 0) + size
    return {k: v for k, v in sorted(sizes.items()) if v > 0}

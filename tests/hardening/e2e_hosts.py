"""The e2e-hardening modules' test hosts (load balancer, proxy, tensor parallel), shared in one
pytest session: two booted hosts serving the wheelhouse, the installed collection, and one
proxied deploy (`deployed`). tests/hardening's conftest imports the session-scoped fixtures, so
they exist once. The test suite runs these modules in the e2e tier's session (scripts/test.sh),
on its hosts, which the tier's first deploy has installed; run alone, they boot their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.e2e_support import Lab, ansible_playbook

PROXY_VARS = {
    "vllm_proxy_enabled": True,
    "vllm_proxy_install_package": False,
    "vllm_proxy_retry_after": 5,
}


def e2e_tier_active() -> bool:
    """True when tests/e2e's session fixtures run in this process (their support module is
    loaded and has recorded a stage)."""
    support = sys.modules.get("e2e_support")
    return bool(support and getattr(support, "TIMINGS", None))


def nginx_debs(dest: Path) -> list[Path]:
    """nginx + nginx-common .debs (the hosts are offline), downloaded once."""
    dest.mkdir(parents=True, exist_ok=True)
    debs = sorted(dest.glob("nginx*.deb"))
    if len(debs) >= 2:
        return debs
    for args in (
        ["apt-get", "update", "-q"],
        ["apt-get", "download", "nginx", "nginx-common"],
    ):
        subprocess.run(args, cwd=dest, capture_output=True, timeout=600, check=False)
    debs = sorted(dest.glob("nginx*.deb"))
    if len(debs) < 2:
        pytest.skip("cannot download the nginx/nginx-common .debs for the offline hosts")
    return debs


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    from tests.lib import model, testhosts, vllmcpu, wheelhouse

    work = testhosts.cache_root() / "e2e-hardening"
    work.mkdir(parents=True, exist_ok=True)
    keep = os.environ.get("WARMCTL_E2E_KEEP_HOSTS") == "1"
    # in one pytest run the end-to-end tier (tests/e2e, collected first) holds the hosts until
    # the session ends: reuse them (its tests are done) and leave the teardown to it
    shared = e2e_tier_active()
    if testhosts.booted_hosts() and not (keep or shared):
        pytest.fail(
            "test hosts are already up (another run?); WARMCTL_E2E_KEEP_HOSTS=1 reuses them"
        )
    from tests.e2e import e2e_support
    from tests.lib import collection

    path = model.ensure_model(vllmcpu.ensure_venv())
    house = wheelhouse.build()
    e2e_support.PROJECT["path"] = collection.project().path
    # the e2e tier's booted hosts as they are (not booted again: a fresh boot's checks, such as
    # `systemctl is-system-running`, are not about a host that has been deployed and tested)
    fleet = testhosts.fleet(2) if shared else testhosts.up(2)
    try:
        with wheelhouse.serve(house, fleet.controller) as server:
            for host in fleet.hosts:  # nginx from .debs (the hosts are offline)
                for deb in nginx_debs(testhosts.cache_root() / "debs"):
                    subprocess.run(
                        [
                            "scp",
                            *fleet.ssh_options(),
                            str(deb),
                            f"root@{host.address}:/tmp/{deb.name}",
                        ],
                        check=True,
                        capture_output=True,
                    )
                fleet.ssh(
                    host, "command -v nginx >/dev/null || dpkg -i /tmp/nginx*.deb", timeout=300
                )
            yield Lab(fleet, server.url, path, work, testhosts.quiet_window())
    finally:
        if not (keep or shared):
            testhosts.down()


@pytest.fixture(scope="session")
def deployed(lab: Lab) -> Path:
    inventory = lab.inventory("proxy", group_vars=PROXY_VARS)
    run = ansible_playbook(inventory, "-e", "vllm_rollout_serial=2", log=lab.dir / "site.log")
    print(f"site.yml with the proxy: exit {run.rc} in {run.seconds:.0f} s")
    assert run.rc == 0, run.describe()
    return inventory

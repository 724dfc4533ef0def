"""vllm_service's textfile directory (roles/vllm_service/tasks/textfile.yml) on localhost: the
folder above it stays root's, so warmctl.host.safefs, which refuses a textfile directory whose
folder
above the service user's group can change, takes it (the unit's warmup writes there; on a GPU
host the role made /var/lib/node_exporter root:vllm 2775 and every warmup failed on it)."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from tests.ansible.conftest import run_playbook, write_inventory

from warmctl.host import safefs

GROUP = "daemon"  # a group every Debian machine has, standing in for the service user's


def deploy(tmp_path: Path, textfile: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inv.json",
        {"h": {"vllm_service_textfile_dir": str(textfile), "vllm_install_group": GROUP}},
    )
    proc = run_playbook("tests/ansible/textfile.yml", inventory)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_a_new_folder_above_is_roots_and_safefs_takes_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "var"
    root.mkdir(mode=0o755)
    textfile = root / "lib" / "node_exporter" / "textfile"
    deploy(tmp_path, textfile)
    above = (root / "lib" / "node_exporter").stat()
    assert (above.st_uid, above.st_gid, stat.S_IMODE(above.st_mode)) == (0, 0, 0o755)
    mine = textfile.stat()
    assert mine.st_gid == grp.getgrnam(GROUP).gr_gid and stat.S_IMODE(mine.st_mode) == 0o2775
    os.close(safefs.open_folder(textfile))  # refused when the folder above is the group's


def test_an_existing_folder_above_is_left_as_it_is(tmp_path: Path) -> None:
    above = tmp_path / "prometheus"
    above.mkdir()
    above.chmod(0o750)
    deploy(tmp_path, above / "node-exporter")
    assert stat.S_IMODE(above.stat().st_mode) == 0o750

"""The collection as a user's Ansible repository gets it: built from this checkout
(scripts/build.sh: warmctl's wheel inside the collection artifact), installed with
`ansible-galaxy collection install` into a separate project folder that has its own ansible.cfg,
playbook and inventories, and no access to the checkout's ansible.cfg or roles."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.lib.common import LabError, cache_root, file_lock, repo_root

NAMESPACE, NAME = "warmctl", "vllm"
ANSIBLE_CFG = """\
# A team's own Ansible repository: the collection comes from ansible-galaxy, nothing else.
[defaults]
collections_path = ./collections
interpreter_python = auto_silent
retry_files_enabled = false
forks = 10
callback_result_format = yaml

[ssh_connection]
pipelining = true
"""
SITE = """\
---
# The user's playbook: the collection's own site playbook.
- name: Deploy warm vLLM services
  ansible.builtin.import_playbook: warmctl.vllm.site
"""


@dataclass(frozen=True)
class Artifacts:
    wheel: Path
    collection: Path


@dataclass(frozen=True)
class Project:
    path: Path
    artifacts: Artifacts

    @property
    def installed(self) -> Path:
        return self.path / "collections" / "ansible_collections" / NAMESPACE / NAME

    def version(self) -> str:
        import json

        manifest = json.loads((self.installed / "MANIFEST.json").read_text())
        return str(manifest["collection_info"]["version"])


def build() -> Artifacts:
    """scripts/build.sh: the wheel and the collection (which carries the wheel) into dist/."""
    done = subprocess.run(
        ["bash", str(repo_root() / "scripts" / "build.sh")],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"scripts/build.sh failed (exit {done.returncode}): {tail[0]}")
    wheel, collection = (Path(line) for line in done.stdout.split())
    return Artifacts(wheel, collection)


def project(where: Path | None = None, artifacts: Artifacts | None = None) -> Project:
    """A fresh project folder with the built collection installed by ansible-galaxy."""
    artifacts = artifacts or build()
    path = where or cache_root() / "collection-project"
    with file_lock(cache_root() / "collection-project.lock", "the collection project"):
        subprocess.run(["rm", "-rf", str(path)], check=True)
        path.mkdir(parents=True)
        (path / "ansible.cfg").write_text(ANSIBLE_CFG)
        (path / "site.yml").write_text(SITE)
        galaxy = Path(sys.executable).parent / "ansible-galaxy"
        done = subprocess.run(
            [str(galaxy), "collection", "install", "--force", "-p", "collections",
             str(artifacts.collection)],
            cwd=path, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            raise LabError(f"ansible-galaxy collection install failed: {done.stderr.strip()}")
    return Project(path, artifacts)

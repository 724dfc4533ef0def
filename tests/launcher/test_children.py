"""`warmctl relaunch` finds the launcher's server among its children (/proc, here a fake one):
the server its state names; without a state, every child but its standby (named vllm-standby
while it imports and waits, or the standby the state names)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warmctl.errors import WarmctlError
from warmctl.launcher.relaunch import children

LAUNCHER = 100


def fake_proc(root: Path, kids: dict[int, str], tasks: int = 2) -> Path:
    """/proc with the launcher's children spread over its threads, each child with its comm."""
    proc = root / "proc"
    pids = sorted(kids)
    for t in range(tasks):
        task = proc / str(LAUNCHER) / "task" / str(LAUNCHER + t)
        task.mkdir(parents=True)
        mine = pids[t::tasks]
        task.joinpath("children").write_text("".join(f"{p} " for p in mine))
    for pid, comm in kids.items():
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
    return proc


def test_the_state_names_the_server(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {201: "python3", 202: "python3", 203: "vllm-standby"})
    assert children(LAUNCHER, proc, {"server_pid": 202, "standby_pid": 203}) == (202,)


def test_without_a_state_the_standby_is_left_out_by_its_name(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {201: "python3", 203: "vllm-standby"})
    assert children(LAUNCHER, proc) == (201,)


def test_a_standby_not_yet_named_is_left_out_by_the_state(tmp_path: Path) -> None:
    # forked this instant: its name is still the launcher's; the state file already names it
    proc = fake_proc(tmp_path, {201: "python3", 204: "python3"})
    state = {"server_pid": 999, "standby_pid": 204}  # the server the state names has gone
    assert children(LAUNCHER, proc, state) == (201,)


def test_a_child_that_ended_meanwhile_is_no_standby(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {201: "python3"})
    (proc / str(LAUNCHER) / "task" / str(LAUNCHER) / "children").write_text("201 205 ")
    assert children(LAUNCHER, proc) == (201, 205)  # 205's comm unreadable: not a standby


def test_no_such_launcher_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(WarmctlError, match="process 100 is not running"):
        children(LAUNCHER, tmp_path / "proc")

"""A systemctl for the roles' reload-vs-restart test on a machine without systemd: `show` says
each unit's state (FAKE_SYSTEMD: a JSON file, unit -> MainPID and its unit file; a live pid is
`active`; CanReload when the file has ExecReload=),
`reload` runs the unit file's ExecReload= lines in order as systemd would ($MAINPID substituted,
`-` ignores a failure, `+` runs as is, the first other failure fails the reload), every other
command is recorded and answered 0. Every call is appended to FAKE_SYSTEMD's `.log`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from warmctl.plan.unitfile import systemd_split, unit_values


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main(argv: list[str]) -> int:
    state = Path(os.environ["FAKE_SYSTEMD"])
    units = json.loads(state.read_text())
    # the verb and the unit; options (--property=...) and `--` are not recorded
    args = [a.strip("'") for a in argv if not a.startswith("-")]
    with open(f"{state}.log", "a") as log:
        log.write(" ".join(args) + "\n")
    if not args:
        return 0
    if args[0] == "show":
        unit = units.get(args[1], {})
        pid = int(unit.get("MainPID", 0))
        active = "active" if pid and _alive(pid) else "inactive"
        main = pid if active == "active" else 0
        reloads = "path" in unit and bool(unit_values(Path(unit["path"]).read_text(), "Service",
                                                      "ExecReload"))  # fmt: skip
        print(f"Id={args[1]}\nLoadState=loaded\nActiveState={active}\nMainPID={main}\n"
              f"CanReload={'yes' if reloads else 'no'}")  # fmt: skip
        return 0
    if args[0] == "reload":
        unit = units[args[1]]
        text = Path(unit["path"]).read_text()
        for line in unit_values(text, "Service", "ExecReload"):
            ignore = line.startswith("-") or line.startswith("+-")
            command = line.lstrip("-+").replace("$MAINPID", str(unit["MainPID"]))
            done = subprocess.run(systemd_split(command), check=False)
            if done.returncode and not ignore:
                print(
                    f"Job for {args[1]} failed (ExecReload exit {done.returncode})", file=sys.stderr
                )
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

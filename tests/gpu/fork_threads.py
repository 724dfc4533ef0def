"""Which import starts the threads alive when the launcher forks (run on the GPU machine with
vLLM's interpreter: `python3 tests/gpu/fork_threads.py OUT.json`).

The launcher imports vLLM's API server and engine core, then forks the server. On the H200 host
two native threads were alive at the fork (`cuda00001800007`, `jemalloc_bg_thd`). This probe
imports the launcher's modules in its order with an audit hook that lists /proc/self/task at
every import event, so the first module whose import left a new thread behind is named, with
the thread's name, its kernel wait channel and the shared libraries loaded by then. Standard
library only."""

from __future__ import annotations

import json
import os
import sys
import time

STEPS = ("torch", "vllm", "vllm.entrypoints.openai.api_server", "vllm.v1.engine.core")
LIBS = ("libcuda", "libnvidia-ml", "jemalloc", "libcudart", "libnccl", "libtorch_cuda")


def threads() -> dict[int, str]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:
            pass
    return out


def detail(tid: int) -> dict[str, str]:
    info = {}
    for key in ("comm", "wchan", "syscall"):
        try:
            with open(f"/proc/self/task/{tid}/{key}") as f:
                info[key] = f.read().strip()[:200]
        except OSError as exc:
            info[key] = f"({exc.strerror})"
    return info


def libs() -> list[str]:
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted(p for p in paths if any(k in p for k in LIBS))


def main() -> int:
    out_path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/fork-threads.json"
    main_tid = os.getpid()
    seen = threads()
    events: list[dict[str, object]] = []
    last = ["(start)"]

    def hook(event: str, args: tuple) -> None:
        if event != "import":
            return
        now = threads()
        new = {t: n for t, n in now.items() if t not in seen}
        if new:
            seen.update(new)
            for tid, name in new.items():
                events.append({
                    "thread": name, "tid": tid,
                    "after_import_of": last[0], "before_import_of": str(args[0]),
                    "at_s": round(time.monotonic() - t0, 3),
                    "detail": detail(tid), "libs": libs(),
                })  # fmt: skip
        last[0] = str(args[0])

    t0 = time.monotonic()
    sys.addaudithook(hook)
    steps = []
    for module in STEPS:
        s = time.monotonic()
        __import__(module)
        hook("import", ("(end of step)",))
        alive = {t: n for t, n in threads().items() if t != main_tid}
        steps.append({"step": module, "seconds": round(time.monotonic() - s, 2),
                      "threads_alive": sorted(alive.values()), "libs": libs()})  # fmt: skip
    import torch

    result = {
        "steps": steps,
        "new_threads": events,
        "cuda_initialized": bool(torch.cuda.is_initialized()),
        "env": {k: os.environ.get(k, "") for k in ("CUDA_VISIBLE_DEVICES", "MALLOC_CONF",
                                                    "LD_PRELOAD", "VLLM_WORKER_MULTIPROC_METHOD")},
    }  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

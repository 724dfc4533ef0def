"""Does NVML leave a thread behind (run on the GPU machine: `python3 tests/gpu/nvml_threads.py`)?

The launcher forks with one native thread alive that tests/gpu/fork_threads.py traced to the
import of vllm.platforms.cuda, whose platform check calls nvmlInit() and nvmlShutdown(). This
lists the process's threads (name, kernel wait channel) around each NVML call through ctypes
alone, and once more after a short wait, and prints them as JSON. Standard library only."""

from __future__ import annotations

import ctypes
import json
import os
import time


def threads() -> list[str]:
    out = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            continue
        out.append(f"{comm}:{wchan}")
    return out[1:]  # the main thread aside


def main() -> None:
    seen: dict[str, object] = {"start": threads()}
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    seen["loaded"] = threads()
    seen["init_rc"] = nvml.nvmlInit_v2()
    seen["after_init"] = threads()
    count = ctypes.c_uint(0)
    seen["count_rc"] = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
    seen["devices"] = count.value
    seen["after_count"] = threads()
    seen["shutdown_rc"] = nvml.nvmlShutdown()
    seen["after_shutdown"] = threads()
    time.sleep(1.0)
    seen["after_shutdown_1s"] = threads()
    cuda = ctypes.CDLL("libcuda.so.1")
    seen["libcuda_loaded"] = threads()
    seen["cuInit_rc"] = cuda.cuInit(0)
    seen["after_cuInit"] = threads()
    print(json.dumps(seen, indent=1))


if __name__ == "__main__":
    main()

"""The ERROR lines of a vLLM server's journal, less one race of vLLM's own shutdown.

vLLM's API server stops its engine on SIGTERM in an executor thread while its event loop runs
on: the engine client's output task, cancelled, leaves an EngineDeadError for the output handler,
which is cancelled only after it. When the handler wakes first it logs "AsyncLLM output_handler
failed." and the EngineDeadError traceback as ERROR, at a stop that went as it should
(vllm-project/vllm#48745, the fix open as vllm-project/vllm#49000). Nothing warmctl sends causes
it and nothing warmctl can order differently stops it: a unit stop signals the API server alone.

`error_lines` drops that block, and only that: ERROR lines of one API server process, after that
same process logged its shutdown, starting at "AsyncLLM output_handler failed." and ending at the
EngineDeadError line. Any other ERROR line, or that block without a shutdown before it (an engine
that really died), is kept."""

from __future__ import annotations

import re

_LINE = re.compile(
    r"\((?P<proc>APIServer pid=\d+)\) (?P<level>[A-Z]+) \S+ \S+ \[(?P<src>[^\]]+)\] (?P<msg>.*)$"
)
_ERROR = re.compile(r"\bERROR\b")
SHUTDOWN = "[shutdown] API server:"  # vLLM's shutdown log lines (INFO), from the SIGTERM on
RACE_START = "AsyncLLM output_handler failed."
RACE_END = "EngineDeadError"


def error_lines(journal: str) -> tuple[list[str], list[str]]:
    """(ERROR lines, the lines of vLLM#48745's shutdown race) of a journal's text."""
    stopping: set[str] = set()  # API server processes that logged their shutdown
    errors: list[str] = []
    raced: list[str] = []
    block: list[str] = []  # the race's lines so far, of `block_proc`
    block_proc = ""
    for line in journal.splitlines():
        m = _LINE.search(line)
        if block:
            if m and m["proc"] == block_proc and m["level"] == "ERROR":
                block.append(line)
                if RACE_END in m["msg"]:
                    raced += block
                    block = []
                continue
            errors += block  # the block did not end as the race's does: an error like any other
            block = []
        if m and SHUTDOWN in m["msg"]:
            stopping.add(m["proc"])
        starts = m is not None and m["level"] == "ERROR" and m["msg"].startswith(RACE_START)
        if m and starts and m["proc"] in stopping:
            block, block_proc = [line], m["proc"]
        elif _ERROR.search(line):
            errors.append(line)
    return errors + block, raced

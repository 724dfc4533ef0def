"""tests/lib/journal.py drops vLLM's shutdown race (vllm#48745) and nothing else."""

from __future__ import annotations

from tests.lib.journal import error_lines

P = "(APIServer pid=600)"
SHUTDOWN = f"{P} INFO 12-04 02:55:35 [launcher.py:255] [shutdown] API server: shutdown triggered"
RACE = [f"{P} ERROR 12-04 02:55:36 [async_llm.py:906] {text}" for text in (
    "AsyncLLM output_handler failed.",
    "Traceback (most recent call last):",
    '  File "/opt/vllm/venv/lib/python3.11/site-packages/vllm/v1/engine/async_llm.py", line 849',
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
    "(above) for the root cause.",
)]  # fmt: skip
AFTER = f"{P} INFO 12-04 02:55:37 [launcher.py:280] [shutdown] API server: engine client stopped"


def test_the_race_after_a_shutdown_is_set_apart() -> None:
    assert error_lines("\n".join([SHUTDOWN, *RACE, AFTER])) == ([], RACE)


def test_the_same_block_without_a_shutdown_is_an_error() -> None:
    """An engine that died while serving logs the same lines: no shutdown before them."""
    assert error_lines("\n".join([*RACE, AFTER])) == (RACE, [])


def test_a_shutdown_of_another_process_does_not_count() -> None:
    other = SHUTDOWN.replace("pid=600", "pid=700")
    assert error_lines("\n".join([other, *RACE])) == (RACE, [])


def test_a_block_that_does_not_end_in_engine_dead_is_kept() -> None:
    cut = RACE[:3]
    assert error_lines("\n".join([SHUTDOWN, *cut, AFTER])) == (cut, [])
    assert error_lines("\n".join([SHUTDOWN, *cut])) == (cut, [])


def test_other_error_lines_are_kept_around_it() -> None:
    before = f"{P} ERROR 12-04 02:55:30 [serving.py:1] Error in chat template"
    late = "(EngineCore pid=650) ERROR 12-04 02:55:36 [core.py:1] EngineCore failed"
    text = "\n".join([before, SHUTDOWN, *RACE, late])
    assert error_lines(text) == ([before, late], RACE)

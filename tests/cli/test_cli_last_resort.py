"""The last-resort handler: an exception no command turned into a message is one line naming
the command and the error, exit 2; the traceback only with --debug or WARMCTL_DEBUG=1."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import warmctl.plan.calendar
from warmctl.cli import cli


def boom(*_args: object, **_kw: object) -> list[str]:
    raise RuntimeError("boom\nsecond line")


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmctl.plan.calendar, "to_oncalendar", boom)
    monkeypatch.delenv("WARMCTL_DEBUG", raising=False)


def test_unexpected_error_is_one_line_and_exit_2(broken) -> None:
    result = CliRunner().invoke(cli, ["calendar", "@daily"], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr == (
        "warmctl: error: calendar: internal error: RuntimeError: boom second line "
        "(--debug shows where)\n"
    )
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "env"), [(["--debug"], {}), ([], {"WARMCTL_DEBUG": "1"})])
def test_debug_lets_the_traceback_through(broken, args, env) -> None:
    result = CliRunner().invoke(cli, [*args, "calendar", "@daily"], env=env)
    assert isinstance(result.exception, RuntimeError)
    assert "internal error" not in result.stderr


def test_warmctl_errors_keep_their_own_line_and_code() -> None:
    result = CliRunner().invoke(cli, ["calendar", "0 25 * * *"], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr.startswith("warmctl: error: cron '0 25 * * *': hour value 25")
    assert "internal error" not in result.stderr

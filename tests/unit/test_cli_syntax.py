"""The command line's shared syntax: times, durations, the grouped --help, shell completion."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from retry_scheduler.cli.args import duration, moment, seconds
from retry_scheduler.cli.main import build_parser

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-20T08:00:00Z", datetime(2026, 11, 20, 8, tzinfo=UTC)),
        ("2026-11-20T08:00:00", datetime(2026, 11, 20, 8, tzinfo=UTC)),  # no zone: UTC
        ("2026-11-20T09:00:00+01:00", datetime(2026, 11, 20, 8, tzinfo=UTC)),
        ("2026-11-20", datetime(2026, 11, 20, tzinfo=UTC)),
        ("2h", NOW - timedelta(hours=2)),
        ("90s", NOW - timedelta(seconds=90)),
        ("7d", NOW - timedelta(days=7)),
        ("1h30m", NOW - timedelta(minutes=90)),
        ("3600", NOW - timedelta(hours=1)),  # a plain number: seconds ago
    ],
)
def test_a_time_is_iso_8601_or_a_duration_ago(text: str, expected: datetime) -> None:
    parsed = moment(text, now=NOW)
    assert parsed == expected and parsed.tzinfo == UTC


@pytest.mark.parametrize(
    "text",
    ["yesterday", "", "2h ago", "-5", "2026-13-01", "1e400", "nan", "99999999999999d", "\x00", "2" * 5000],
)
def test_anything_else_is_refused_naming_both_forms(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a time: write an ISO-8601 time"):
        moment(text, now=NOW)


def test_durations_take_units_or_seconds() -> None:
    assert [duration(t) for t in ("7d", "168h", "90s", "1.5m", "0s", "60")] == [
        "7d",
        "7d",
        "90s",
        "90s",
        "0s",
        "1m",
    ]
    assert [seconds(t) for t in ("5m", "300", "1h", "0.2s")] == [300, 300, 3600, 1]
    for bad in ("7x", "", "-1", "soon", "inf", "nan", "1e400", "99999999999999d"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a duration: write it like 90s, 15m"):
            duration(bad)


def test_every_time_and_duration_option_takes_the_one_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["bulk-retry", "--since", "2026-11-20T08:00:00Z", "--until", "1h"])
    assert args.since == datetime(2026, 11, 20, 8, tzinfo=UTC) and args.until.tzinfo == UTC
    assert (
        parser.parse_args(["compact", "--older-than", "168h", "--dead-retention", "720h"]).older_than == "7d"
    )
    assert parser.parse_args(["compact"]).dead_retention == "30d"
    assert parser.parse_args(["status", "--window", "15m"]).window == 900
    assert parser.parse_args(["status"]).window == 300
    for argv in (
        ["dlq", "list", "--since", "2h"],
        ["dlq", "replay", "--until", "2026-11-20T08:00:00Z"],
        ["dlq", "purge", "--since", "7d"],
    ):
        assert parser.parse_args(argv).func
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["compact", "--older-than", "a week"])
    assert exited.value.code == 2
    assert "argument --older-than: 'a week' is not a duration" in capsys.readouterr().err


def test_help_lists_the_development_commands_apart() -> None:
    text = build_parser().format_help()
    operating, _, development = text.partition("development and measurement")
    for name in ("db", "status", "run", "bulk-retry", "compact", "dlq"):
        assert f"\n    {name} " in operating
    for name in ("dev", "demo", "bench", "chaos"):
        assert f"\n  {name} " in development and f"\n    {name} " not in operating
    assert build_parser().parse_args(["chaos", "--trials", "1"]).trials == 1  # still a command


def test_version_is_the_package_s(capsys: pytest.CaptureFixture[str]) -> None:
    from retry_scheduler import __version__

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"retry-scheduler {__version__}"


def test_the_shell_completes_commands_and_options(tmp_path: Path) -> None:
    """argcomplete's protocol, as the shell function of ``register-python-argcomplete`` drives it."""
    script = Path(sys.executable).parent / "retry-scheduler"

    def complete(line: str) -> list[str]:
        out = tmp_path / "completions"
        env = {
            **os.environ,
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_SHELL": "bash",
            "_ARGCOMPLETE_IFS": "\n",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        }
        done = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return sorted(out.read_text().split("\n")) if out.exists() else []

    assert complete("retry-scheduler dl") == ["dlq "]
    assert complete("retry-scheduler dlq re") == ["replay "]
    assert complete("retry-scheduler dlq replay --res") == ["--reset-attempts "]
    assert complete("retry-scheduler dlq replay --re") == [
        "--reevaluate",
        "--reset-attempts",
    ]  # two: no space
    assert complete("retry-scheduler dlq list --dead-reason ex") == ["exhausted", "expired"]  # two: no space

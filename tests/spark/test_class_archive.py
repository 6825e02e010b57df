"""``retry-scheduler dev spark-archive``: a real warm-up job leaves a class archive the next driver maps.

Each job runs with ``spark-submit`` (``spark.submit.run_spark_submit``, what ``bulk-retry`` and ``compact`` run).
``-Xshare:on`` makes the JVM refuse to start unless it can map the archive, which is how these tests
see that the driver really used it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from retry_scheduler.cli.main import main
from retry_scheduler.spark import class_archive as sparkjobs
from retry_scheduler.spark.submit import WARM_UP_APP, run_spark_submit, spark_conf

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture
def archive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Where the archive goes by default, in a dev home at ``tmp_path`` (the real one's is left alone)."""
    monkeypatch.setenv("RETRY_DEV_HOME", str(tmp_path / ".dev"))
    monkeypatch.delenv("RETRY_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    path = sparkjobs.class_archive()
    assert path is not None and path.parent == tmp_path / ".dev" / "spark"
    return path


def warm_up_with(options: str, scratch: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run_spark_submit(
        str(WARM_UP_APP), [str(scratch)], conf={"spark.driver.defaultJavaOptions": options}
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_archive_is_written_once_and_the_next_driver_maps_it(
    archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spark_conf() == {}
    # An archive of an earlier JDK or Spark (another name in the same place) is removed.
    archive.parent.mkdir(parents=True)
    stale = [
        archive.parent / "driver-classes-0123456789ab.jsa",
        archive.parent / "driver-classes-0123456789ab.json",
    ]
    for path in stale:
        path.write_text("from an earlier JDK")
    assert main(["dev", "spark-archive"]) == 0
    out = capsys.readouterr().out
    assert not any(path.exists() for path in stale)
    assert f"class archive written: {archive}" in out
    assert archive.is_file() and archive.stat().st_size > 10 * 2**20
    assert json.loads(archive.with_suffix(".json").read_text()) == {"bytes": archive.stat().st_size}
    assert not list(archive.parent.glob(".*.partial"))
    assert spark_conf() == {"spark.driver.defaultJavaOptions": f"-XX:SharedArchiveFile={archive}"}

    assert main(["dev", "spark-archive"]) == 0  # nothing to do the second time
    assert f"class archive up to date: {archive}" in capsys.readouterr().out

    code, out, _err = warm_up_with(f"-Xshare:on -XX:SharedArchiveFile={archive}", tmp_path, capsys)
    assert code == 0
    assert json.loads(out.strip().splitlines()[-1]) == {"rows": 20_000}

    # The same check fails when the archive cannot be mapped: it is not a check that always passes.
    broken = tmp_path / "broken.jsa"
    broken.write_bytes(b"not a class archive\n" * 4096)
    code, _out, err = warm_up_with(f"-Xshare:on -XX:SharedArchiveFile={broken}", tmp_path, capsys)
    assert code != 0
    assert "Unable to use shared archive" in err


def test_turned_off_it_writes_nothing(
    archive: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_SPARK_CLASS_ARCHIVE", "off")
    assert main(["dev", "spark-archive"]) == 0
    assert "no class archive: RETRY_SPARK_CLASS_ARCHIVE=off" in capsys.readouterr().out
    assert not archive.parent.exists()

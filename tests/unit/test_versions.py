"""What an unsupported Python or Airflow meets: one line saying what is needed, from the package and
from make, instead of a broken .venv or an error deep inside a DAG file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_an_older_airflow_is_refused_at_import_in_one_line() -> None:
    done = _python(
        "import importlib.metadata as m; real = m.version; "
        "m.version = lambda name: '2.10.5' if name == 'apache-airflow' else real(name); "
        "import retry_scheduler.airflow"
    )
    assert done.returncode == 1
    assert (
        "ImportError: kafka-retry-scheduler needs Apache Airflow >= 3.1 and < 4; this environment has 2.10.5"
        in done.stderr
    )
    assert _python("import retry_scheduler.airflow").returncode == 0  # the installed Airflow 3 passes


def test_an_older_python_is_refused_at_import_in_one_line() -> None:
    done = _python("import sys; sys.version_info = (3, 10, 12); import retry_scheduler")
    assert (
        done.returncode == 1
        and "ImportError: kafka-retry-scheduler needs Python 3.11 or newer" in done.stderr
    )


def _fake_python(path: Path, version: str) -> Path:
    """An interpreter that says it is ``version`` and fails the Makefile's version test."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\ncase "$1" in --version) echo "Python {version}";; *) exit 1;; esac\n')
    path.chmod(0o755)
    return path


def test_make_refuses_an_older_python_and_an_old_venv_saying_what_to_do(tmp_path: Path) -> None:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    old = _fake_python(tmp_path / "old-python", "3.10.12")
    done = subprocess.run(
        ["make", "venv", f"PYTHON={old}"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert (
        f"make: Python 3.11 or newer is needed, and {old} is Python 3.10.12: run make PYTHON=python3.11"
        in done.stderr
    )
    assert not (tmp_path / ".venv").exists()  # nothing half-made for later runs to trip on

    _fake_python(tmp_path / ".venv" / "bin" / "python", "3.10.12")  # left by an earlier run
    done = subprocess.run(["make", "venv"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "make: .venv was made with Python 3.10.12, older than 3.11: remove it (make clean)" in done.stderr
    subprocess.run(["make", "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    assert not (tmp_path / ".venv").exists()

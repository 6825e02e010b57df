"""Run a command with its stderr on a real terminal (a pty), as a user at a shell sees it."""

from __future__ import annotations

import os
import pty
import re
import subprocess


def run_in_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """``(exit status, what the terminal showed without colours and cursor moves, stdout)``: stderr
    is a pty 120 columns wide, stdout a pipe (what a script or ``| jq`` would read)."""
    leader, follower = pty.openpty()
    env = {**env, "COLUMNS": "120", "TERM": "xterm"}
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=follower, text=True) as proc:
        os.close(follower)
        screen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not chunk:
                break
            screen += chunk
        out = proc.stdout.read() if proc.stdout else ""
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))
    return proc.returncode, text, out

"""Run a command under a pseudo-terminal, as a person at a terminal would, and read back what it drew."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Mapping


def run_in_pty(command: list[str], env: Mapping[str, str], timeout_s: float) -> str:
    """The command's stdout and stderr as the terminal received them; fails if it does not exit 0 in time."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, stdin=terminal, stdout=terminal, stderr=terminal, env=dict(env))
    os.close(terminal)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: the command exited
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
        process.wait()
    output = b"".join(chunks).decode(errors="replace")
    if process.returncode != 0:
        raise AssertionError(f"{command} exited {process.returncode}:\n{output[-4000:]}")
    return output

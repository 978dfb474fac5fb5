"""Process helpers for the tests: real processes, own process groups, deadlines."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Started:
    process: subprocess.Popen
    log: Path
    url: str

    def alive(self) -> bool:
        return self.process.poll() is None


def start_process(command: list[str], log: Path, url: str, env: dict[str, str] | None = None) -> Started:
    """Start `command` in its own session (process group), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("wb")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                               env={**os.environ, **(env or {})}, start_new_session=True)
    handle.close()
    return Started(process, log, url)


def wait_until_ready(started: Started, path: str, deadline_s: float) -> None:
    """Poll `url+path` until it answers 200, failing fast if the process dies."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not started.alive():
            raise RuntimeError(f"process exited with {started.process.returncode} before it was ready; "
                               f"log tail:\n{log_tail(started.log)}")
        try:
            if requests.get(started.url + path, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready after {deadline_s:.0f} s; log tail:\n{log_tail(started.log)}")


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop_group(started: Started, grace_s: float = 20.0) -> None:
    """Stop the leader, then its whole process group (vLLM forks engine processes).

    TERM goes to the leader first: vLLM's API server then shuts its engine down in ~2 s.
    TERM sent to every process at once makes it wait on an engine that is already gone
    (~20 s measured), so the group only gets TERM, then KILL, if the leader was not enough.
    """
    pgid = started.process.pid  # start_new_session: the leader's PID is the group id
    steps = ((lambda: os.kill(pgid, signal.SIGTERM), grace_s),
             (lambda: os.killpg(pgid, signal.SIGTERM), 5.0),
             (lambda: os.killpg(pgid, signal.SIGKILL), 5.0))
    for send, wait in steps:
        started.process.poll()
        if not process_group_alive(pgid):
            break
        try:
            send()
        except ProcessLookupError:
            pass
        end = time.monotonic() + wait
        while time.monotonic() < end and process_group_alive(pgid):
            started.process.poll()  # reap the leader: a zombie still counts as a group member
            time.sleep(0.1)
    try:
        started.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass

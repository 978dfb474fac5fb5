"""The one way a secret reaches a child process, in the shell (with_env, scripts/lifecycle.sh) and in Python
(settings.child_environment): through its environment, never its command line. Checked with strace,
which records every execve's argument list."""

from __future__ import annotations

import subprocess

from helpers import ROOT
from ocr_bundle.settings import child_environment

SECRET = "hand-off-test-secret"


def test_with_env_hands_a_secret_to_a_function_or_a_program_through_the_environment_only(tmp_path):
    trace = tmp_path / "execve.trace"
    script = f"""
        ROOT={ROOT}; source "$ROOT/scripts/lifecycle.sh"
        shown() {{ printenv SECRET_NAME; }}
        with_env SECRET_NAME="$1" -- printenv SECRET_NAME      # a program
        with_env SECRET_NAME="$1" OTHER=x -- shown              # a shell function, two variables
        with_env OTHER=y -- with_env SECRET_NAME="$1" -- bash -c 'echo "child sees ${{#SECRET_NAME}} characters"'
        printenv SECRET_NAME || echo "not left behind"
    """
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", "-s", "100000", "-o",
                           str(trace), "bash", "-c", script, "script", SECRET], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [SECRET, SECRET, f"child sees {len(SECRET)} characters", "not left behind"]
    execs = [line for line in trace.read_text().splitlines() if " execve(" in line]
    assert any('"printenv", "SECRET_NAME"' in line for line in execs)
    # The test hands the secret to bash -c as an argument; no program started after that holds it.
    assert [line for line in execs if SECRET in line] == [execs[0]] and "bash" in execs[0]


def test_child_environment_sets_and_removes_without_touching_the_parent():
    parent = {"PATH": "/bin", "VLLM_API_KEY": "old"}
    child = child_environment(parent, VLLM_API_KEY=SECRET, EXTRA="1")
    assert child == {"PATH": "/bin", "VLLM_API_KEY": SECRET, "EXTRA": "1"} and parent["VLLM_API_KEY"] == "old"
    assert child_environment(parent, VLLM_API_KEY=None) == {"PATH": "/bin"}
    assert child_environment(parent, VLLM_API_KEY="") == {"PATH": "/bin"}

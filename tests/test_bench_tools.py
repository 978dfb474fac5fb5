"""The GPU driver's helpers that run on any machine: py-spy stack summaries (benchmarks/stack_top.py)
and finding a server's processes by role (benchmarks/server_cpu.py pids), the second against the
session's real vLLM server."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import PYTHON, ROOT, Started

from ocr_bundle.serve.processes import write_pid_file

# py-spy's raw output (`record --format raw --threads`): one distinct stack per line, then its count.
RAW = """\
thread (101): MainThread;run_busy_loop (/s/vllm/v1/engine/core.py:900);step (/s/vllm/v1/engine/core.py:410);execute_model (/s/vllm/v1/worker/gpu/model_runner.py:120) 60
thread (101): MainThread;run_busy_loop (/s/vllm/v1/engine/core.py:900);step (/s/vllm/v1/engine/core.py:412);sample (/s/vllm/v1/sample/sampler.py:55) 30
thread (101): MainThread;run_busy_loop (/s/vllm/v1/engine/core.py:905) 10
thread (102): Thread-3 (process_output_sockets);wait (/usr/lib/python3.12/threading.py:355) 100
"""


def stack_top(raw: Path, *args: str) -> str:
    return subprocess.run([PYTHON, str(ROOT / "benchmarks" / "stack_top.py"), str(raw), *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def test_stack_top_adds_up_a_function_over_its_lines_per_thread(tmp_path: Path) -> None:
    raw = tmp_path / "engine.txt"
    raw.write_text(RAW)
    report = stack_top(raw, "--min-share", "0")
    main, other = report.split("thread Thread-3 (process_output_sockets)")
    assert main.startswith("thread MainThread\n  100 samples")
    # `step` appears at two lines (410, 412): inside it are 60 + 30 of the thread's 100 samples.
    assert " 90.0%  step (engine/core.py)" in main
    assert " 60.0%  execute_model (gpu/model_runner.py)" in main
    # Own samples: the busy loop ran itself in 10 of them; a caller's frame is not its own time.
    own = main.split("inclusive samples")[0]
    assert " 10.0%  run_busy_loop (engine/core.py)" in own
    assert "step (engine/core.py)" not in own
    assert "100.0%  wait (python3.12/threading.py)" in other and "MainThread" not in other


def test_stack_top_refuses_a_file_without_stacks(tmp_path: Path) -> None:
    raw = tmp_path / "empty.txt"
    raw.write_text("py-spy> nothing sampled\n")
    result = subprocess.run([PYTHON, str(ROOT / "benchmarks" / "stack_top.py"), str(raw)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1 and "no stacks" in result.stderr


def test_server_cpu_finds_the_engine_core_of_a_real_server(vllm_server: Started, tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    write_pid_file(pid_file, vllm_server.service.pid)

    def pids(role: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, str(ROOT / "benchmarks" / "server_cpu.py"), "pids", str(pid_file),
                               "--role", role], capture_output=True, text=True, timeout=60, check=False)

    found = pids("VLLM::EngineCore")
    assert found.returncode == 0, found.stderr
    engines = [int(line) for line in found.stdout.split()]
    assert len(engines) == 1
    title = Path(f"/proc/{engines[0]}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert title.startswith("VLLM::EngineCore")
    assert engines[0] != vllm_server.service.pid  # the engine core is a child, not the API server
    missing = pids("VLLM::NoSuchRole")
    assert missing.returncode == 1 and missing.stdout.strip() == ""

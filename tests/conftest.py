"""Session fixtures: the checkpoints and their real vLLM servers (CPU backend), one of each per session.

- `vllm_server` serves the generated random-weight tiny checkpoint: the engine, the
  protocol and the failure paths, where any text will do.
- `reader_server` serves the committed trained reader (tests/fixtures/lightonocr-reader,
  scripts/train_reader.py): where the test must know which words come out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import PYTHON, READER_CHECKPOINT, Started, free_port, start_process, stop_group, wait_until_ready  # noqa: E402

TINY_CHECKPOINT = ROOT / "models" / "lightonocr-tiny"
SERVER_START_DEADLINE_S = 300  # ~60–80 s measured on 2 cores; generous for a loaded CI box
TEST_MAX_MODEL_LEN = 4096


def ensure_tiny_checkpoint() -> Path:
    if not (TINY_CHECKPOINT / "config.json").exists():
        subprocess.run([PYTHON, str(ROOT / "scripts" / "make_checkpoint.py"), "--preset", "tiny",
                        "--out", str(TINY_CHECKPOINT)], check=True)
    return TINY_CHECKPOINT


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whatever uses the session's vLLM server is slow (it starts in ~60-80 s on 2 cores)."""
    for item in items:
        if {"vllm_server", "reader_server"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_checkpoint() -> Path:
    return ensure_tiny_checkpoint()


def serve(checkpoint: Path, served_name: str, tmp_path_factory: pytest.TempPathFactory):
    """The real vLLM OpenAI server on the CPU, started through the bundle's own launcher."""
    port = free_port()
    log = tmp_path_factory.mktemp(served_name) / "vllm.log"
    started = start_process(
        [PYTHON, str(ROOT / "start_vllm_server.py"), "--model", str(checkpoint),
         "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", str(TEST_MAX_MODEL_LEN), "--cpu-kv-cache-gb", "1"],
        log, f"http://127.0.0.1:{port}",
    )
    try:
        wait_until_ready(started, "/health", SERVER_START_DEADLINE_S)
        yield started
    finally:
        stop_group(started)


@pytest.fixture(scope="session")
def vllm_server(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Started:
    yield from serve(tiny_checkpoint, "lightonocr-tiny", tmp_path_factory)


@pytest.fixture(scope="session")
def reader_server(tmp_path_factory: pytest.TempPathFactory) -> Started:
    yield from serve(READER_CHECKPOINT, "lightonocr-reader", tmp_path_factory)

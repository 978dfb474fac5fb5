"""Session fixtures: the checkpoints and their real vLLM servers (CPU backend), one of each per session.

- `vllm_server` serves the generated random-weight tiny checkpoint: the engine, the
  protocol and the failure paths, where any text will do.
- `reader_server` serves the committed trained reader (tests/fixtures/lightonocr-reader,
  scripts/train_reader.py): where the test must know which words come out.
- `grounding_server` serves the committed trained grounding model
  (tests/fixtures/lightonocr-3-1b-grounding, scripts/train_grounding.py): LightOnOCR-3's blocks,
  boxes and words. Module-scoped: one module uses it, and the machine has 2 cores for three servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import GROUNDING_CHECKPOINT, PYTHON, READER_CHECKPOINT, Started, free_port, start_process, stop_group, wait_until_ready  # noqa: E402

TINY_CHECKPOINT = ROOT / "models" / "lightonocr-tiny"
SERVER_START_DEADLINE_S = 300  # ~60–80 s measured on 2 cores; generous for a loaded CI box
TEST_MAX_MODEL_LEN = 4096


def ensure_tiny_checkpoint() -> Path:
    if not (TINY_CHECKPOINT / "config.json").exists():
        subprocess.run([PYTHON, str(ROOT / "scripts" / "make_checkpoint.py"), "--preset", "tiny",
                        "--out", str(TINY_CHECKPOINT)], check=True)
    return TINY_CHECKPOINT


# Fixtures that need the CPU environment (scripts/setup_cpu_env.sh): vLLM's CPU build, or
# torch and transformers to generate the checkpoint.
NEEDS_VLLM_FIXTURES = {"vllm_server", "reader_server", "grounding_server", "tiny_checkpoint"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whatever needs vLLM is slow (its server starts in ~60-80 s on 2 cores, an import of it
    takes ~15 s), and so is what needs olmOCR-Bench's scorer (requirements-quality.txt):
    `-m "not slow"` is the fast tier, which runs with requirements-bundle.txt and pytest alone."""
    for item in items:
        if NEEDS_VLLM_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.needs_vllm)
        if item.get_closest_marker("needs_vllm") or item.get_closest_marker("needs_olmocr"):
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


@pytest.fixture(scope="module")
def grounding_server(tmp_path_factory: pytest.TempPathFactory) -> Started:
    yield from serve(GROUNDING_CHECKPOINT, "lightonocr-3-1b-grounding", tmp_path_factory)


@pytest.fixture
def no_server_environment(monkeypatch):
    """A client test against a stand-in: none of the user's VLLM_URL, VLLM_API_KEY, VLLM_MODEL."""
    for name in ("VLLM_URL", "VLLM_API_KEY", "VLLM_MODEL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server():
    """The scripted stand-in for vLLM (scripted_server.py): answers what the test says."""
    from scripted_server import ScriptedServer

    with ScriptedServer() as running:
        yield running

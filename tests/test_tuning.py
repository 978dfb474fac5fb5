"""ocr_bundle.serve.tuning: 128-token KV blocks and the compiled encoder, only where they were measured."""

from __future__ import annotations

import json

import pytest

from ocr_bundle.serve import attention, tuning
from ocr_bundle.serve.vllm_patches import COMPILE_ENV, DISABLE_ENV

H200 = attention.GpuFacts(("9.0",), flashinfer_installed=True, nvcc="/usr/local/cuda/bin/nvcc")
A100 = attention.GpuFacts(("8.0",), flashinfer_installed=True, nvcc="/usr/local/cuda/bin/nvcc")
NO_FLASHINFER = attention.GpuFacts(("9.0",), flashinfer_installed=False, nvcc="/usr/local/cuda/bin/nvcc")


def tune(compile_encoder="auto", kv="auto", device="cuda", passthrough=(), facts=H200, environ=None):
    environ = environ or {}
    chosen = (attention.choose("auto", kv, device, passthrough, facts, environ)
              if device == "cuda" else None)
    return tuning.choose(compile_encoder, kv, device, passthrough, facts, chosen, environ)


def test_the_measured_setting_gets_both():
    tuned = tune()
    assert tuned.flags == ["--block-size", "128"]
    assert tuned.env == {COMPILE_ENV: "1"}
    assert tuned.notes[0].startswith("KV block size: 128 tokens") and "compiled with torch.compile" in tuned.notes[1]
    # FlashAttention asked for by name is the same kernels.
    asked = tuning.choose("auto", "auto", "cuda", (), H200, attention.AttentionChoice("FLASH_ATTN", "asked"), {})
    assert asked.flags == ["--block-size", "128"]


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_the_encoder_stays_as_vllm_runs_it_where_the_bundles_patch_cannot_compile_it(kv):
    """The encoder compiles only inside the bundle's patch: on a vLLM it is not verified on (0.34.0 logged
    "compiled" while the patch stood aside), or with the patch off, the launcher says so and leaves it off."""
    chosen = attention.choose("auto", kv, "cuda", (), H200, {})
    newer = tuning.choose("auto", kv, "cuda", (), H200, chosen, {}, vllm_version="0.30.0")
    assert newer.env == {COMPILE_ENV: "0"} and "--compilation-config" not in newer.flags
    note = next(note for note in newer.notes if note.startswith("vision encoder"))
    assert "verified on vLLM 0.26.0, not 0.30.0" in note and "compile_mm_encoder" in note
    off = tuning.choose("on", kv, "cuda", (), H200, chosen, {DISABLE_ENV: "off"}, vllm_version="0.26.0")
    assert off.env == {COMPILE_ENV: "0"} and f"patch is off ({DISABLE_ENV}=off)" in off.notes[1]
    pinned = tuning.choose("auto", kv, "cuda", (), H200, chosen, {}, vllm_version="0.26.0")
    assert pinned.env == {COMPILE_ENV: "1"} and "compiled with torch.compile" in pinned.notes[1]
    # The rest of the profile does not depend on it.
    assert newer.flags == pinned.flags


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_vllm_0_34_gets_its_own_encoder_compile_and_graphs_where_the_pin_gets_the_bundles(kv):
    """Every vLLM 0.34.0 figure (11.55 pages/s fp8 against 10.47 for the pin) ran with its own encoder switches on."""
    chosen = attention.choose("auto", kv, "cuda", (), H200, {})
    tuned = tuning.choose("auto", kv, "cuda", (), H200, chosen, {}, vllm_version="0.34.0")
    at = tuned.flags.index("--compilation-config")
    assert json.loads(tuned.flags[at + 1]) == {"compile_mm_encoder": True, "cudagraph_mm_encoder": True}
    assert tuned.env == {COMPILE_ENV: "0"}  # the bundle's patch stands aside on 0.34.0
    assert any(note.startswith("vision encoder: vLLM 0.34.0's own compile and CUDA graphs") for note in tuned.notes)
    pinned = tuning.choose("auto", kv, "cuda", (), H200, chosen, {}, vllm_version="0.26.0")
    assert tuned.flags[:at] + tuned.flags[at + 2:] == pinned.flags  # the rest of the profile is the pin's
    # Where the pin's encoder stays eager, or the user said how, 0.34.0's does too.
    assert "--compilation-config" not in tuning.choose("off", kv, "cuda", (), H200, chosen, {}, vllm_version="0.34.0").flags
    kept = tuning.choose("auto", kv, "cuda", (), H200, chosen, {COMPILE_ENV: "0"}, vllm_version="0.34.0")
    assert "--compilation-config" not in kept.flags and COMPILE_ENV not in kept.env


# How vLLM's parser lets one say how it compiles (each one checked against it below).
COMPILATION_SPELLINGS = [
    ("--compilation-config", '{"compile_mm_encoder": false}'), ('--compilation_config={"mode": 0}',),
    ("--compilation", "{}"), ("--compilation-config.cudagraph_mm_encoder", "false"),
    ("-cc", "{}"), ('-cc={"mode": 0}',), ("-cc.compile_mm_encoder=false",),
    ("-O0",), ("-O", "0"), ("-O.mode=0",), ("--optimization-level", "0"), ("--optimization_level=0",),
    ("--enforce-eager",), ("--enforce_eager",),
]


@pytest.mark.parametrize("spelling", COMPILATION_SPELLINGS)
def test_compilation_set_after_the_separator_wins_in_any_spelling_vllm_takes(spelling):
    chosen = attention.choose("auto", "auto", "cuda", spelling, H200, {})
    tuned = tuning.choose("auto", "auto", "cuda", spelling, H200, chosen, {}, vllm_version="0.34.0")
    assert "--compilation-config" not in tuned.flags
    assert "vision encoder: as the compilation flags after -- set it" in tuned.notes
    # What is not a compilation flag leaves the launcher's choice.
    other = ("--max-num-seqs", "64", "--served-model-name", "ocr")
    assert not tuning.compilation_set_in_passthrough(other)


@pytest.mark.needs_vllm
def test_every_compilation_spelling_above_is_one_vllms_parser_takes():
    from ocr_bundle.serve.launch import vllm_argument_parser

    parser = vllm_argument_parser()
    assert parser is not None
    for spelling in COMPILATION_SPELLINGS:
        parser.parse_args(["--model", "m", *spelling])  # a spelling it refuses exits, and fails the test


def test_the_fp8_profile_with_flashinfer_compiles_the_encoder_keeps_vllms_blocks_and_runs_four_api_servers():
    tuned = tune(kv="fp8")  # auto picks FlashInfer on Hopper, which takes blocks of at most 64
    assert tuned.env == {COMPILE_ENV: "1"}
    assert tuned.flags == ["--api-server-count", "4"] and "not measured with an fp8 KV cache" in tuned.notes[0]
    assert tuned.notes[-1].startswith("API servers: 4")


@pytest.mark.parametrize("spelling", [("--api-server-count", "2"), ("--api_server_count=2",), ("--api-server", "2"),
                                      ("--api-s=2",)])
def test_api_servers_set_after_the_separator_win_in_any_spelling(spelling):
    tuned = tune(kv="fp8", passthrough=spelling)
    assert "--api-server-count" not in tuned.flags and tuned.notes[-1] == "API servers: as set after --"


def test_api_servers_stay_vllms_where_four_were_not_measured():
    for tuned in (tune(), tune(kv="fp8", facts=NO_FLASHINFER), tune(kv="fp8", facts=A100),
                  tuning.choose("auto", "fp8", "cuda", (), H200, attention.choose("auto", "fp8", "cuda", (), H200, {}),
                                {}, engines=2)):
        assert "--api-server-count" not in tuned.flags


@pytest.mark.parametrize("case, why", [
    (dict(kv="fp8", facts=NO_FLASHINFER), "not measured with an fp8 KV cache"),  # FlashAttention decodes it
    (dict(kv="fp8", passthrough=("--attention-backend", "FLASH_ATTN")), "not measured with an fp8 KV cache"),
    (dict(facts=A100), "not measured on these GPUs"),
    (dict(passthrough=("--attention-backend", "TRITON_ATTN")), "not measured with this attention backend"),
])
def test_elsewhere_vllms_defaults_stay_and_the_notes_say_why(case, why):
    tuned = tune(**case)
    assert "--block-size" not in tuned.flags
    assert tuned.env == {COMPILE_ENV: "0"}
    assert all(why in note for note in tuned.notes)


def test_the_users_own_settings_win():
    assert tune(passthrough=("--block-size", "32")).flags == []
    assert tune(passthrough=("--block-size=32",)).notes[0] == "KV block size: as set after --"
    kept = tune(environ={COMPILE_ENV: "0"})
    assert COMPILE_ENV not in kept.env and f"{COMPILE_ENV}=0, as set in the environment" in kept.notes[1]
    assert tune("off").env == {COMPILE_ENV: "0"} and tune("off").notes[1] == "vision encoder: eager"
    forced = tune("on", kv="fp8")
    assert forced.env == {COMPILE_ENV: "1"} and "--block-size" not in forced.flags  # blocks stay vLLM's


def test_the_cpu_backend_is_left_alone():
    assert tune(device="cpu", facts=attention.GpuFacts()) == tuning.Tuning()

"""What the launcher adds to vLLM's defaults on a GPU, beyond the attention kernels: the KV
cache's block size and the vision encoder compiled. Each only where it won.

Measured on H200s with the full checkpoint (docs/benchmarks.md, 2026-11-30 compiled-encoder run; A4 page,
1,000 tokens, concurrency 256, bf16 KV cache with FlashAttention 3). 128-token KV blocks
together with the encoder's transformer stack under torch.compile, against vLLM's defaults,
one server after the other on the same GPU, in both orders: 7.58 against 7.25 and 7.83
against 7.31 pages/s (+4% and +7%). On two more machines, servers side by side on their two
GPUs: 7.09-7.69 against 6.84-6.91, and 7.26-7.38 against 7.14-7.22. Every such run beat
every default run of its machine. Alone, 128-token blocks had given +3.3%, inside the noise
(2026-11-30 block-size run).

With an fp8 KV cache and FlashInfer (the launcher's fp8 choice on Hopper, ocr_bundle.serve.attention),
the compiled encoder alone: 9.61 against 9.42 pages/s at concurrency 512 (+2.0%, one H200, one
server after the other with vLLM 0.26.0's run in between; docs/benchmarks.md, 2026-12-02 fp8 run).
That is inside the run-to-run spread, but with a bf16 cache every compiled run beat every
default run of its machine (above), the encoder itself is faster compiled (36.4 -> 31.8 ms per
page, 2026-11-30 block-size run), and the build is paid in the warm-up, so the fp8 profile compiles it too.

API servers: with the fp8 profile at concurrency 512 one API server is the host's cap. It spends
~115 ms of CPU per page there (py-spy: its one preprocessing thread 92% busy, in the Pixtral
processor's normalize and padding), 1.1 cores at 9.7 pages/s. Four API servers: 10.45 pages/s
against 9.52-9.88 with one and 9.95 with two (one H200, one server after the other, 2026-12-03;
docs/benchmarks.md, "API servers per GPU"), ~30 ms each. With a bf16 cache at concurrency 256 they
change nothing (8.01-8.08 against 7.55-8.03), so only the fp8 profile of one engine gets four;
several engines keep vLLM's default of one per engine (two measured best at data parallel 2).

Where it was not measured, vLLM's defaults stay:
- KV blocks with an fp8 KV cache: FlashInfer takes blocks of at most 64 tokens on Hopper; 64
  gave +1.6%, inside the noise.
- an fp8 KV cache with FlashAttention (FlashInfer missing or not chosen): the encoder stays eager.
- GPUs other than Hopper: other attention kernels, other block constraints.
- vLLM's CPU backend: the bundle's encoder patch does not apply to its vLLM.
- a vLLM other than the patch's verified version (0.26.0) or VLLM_ENCODER_GRAPHS (0.34.0), or the patch
  switched off: the encoder compiles only inside the patch, so it runs as that vLLM runs it (the launcher
  says so).

vLLM 0.34.0 packs and compiles the encoder itself and captures it in CUDA graphs (vLLM PR #56277), each
behind a switch that is off by default. Every 0.34.0 figure was measured with both on (docs/benchmarks.md,
2026-12-03): with the fp8 profile 11.55 pages/s at concurrency 512, 12.21 sustained, against 10.47 and
10.14 for 0.26.0's fp8 profile one run before on the same H200; bf16 7.54 against 7.07-7.68 for the pin
on another. 0.34.0 without them was not measured, so where the launcher would compile the encoder on the
pin, it turns vLLM's own switches on for 0.34.0 instead (unless the flags after -- set compilation).

The compiled encoder costs one build, inside the engine, when it encodes its first image:
15-44 s on an H200. start_optimized.sh sends a warm-up page per engine (ocr_bundle.serve.warmup)
before it reports the server ready, so users never wait for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ocr_bundle.serve import attention
from ocr_bundle.serve.versions import release
from ocr_bundle.serve.vllm_patches import COMPILE_ENV, encoder_compile_unavailable

COMPILE_CHOICES = ("auto", "on", "off")
BLOCK_SIZE = 128  # tokens per KV-cache block; FlashAttention takes any multiple of 16
FP8_API_SERVERS = 4  # vLLM API servers for the fp8 profile of one engine
# vLLM versions whose own encoder compile and CUDA graphs were measured (above), and the switches for them.
VLLM_ENCODER_GRAPHS = ("0.34.0",)
VLLM_ENCODER_CONFIG = {"compile_mm_encoder": True, "cudagraph_mm_encoder": True}


@dataclass(frozen=True)
class Tuning:
    flags: list[str] = field(default_factory=list)  # vLLM arguments
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one line each, printed by the launcher


def choose(compile_encoder: str, kv_cache_dtype: str, device: str, passthrough: Sequence[str],
           facts: attention.GpuFacts, attention_choice: attention.AttentionChoice | None,
           environ: Mapping[str, str], engines: int = 1, vllm_version: str | None = None) -> Tuning:
    """vllm_version: the vLLM that will serve, None when not known (a dry run beside another build)."""
    if device != "cuda":
        return Tuning()
    # The measured setting: bf16 KV cache, FlashAttention (vLLM's default on Hopper, or asked for).
    flash_attention = (attention_choice is not None and attention_choice.vllm_backend in (None, "FLASH_ATTN")
                       and not attention.set_in_passthrough(passthrough))  # None: vLLM's default, FA3 on Hopper
    measured = kv_cache_dtype == "auto" and facts.hopper and flash_attention
    # The fp8 profile as the launcher picks it on Hopper: FlashInfer decoding an fp8 cache.
    fp8_flashinfer = (kv_cache_dtype == "fp8" and facts.hopper and attention_choice is not None
                      and attention_choice.vllm_backend == "FLASHINFER" and not attention.set_in_passthrough(passthrough))
    unmeasured = ("not measured with an fp8 KV cache" if kv_cache_dtype != "auto"
                  else "not measured on these GPUs" if not facts.hopper
                  else "not measured with this attention backend")
    flags, env, notes = [], {}, []

    if attention.passthrough_sets(passthrough, "--block-size"):
        notes.append("KV block size: as set after --")
    elif measured:
        flags += ["--block-size", str(BLOCK_SIZE)]
        notes.append(f"KV block size: {BLOCK_SIZE} tokens (with the compiled encoder, +4-7% pages/s on H200)")
    else:
        notes.append(f"KV block size: vLLM's default ({BLOCK_SIZE} tokens {unmeasured})")

    compile_wanted = compile_encoder == "on" or (compile_encoder == "auto" and (measured or fp8_flashinfer))
    unavailable = encoder_compile_unavailable(vllm_version, environ) if compile_wanted else None
    if COMPILE_ENV in environ:
        notes.append(f"vision encoder: {COMPILE_ENV}={environ[COMPILE_ENV]}, as set in the environment")
    elif compile_wanted and vllm_version is not None and release(vllm_version) in VLLM_ENCODER_GRAPHS:
        env[COMPILE_ENV] = "0"  # the bundle's patch stands aside on this vLLM: its switch would do nothing
        if compilation_set_in_passthrough(passthrough):
            notes.append("vision encoder: as the compilation flags after -- set it")
        else:
            flags += ["--compilation-config", json.dumps(VLLM_ENCODER_CONFIG, separators=(",", ":"))]
            notes.append(f"vision encoder: vLLM {vllm_version}'s own compile and CUDA graphs (compile_mm_encoder, "
                         "cudagraph_mm_encoder: the configuration its figures were measured in)")
    elif unavailable:
        env[COMPILE_ENV] = "0"
        notes.append(f"vision encoder: as vLLM runs it ({unavailable}; vLLM's own compile, where the version "
                     "has it: -- --compilation-config '{\"compile_mm_encoder\": true}')")
    elif compile_wanted:
        env[COMPILE_ENV] = "1"
        notes.append("vision encoder: compiled with torch.compile when it encodes its first image (15-45 s, once "
                     "per start; start_optimized.sh does it before saying ready)")
    else:
        env[COMPILE_ENV] = "0"
        if kv_cache_dtype == "fp8" and facts.hopper:
            unmeasured = "not measured with an fp8 KV cache and this attention backend"
        notes.append("vision encoder: eager" + ("" if compile_encoder == "off" else f" (torch.compile {unmeasured})"))

    if attention.passthrough_names(passthrough, "--api-server-count"):
        notes.append("API servers: as set after --")
    elif fp8_flashinfer and engines == 1:
        flags += ["--api-server-count", str(FP8_API_SERVERS)]
        notes.append(f"API servers: {FP8_API_SERVERS} (the fp8 profile: one API server's image preprocessing caps it; "
                     "10.45 against 9.5-9.9 pages/s on H200)")
    return Tuning(flags, env, notes)


def compilation_set_in_passthrough(passthrough: Sequence[str]) -> bool:
    """Whether the vLLM flags after -- decide how it compiles, in any spelling its parser takes: the compilation
    config (--compilation-config, --compilation_config, a prefix of it, -cc, a dotted key such as
    -cc.compile_mm_encoder=false), the optimization level (-O3, -O 0, --optimization-level) or --enforce-eager."""
    return (any(attention.passthrough_names(passthrough, flag)
                for flag in ("--compilation-config", "--optimization-level", "--enforce-eager"))
            or any(token == "-cc" or token.startswith(("-cc=", "-cc.", "-O")) for token in passthrough))

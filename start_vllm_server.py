#!/usr/bin/env python3
"""Start vLLM's OpenAI-compatible server for LightOnOCR-2-1B with the model's recommended flags.

    python start_vllm_server.py                       # hub id, port 8000, localhost only
    VLLM_API_KEY=s3cret python start_vllm_server.py --model /models/LightOnOCR-2-1B --host 0.0.0.0
    python start_vllm_server.py --dry-run             # print the vLLM command, start nothing
    python start_vllm_server.py -- --enforce-eager    # anything after -- goes to vLLM as is

Precedence for every setting: command-line flag > environment variable > default.
Environment variables: MODEL, SERVED_MODEL_NAME, HOST, PORT, VLLM_API_KEY,
GPU_MEMORY_UTILIZATION, MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS,
MAX_PAGES_IN_FLIGHT, KV_CACHE_DTYPE, ATTENTION_BACKEND, COMPILE_ENCODER, VLLM_DEVICE (auto|cuda|cpu),
VLLM_CPU_KVCACHE_SPACE, TLS_CERT, TLS_KEY, TLS_CA (HTTPS; behind a gateway, a client certificate
signed by TLS_CA is required), ALLOW_PLAINTEXT.
On GPUs it passes VLLM_USE_FLASHINFER_SAMPLER=0 to vLLM unless that is set already (why:
in build_command).

The recommended flags (LightOn's recipe): one image per prompt, no multimodal processor
cache (every page is new), no prefix caching (prompts share nothing but the chat
template). The launcher replaces itself with vLLM (exec), so a PID recorded for this
script is vLLM's PID.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ocr_bundle import exposure, tls
from ocr_bundle.serve import attention, tuning
from ocr_bundle.serve.launch import (
    LaunchError,
    build_command,
    build_parser,
    check_local_checkpoint,
    installed_vllm_flavour,
    installed_vllm_version,
    looks_like_path,
    passthrough_problem,
    plan_data_parallel,
    preflight,
    redact,
    resolve_device,
    resolve_family,
    route_keys_problem,
    split_passthrough,
    vllm_argument_parser,
)
from ocr_bundle.families import FamilyError
from ocr_bundle.serve.scaleout import ScaleOutError, visible_gpu_count
from ocr_bundle.settings import MAX_OUTPUT_TOKENS, PAGE_PROMPT_TOKENS, api_key_from_env


def main(argv: list[str] | None = None) -> int:
    own, passthrough = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = build_parser(__doc__).parse_args(own)
    try:
        env = {**os.environ, exposure.OPEN_API_ENV: "1" if args.allow_open_api else "",
               tls.PLAINTEXT_ENV: "1" if args.allow_plaintext else "", tls.CERT_ENV: args.tls_cert or "",
               tls.KEY_ENV: args.tls_key or "", tls.CA_ENV: args.tls_ca or ""}
        decision = exposure.check("join" if args.join else "single", args.host, None, env, args.join,
                                  admin_key_needed=False)
        problem = (decision.problems or [None])[0] or passthrough_problem(
            passthrough, vllm_argument_parser() if passthrough else None)
        if problem is None and not args.dry_run:
            problem = route_keys_problem(installed_vllm_version(), bool(api_key_from_env()))
        if problem is not None:
            raise LaunchError(problem)
        if looks_like_path(args.model):
            check_local_checkpoint(Path(os.path.expanduser(args.model)))
        family = resolve_family(args)
        flavour = installed_vllm_flavour()
        preflight()
        if args.dry_run and (flavour is None or args.device != "auto"):
            # Print what would run; the install is checked when it runs for real.
            device = args.device if args.device != "auto" else ("cpu" if flavour == "cpu" else "cuda")
        else:
            device = resolve_device(args.device, flavour)
        gpus = visible_gpu_count(os.environ) if device == "cuda" else 0
        if device == "cuda" and not args.dry_run and gpus == 0:
            raise LaunchError("no NVIDIA GPU is visible (nvidia-smi -L lists none, or CUDA_VISIBLE_DEVICES hides "
                              "them all). Without a GPU, install vLLM's CPU build with scripts/setup_cpu_env.sh and "
                              "run this script with that venv's python.")
        plan = plan_data_parallel(args, device, gpus)
        facts = attention.probe(os.environ) if device == "cuda" else attention.GpuFacts()
        attention_choice = attention.choose(args.attention_backend, args.kv_cache_dtype, device, passthrough,
                                            facts, os.environ)
        # The vLLM that will serve a GPU, when the one installed is it (a dry run beside the CPU build: unknown).
        serving_version = installed_vllm_version() if flavour == "cuda" else None
        tuned = tuning.choose(args.compile_encoder, args.kv_cache_dtype, device, passthrough, facts,
                              attention_choice, os.environ, plan.local, serving_version)
    except (LaunchError, ScaleOutError, attention.AttentionError, FamilyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.max_model_len < PAGE_PROMPT_TOKENS + MAX_OUTPUT_TOKENS:
        print(f"warning: --max-model-len {args.max_model_len} leaves ~{args.max_model_len - PAGE_PROMPT_TOKENS} "
              f"output tokens for a full page; dense pages need up to {MAX_OUTPUT_TOKENS}", file=sys.stderr)
    for warning in decision.warnings:
        print(warning, file=sys.stderr)
    if looks_like_path(args.model) and (Path(os.path.expanduser(args.model)) / "random_weights.json").exists():
        print("note: this is a generated random-weight checkpoint: it answers with random text. "
              "Real OCR needs the real weights (lightonai/LightOnOCR-2-1B).", file=sys.stderr)
    command, env = build_command(args, passthrough, device, plan, attention_choice, tuned)
    print(f"[start_vllm_server] model family: {family.describe(args.max_model_len)}", flush=True)
    if device == "cuda":
        print(f"[start_vllm_server] {plan.describe()}", flush=True)
        print(f"[start_vllm_server] attention: {attention_choice.reason}", flush=True)
        for note in tuned.notes:
            print(f"[start_vllm_server] {note}", flush=True)
    print(f"[start_vllm_server] {device} backend: {redact(command, env, bool(api_key_from_env()))}", flush=True)
    if args.dry_run:
        return 0
    os.execve(command[0], command, {**os.environ, **env})
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""GPU check: vLLM 0.26's top-p sampler against FlashInfer's, on the bundle's sampling settings.

    PYTHONPATH=/root/site:/root/site-flashinfer python3 benchmarks/sampler_check.py --out sampler.json

The two paths vLLM's model runner (V2) takes for a batch whose requests all use top_p and
a temperature, called through vLLM's own functions:
- vllm: `apply_top_k_top_p` (a full-vocabulary sort below 8 rows, a Triton kernel from 8)
  then `gumbel_sample` (VLLM_USE_FLASHINFER_SAMPLER=0, what the bundle has run so far);
- flashinfer: `flashinfer_sample`, rejection sampling without a sort
  (VLLM_USE_FLASHINFER_SAMPLER=1).
The first FlashInfer call builds its kernels with nvcc; that time is reported on its own.
Per call and batch size: GPU time (CUDA events around many back-to-back calls) and host
time (launching the same calls without waiting), the part that stalls the GPU when a
lone page decodes and the host, not the GPU, sets the pace.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

VOCAB = 151_936          # LightOnOCR-2-1B's vocabulary (Qwen3)
TEMPERATURE, TOP_P = 0.2, 0.9   # the bundle's sampling defaults


def timings(fn, calls: int) -> dict:
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_start = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host_s = time.perf_counter() - host_start
    torch.cuda.synchronize()
    return {"gpu_ms": start.elapsed_time(end) / calls, "host_ms": host_s * 1000 / calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p, flashinfer_sample
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    result: dict = {"vocab": VOCAB, "temperature": TEMPERATURE, "top_p": TOP_P, "rows": []}
    torch.manual_seed(0)
    probe = torch.randn(1, VOCAB, device="cuda", dtype=torch.bfloat16) / TEMPERATURE
    started = time.perf_counter()
    flashinfer_sample(probe.clone(), None, torch.full((1,), TOP_P, device="cuda"))
    torch.cuda.synchronize()
    result["flashinfer_first_call_s"] = time.perf_counter() - started  # includes the JIT build
    print(f"FlashInfer's first call (builds its kernels): {result['flashinfer_first_call_s']:.1f} s", flush=True)

    for batch in (int(b) for b in args.batches.split(",")):
        # Logits already divided by the temperature, as vLLM hands them to top-p.
        logits = torch.randn(batch, VOCAB, device="cuda", dtype=torch.bfloat16) / TEMPERATURE
        top_p = torch.full((batch,), TOP_P, device="cuda")
        rows = torch.arange(batch, device="cuda", dtype=torch.int32)
        temperature = torch.full((batch,), TEMPERATURE, device="cuda")
        seeds = torch.randint(0, 2**31, (batch,), device="cuda", dtype=torch.int64)
        positions = torch.full((batch,), 2500, device="cuda", dtype=torch.int64)

        def vllm_path():
            masked = apply_top_k_top_p(logits.clone(), None, top_p)
            return gumbel_sample(masked, rows, temperature, seeds, positions, apply_temperature=False)

        def flashinfer_path():
            return flashinfer_sample(logits.clone(), None, top_p)

        row = {"batch": batch, "vllm": timings(vllm_path, args.calls),
               "flashinfer": timings(flashinfer_path, args.calls)}
        result["rows"].append(row)
        print(f"batch {batch:4d}: vLLM sort/Triton + Gumbel {row['vllm']['gpu_ms']:.3f} ms GPU, "
              f"{row['vllm']['host_ms']:.3f} ms host | FlashInfer {row['flashinfer']['gpu_ms']:.3f} ms GPU, "
              f"{row['flashinfer']['host_ms']:.3f} ms host", flush=True)

    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

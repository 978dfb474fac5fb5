#!/usr/bin/env python3
"""GPU check of ocr_bundle.serve.vllm_patches: packed vs dense-mask Pixtral encoder attention.

    python3 benchmarks/encoder_check.py --model /root/models/lightonocr-full --out encoder-check.json

Loads the checkpoint in vLLM (in this process, eager mode), then on the model's own
vision encoder:
- parity: a page-sized and a smaller image encoded together by both paths; per-image
  outputs must agree to bf16 rounding, and the packed path must give the page the same
  features whether or not another image shares the batch (images stay isolated);
- speed and peak memory of both paths for 1-4 page-sized images per call (one engine
  step encodes several pages when several requests arrive together);
- with --compile, what torch.compile (Inductor) buys the packed encoder's transformer
  stack on one page, compiled as the server does with OCR_BUNDLE_COMPILE_ENCODER=1 (vLLM
  0.26 compiles only the decoder for this model: Pixtral's encoder does not opt in to
  `compile_mm_encoder`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The engine in this process, so apply_model hands back the live model.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from ocr_bundle.serve import vllm_patches  # noqa: E402

# A 1089x1540 A4 page as vLLM's processor feeds it: 110 x 78 patches of 14 px.
PAGE = (1540, 1092)
SMALL = (700, 980)


def relative_error(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median seconds per call and peak extra GiB allocated."""
    import torch

    fn()  # warm-up (kernel selection, allocator)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**30


def compiled_transformer_timing(tower, page, small, eager_out, repeats: int) -> dict:
    """The packed encoder on one page with its transformer stack compiled the way the server
    compiles it with OCR_BUNDLE_COMPILE_ENCODER=1 (vllm_patches.CompiledOrEager: dynamic
    shapes, the attention op's fake kernel corrected first).

    Only the 24 layers are compiled: the sequence lengths the packed patch builds before them
    go through vLLM's `async_tensor_h2d`, whose `pin_memory()` Dynamo cannot trace (compiling
    the whole tower failed there on vLLM 0.26.0, 2026-11-30 FlashInfer-sampler run). A second image size then
    shows whether a new patch count compiles again (its first call would take seconds).
    """
    import torch

    fake_kernel = vllm_patches.give_flash_attn_fake_the_kernels_layout()
    print(f"fake kernel of vllm::flash_attn_maxseqlen_wrapper: {fake_kernel}", flush=True)
    eager_transformer = tower.transformer
    eager_s, _ = timed(lambda: tower([page]), repeats)
    compiled = vllm_patches.CompiledOrEager(eager_transformer, "encoder_check")
    # Not a module, so past nn.Module's __setattr__: the instance attribute shadows the child.
    object.__setattr__(tower, "transformer", compiled)
    try:
        started = time.perf_counter()
        compiled_out = tower([page])[0]
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - started
        started = time.perf_counter()
        tower([small])
        torch.cuda.synchronize()
        other_size_first_call_s = time.perf_counter() - started
        compiled_s, _ = timed(lambda: tower([page]), repeats)
    finally:
        del tower.__dict__["transformer"]
    return {"fake_kernel": fake_kernel, "state": compiled.state, "first_call_s": first_call_s,
            "other_size_first_call_s": other_size_first_call_s, "eager_s": eager_s, "compiled_s": compiled_s,
            "speedup": eager_s / compiled_s, "relative_error_vs_eager": relative_error(compiled_out, eager_out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-images", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compile", action="store_true", help="also time the packed encoder under torch.compile")
    args = parser.parse_args()

    status = vllm_patches.apply()
    print("patch:", status, flush=True)
    if not status.startswith("applied"):
        print("nothing to compare: this vLLM does not need the patch", file=sys.stderr)
        return 1

    import torch
    from vllm import LLM
    from vllm.model_executor.models.pixtral import PixtralHFVisionModel

    llm = LLM(model=args.model, enforce_eager=True, gpu_memory_utilization=0.3, max_model_len=8192,
              limit_mm_per_prompt={"image": 1}, mm_processor_cache_gb=0, enable_prefix_caching=False)
    model = llm.apply_model(lambda m: m)[0]
    tower = next(m for m in model.modules() if isinstance(m, PixtralHFVisionModel))
    backend = str(tower.transformer.layers[0].attention.packed_attn.attn_backend)
    print("encoder attention backend:", backend, flush=True)

    torch.manual_seed(0)
    page = torch.randn(3, *PAGE, device="cuda")
    small = torch.randn(3, *SMALL, device="cuda")
    result: dict = {"patch": status, "backend": backend, "page_pixels": PAGE, "small_pixels": SMALL}
    with torch.inference_mode():
        packed = tower([page, small])
        dense = tower.dense_mask_forward([page, small])
        alone = tower([page])[0]
        result["parity"] = {
            "page_relative_error": relative_error(packed[0], dense[0]),
            "small_relative_error": relative_error(packed[1], dense[1]),
            "page_max_abs_diff": float((packed[0].float() - dense[0].float()).abs().max()),
            "page_alone_vs_batched_relative_error": relative_error(alone, packed[0]),
            "tokens": [int(packed[0].shape[0]), int(packed[1].shape[0])],
        }
        print("parity:", json.dumps(result["parity"]), flush=True)

        rows = []
        for count in range(1, args.max_images + 1):
            pages = [page] * count
            packed_s, packed_gib = timed(lambda: tower(pages), args.repeats)
            dense_s, dense_gib = timed(lambda: tower.dense_mask_forward(pages), args.repeats)
            rows.append({"images": count, "packed_s": packed_s, "dense_s": dense_s,
                         "speedup": dense_s / packed_s, "packed_peak_gib": packed_gib, "dense_peak_gib": dense_gib})
            print(f"{count} page(s): packed {packed_s * 1000:.1f} ms ({packed_gib:.2f} GiB), "
                  f"dense mask {dense_s * 1000:.1f} ms ({dense_gib:.2f} GiB), {dense_s / packed_s:.1f}x", flush=True)
        result["timing"] = rows

        if args.compile:
            result["compile"] = compiled_transformer_timing(tower, page, small, alone, args.repeats * 4)
            print("torch.compile, one page:", json.dumps(result["compile"]), flush=True)

    args.out.write_text(json.dumps(result, indent=2))
    parity = result["parity"]
    ok = max(parity["page_relative_error"], parity["small_relative_error"],
             parity["page_alone_vs_batched_relative_error"]) < 0.02
    print("parity", "OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

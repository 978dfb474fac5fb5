#!/usr/bin/env python3
"""The article's baseline: plain transformers `generate`, one page at a time (batch 1).

    python benchmarks/transformers_baseline.py --model models/lightonocr-full --image samples/english_a4_document.png \
        --pages 3 --max-new-tokens 1000 --out reports/hf-baseline.json

Same page, same forced output length (min_new_tokens = max_new_tokens) as the vLLM runs
with --ignore-eos, so the two are comparable as ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ocr_bundle.images import decode_data_url, prepare_image_bytes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint folder")
    parser.add_argument("--image", type=Path, required=True, help="page image")
    parser.add_argument("--pages", type=int, default=3, help="measured pages (default 3)")
    parser.add_argument("--max-new-tokens", type=int, default=1000, help="forced output tokens per page")
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    args = parser.parse_args()

    import torch
    from transformers import AutoProcessor, LightOnOcrForConditionalGeneration

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LightOnOcrForConditionalGeneration.from_pretrained(args.model, dtype=torch.bfloat16).to(device).eval()
    processor = AutoProcessor.from_pretrained(args.model)
    # The same prepared page the bundle sends (1540 px longest edge, PNG).
    prepared = prepare_image_bytes(args.image.read_bytes())
    image = decode_data_url(prepared.data_url).convert("RGB")
    messages = [{"role": "user", "content": [{"type": "image"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def one_page(new_tokens: int) -> tuple[float, int, int]:
        start = time.perf_counter()
        inputs = processor(text=prompt, images=[image], return_tensors="pt").to(device)
        inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                                    temperature=0.2, top_p=0.9)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, inputs["input_ids"].shape[1], output.shape[1] - inputs["input_ids"].shape[1]

    one_page(8)  # warm-up (kernels, allocator)
    runs = [one_page(args.max_new_tokens) for _ in range(args.pages)]
    seconds = [r[0] for r in runs]
    result = {
        "engine": "transformers generate, batch 1",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "pages": args.pages,
        "prompt_tokens": runs[0][1],
        "output_tokens_per_page": runs[0][2],
        "seconds_per_page": sum(seconds) / len(seconds),
        "pages_per_s": len(seconds) / sum(seconds),
        "ms_per_output_token": 1000 * sum(seconds) / sum(r[2] for r in runs),
        "runs_s": seconds,
        "peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

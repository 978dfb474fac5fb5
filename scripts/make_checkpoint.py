#!/usr/bin/env python3
"""Write a random-weight checkpoint with LightOnOCR-2-1B's exact layout.

No machine here can reach the model hub, yet every moving part of the bundle (vLLM's
model loader, the Pixtral processor, the chat template, the tokenizer) should run for
real. This script builds the same architecture with random weights:

    python scripts/make_checkpoint.py --preset tiny --out models/lightonocr-tiny   # CPU tests
    python scripts/make_checkpoint.py --preset full --out models/lightonocr-full   # GPU benchmarks

The layout matches the published checkpoint: config.json with model_type "mistral3" and
architectures ["LightOnOCRForConditionalGeneration"], a qwen3 text_config and a pixtral
vision_config; PixtralProcessor files; a Qwen-style chat template; safetensors weights
named model.vision_encoder.* / model.vision_projection.* / model.language_model.* as
transformers' LightOnOcrForConditionalGeneration.save_pretrained writes them.

Random weights emit random tokens: real OCR text needs the real weights.
The output is deterministic for a given preset and seed.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path

# Qwen's special tokens sit this far below the end of the vocabulary (151936 - 151643).
SPECIAL_TOKEN_OFFSETS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<|vision_start|>": 9,
    "<|vision_end|>": 10,
    "<|vision_pad|>": 11,
    "<|image_pad|>": 12,
}
SPECIAL_BLOCK = 293
RANDOM_WEIGHTS_MARKER = "random_weights.json"
IMAGE_TOKEN, IMAGE_BREAK_TOKEN, IMAGE_END_TOKEN = "<|image_pad|>", "<|vision_pad|>", "<|vision_end|>"
IMAGE_MEAN, IMAGE_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]  # the processor's

# The page image is the whole prompt (the model repeats text prompts, so none is sent).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}" + IMAGE_TOKEN +
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Preset:
    vocab_size: int
    text_hidden: int
    text_intermediate: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_head_dim: int
    vision_hidden: int
    vision_intermediate: int
    vision_layers: int
    vision_heads: int
    vision_head_dim: int
    max_position_embeddings: int
    dtype: str


PRESETS = {
    # The published model's dimensions (~1.0B parameters).
    "full": Preset(
        vocab_size=151936, text_hidden=1024, text_intermediate=3072, text_layers=28,
        text_heads=16, text_kv_heads=8, text_head_dim=128,
        vision_hidden=1024, vision_intermediate=4096, vision_layers=24, vision_heads=16,
        vision_head_dim=64, max_position_embeddings=40960, dtype="bfloat16",
    ),
    # Smallest that vLLM's CPU attention accepts (head_dim 16 fails there; 64 works).
    "tiny": Preset(
        vocab_size=2048, text_hidden=128, text_intermediate=256, text_layers=2,
        text_heads=2, text_kv_heads=1, text_head_dim=64,
        vision_hidden=64, vision_intermediate=128, vision_layers=2, vision_heads=2,
        vision_head_dim=32, max_position_embeddings=40960, dtype="bfloat16",
    ),
}


def special_token_ids(vocab_size: int) -> dict[str, int]:
    base = vocab_size - SPECIAL_BLOCK
    return {token: base + offset for token, offset in SPECIAL_TOKEN_OFFSETS.items()}


def build_config_dict(preset: Preset, ids: dict[str, int] | None = None) -> dict:
    """config.json as the published checkpoint has it (Mistral3 wrapper, qwen3 + pixtral).

    `ids`: the special tokens' ids (default: Qwen's places at the end of the vocabulary).
    """
    ids = ids or special_token_ids(preset.vocab_size)
    text_config = {
        "model_type": "qwen3",
        "vocab_size": preset.vocab_size,
        "hidden_size": preset.text_hidden,
        "intermediate_size": preset.text_intermediate,
        "num_hidden_layers": preset.text_layers,
        "num_attention_heads": preset.text_heads,
        "num_key_value_heads": preset.text_kv_heads,
        "head_dim": preset.text_head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": preset.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": preset.dtype,
    }
    vision_config = {
        "model_type": "pixtral",
        "hidden_size": preset.vision_hidden,
        "intermediate_size": preset.vision_intermediate,
        "num_hidden_layers": preset.vision_layers,
        "num_attention_heads": preset.vision_heads,
        "head_dim": preset.vision_head_dim,
        "num_channels": 3,
        "image_size": 1540,
        "patch_size": 14,
        "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }
    return {
        "architectures": ["LightOnOCRForConditionalGeneration"],
        "model_type": "mistral3",
        "image_token_id": ids[IMAGE_TOKEN],
        "spatial_merge_size": 2,
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "tie_word_embeddings": True,
        "dtype": preset.dtype,
        "text_config": text_config,
        "vision_config": vision_config,
    }


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer covering every id the model can sample (random weights)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    ids = special_token_ids(vocab_size)
    words = ["user", "assistant", "system", "\n"]
    vocab: dict[str, int] = {}
    special_by_id = {i: t for t, i in ids.items()}
    filler = 0
    for index in range(vocab_size):
        if index in special_by_id:
            vocab[special_by_id[index]] = index
        elif words:
            vocab[words.pop(0)] = index
        else:
            vocab[f"w{filler}"] = index
            filler += 1
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(pattern="\n", behavior="isolated"), pre_tokenizers.WhitespaceSplit()]
    )
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return fast_tokenizer(backend, unk_token="<|endoftext|>")


def fast_tokenizer(backend, **extra):
    """transformers' tokenizer around a `tokenizers` backend, with the special tokens the chat
    template and the Pixtral processor use (added to the backend here)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKEN_OFFSETS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": IMAGE_TOKEN,
            "image_break_token": IMAGE_BREAK_TOKEN,
            "image_end_token": IMAGE_END_TOKEN,
        },
        model_max_length=PRESETS["full"].max_position_embeddings,
        **extra,
    )


def build_processor(tokenizer):
    from transformers import PixtralImageProcessor, PixtralProcessor

    image_processor = PixtralImageProcessor(
        size={"longest_edge": 1540},
        patch_size=14,
        do_resize=True,
        do_rescale=True,
        do_normalize=True,
        image_mean=IMAGE_MEAN,
        image_std=IMAGE_STD,
    )
    return PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        spatial_merge_size=2,
        image_token=IMAGE_TOKEN,
        image_break_token=IMAGE_BREAK_TOKEN,
        image_end_token=IMAGE_END_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )


def count_parameters(model) -> int:
    # model.parameters() yields a tied tensor once: the embedding is counted once.
    return sum(p.numel() for p in model.parameters())


def build_hf_config(preset: Preset):
    """transformers' LightOnOcrConfig for the preset (used to build the weights)."""
    return hf_config_from(build_config_dict(preset))


def hf_config_from(config_dict: dict):
    """transformers' LightOnOcrConfig for a config.json in the published layout."""
    from transformers import LightOnOcrConfig

    # Deep copies: transformers 5.19 renames the vision rope_type "default" to "axial" inside the dict it is
    # given, and the caller writes config_dict as config.json next; transformers 5.16 (vLLM 0.26.0's) refuses
    # "axial" ("PixtralRotaryEmbedding does not support non-default RoPE"). The published layout says "default".
    return LightOnOcrConfig(
        text_config=copy.deepcopy(config_dict["text_config"]),
        vision_config=copy.deepcopy(config_dict["vision_config"]),
        image_token_id=config_dict["image_token_id"],
        spatial_merge_size=config_dict["spatial_merge_size"],
        tie_word_embeddings=True,
    )


def parameter_count(preset_name: str) -> int:
    """Parameters of a preset without allocating them (meta device)."""
    import torch
    from transformers import LightOnOcrForConditionalGeneration

    with torch.device("meta"):
        return count_parameters(LightOnOcrForConditionalGeneration(build_hf_config(PRESETS[preset_name])))


def save_checkpoint(model, out: Path, config_dict: dict, processor) -> None:
    """Weights, config.json in the published layout, generation settings, processor files."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    # Replace transformers' config with the published layout (model_type "mistral3" etc.).
    (out / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config_dict["text_config"]["bos_token_id"],
        "eos_token_id": config_dict["text_config"]["eos_token_id"],
        "pad_token_id": config_dict["text_config"]["pad_token_id"],
        "temperature": 0.2, "top_p": 0.9, "do_sample": True,
    }, indent=2) + "\n")
    processor.save_pretrained(out)


def write_checkpoint(preset_name: str, out: Path, seed: int = 0) -> int:
    """Write the checkpoint to `out`; returns the parameter count."""
    import torch
    from transformers import LightOnOcrForConditionalGeneration

    preset = PRESETS[preset_name]
    config_dict = build_config_dict(preset)
    torch.manual_seed(seed)
    model = LightOnOcrForConditionalGeneration(build_hf_config(preset)).to(getattr(torch, preset.dtype))
    model.eval()
    n_params = count_parameters(model)

    save_checkpoint(model, out, config_dict, build_processor(build_tokenizer(preset.vocab_size)))
    # The marker the launcher and start_optimized.sh look for to say "random text ahead".
    (out / RANDOM_WEIGHTS_MARKER).write_text(json.dumps({"preset": preset_name, "seed": seed,
                                                          "parameters": n_params}) + "\n")
    (out / "README.md").write_text(
        f"Random-weight LightOnOCR-2-1B-layout checkpoint, preset '{preset_name}', seed {seed}, "
        f"{n_params:,} parameters.\nWritten by scripts/make_checkpoint.py. It emits random "
        "tokens: real OCR needs the real weights (lightonai/LightOnOCR-2-1B).\n"
    )
    return n_params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="tiny: ~1M params for CPU tests; full: the real dims (~1.0B) for GPU benchmarks")
    parser.add_argument("--out", type=Path, required=True, help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")
    parser.add_argument("--force", action="store_true", help="overwrite a folder that already holds a checkpoint")
    args = parser.parse_args(argv)
    if (args.out / "config.json").exists() and not args.force:
        print(f"{args.out} already holds a checkpoint (use --force to rewrite it)", file=sys.stderr)
        return 0
    n_params = write_checkpoint(args.preset, args.out, args.seed)
    print(f"wrote {args.preset} checkpoint to {args.out}: {n_params:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())

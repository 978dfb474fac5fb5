#!/usr/bin/env python3
"""Train a tiny LightOnOCR that really reads rendered text lines: the test suite's reader.

Random weights prove that the engine runs, never that the right words come out. This script
trains a small checkpoint of the exact LightOnOCR layout (Pixtral vision encoder, Qwen3
decoder, the generator's config keys, chat template and processor settings, served by vLLM
unchanged) on synthetic lines rendered with Pillow's built-in scalable font:

    python scripts/train_reader.py --out tests/fixtures/lightonocr-reader      # 14 min (826 s) on 2 CPU cores
    python scripts/train_reader.py --out /tmp/reader --device cuda               # faster on a GPU

What it reads: `render_line(text)` — up to 16 characters (words, digits, punctuation) drawn
one per 28-px cell on a 448 x 28 canvas, i.e. one character per image token. Training adds
four font sizes, ink and paper shades, small shifts and turns, blur and noise. It is a test
fixture, not an OCR model: other layouts of text are beyond it.

Seeded: the data, the weights and the tokenizer follow --seed (bit-identical weights also
need the same torch build and device). The tokenizer is its own: a byte-level BPE trained on
the synthetic lines, with no merges at its default size (263 tokens: 256 bytes + 7 special),
so that each output token is one character. The held-out character error rate (greedy
decoding with transformers, bf16) goes into reader.json; the tests measure it again through vLLM.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
import sys
import time
from dataclasses import replace
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_checkpoint as generator  # noqa: E402  (one source for the layout, template and processor)

READER_MARKER = "reader.json"
SPECIAL_TOKENS = list(generator.SPECIAL_TOKEN_OFFSETS)  # ids 0..6 in the reader's tokenizer
PROMPT = f"<|im_start|>user\n{generator.IMAGE_TOKEN}<|im_end|>\n<|im_start|>assistant\n"  # the chat template's output

# Small enough to serve fast on a CPU, large enough to read: ~1M parameters, ~2 MB in bf16.
# vLLM's CPU attention wants a text head_dim of 64 (see make_checkpoint.PRESETS["tiny"]).
READER = replace(
    generator.PRESETS["tiny"],
    vocab_size=0,  # set from the trained tokenizer
    text_hidden=128, text_intermediate=384, text_layers=3, text_heads=2, text_kv_heads=1, text_head_dim=64,
    vision_hidden=96, vision_intermediate=192, vision_layers=3, vision_heads=3, vision_head_dim=32,
)

WORDS = (
    "page total invoice date amount name address city street number order item price tax net "
    "report table figure section chapter summary result value account bank paid due balance "
    "the of and to in for on with by from at as is are was this that not or we you it all new "
    "one two three four five six seven eight nine ten first last next north south east west "
    "January February March April May June July August September October November December "
    "Paris London Berlin Madrid Rome Lyon Oslo Tokyo Monday Friday OCR PDF USA EUR USD Ltd Inc"
).split()
PUNCTUATION = ".,:;-'()!?/&%#+="
FONT_SIZES = (15, 17, 19, 21)
# Every line is drawn on the same canvas, one character per 28-px cell: 28 px is what one image
# token covers (14-px patches, merged 2 x 2), so output token j reads image token j. A model
# this small learns that alignment in minutes on a CPU. Proportional text was tried first and did
# not learn to look at the image within ~15 minutes per try; those tries also trained in bfloat16
# and without the per-cell loss below (both fixed since), so it may well train now, given time.
CELL = 28
MAX_LINE_CHARS = 16
CANVAS = (CELL * MAX_LINE_CHARS, CELL)  # 448 x 28 px: 16 image tokens in one row


def random_word(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.45:
        word = rng.choice(WORDS)
        return word.upper() if rng.random() < 0.08 else word.capitalize() if rng.random() < 0.2 else word
    if kind < 0.65:  # numbers, amounts, dates
        return rng.choice((str(rng.randint(0, 999)), str(rng.randint(1000, 99999)),
                           f"{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}",
                           f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2030)}"))
    if kind < 0.8:  # a word with punctuation around it
        word = rng.choice(WORDS)
        return rng.choice(("(", "", "", "'")) + word + rng.choice((".", ",", ":", ";", ")", "!", "?", "%"))
    # random letters: the reader must read glyphs, not guess words
    alphabet = string.ascii_letters + string.digits + PUNCTUATION
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))


def random_line(rng: random.Random, max_chars: int = MAX_LINE_CHARS) -> str:
    words: list[str] = []
    target = rng.randint(min(3, max_chars), max_chars)
    while len(" ".join(words)) < target:
        words.append(random_word(rng))
    line = " ".join(words)[:target].strip()
    return line or "page"


def curriculum(step: int, steps: int) -> int:
    """Longest line at this step: a few characters first, so that the only way to lower the
    loss is to look at the image (a language model alone cannot guess random glyphs); full
    lines from a third of the way on."""
    return min(MAX_LINE_CHARS, 2 + (MAX_LINE_CHARS - 2) * step // max(1, steps // 3))


def render_line(text: str, rng: random.Random | None = None, font_size: int = 19) -> Image.Image:
    """The line in Pillow's scalable font, dark on light, one character per cell of the canvas;
    `rng` adds the training variation (size, ink, paper, a small shift and turn, blur, noise)."""
    if len(text) > MAX_LINE_CHARS:
        raise ValueError(f"the reader reads lines of up to {MAX_LINE_CHARS} characters: {text!r}")
    if rng is not None:
        font_size = rng.choice(FONT_SIZES)
    font = ImageFont.load_default(size=font_size)
    paper, ink = (rng.randint(215, 255), rng.randint(0, 70)) if rng else (255, 0)
    shift_x, shift_y = (rng.randint(-3, 3), rng.randint(-2, 2)) if rng else (0, 0)
    image = Image.new("L", CANVAS, paper)
    draw = ImageDraw.Draw(image)
    for index, char in enumerate(text):
        # centred in its cell on the font's own baseline (ascender to descender)
        draw.text((index * CELL + CELL / 2 + shift_x, CELL / 2 + shift_y), char, font=font, fill=ink, anchor="mm")
    if rng is not None:
        if rng.random() < 0.5:
            image = image.rotate(rng.uniform(-1.0, 1.0), resample=Image.BILINEAR, fillcolor=paper)
        if rng.random() < 0.3:
            image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.7)))
        if rng.random() < 0.5:
            noise = Image.effect_noise(image.size, rng.uniform(5, 25))
            image = Image.blend(image, noise, rng.uniform(0.05, 0.15))
    return image.convert("RGB")


def build_tokenizer(rng_seed: int, vocab_size: int = 256 + len(SPECIAL_TOKENS)):
    """A byte-level BPE learned from synthetic lines; special tokens take ids 0..6. At its default
    size it has no merges: one token per character, as the reader's one cell per character wants."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(rng_seed)
    corpus = [random_line(rng) for _ in range(20000)] + ["user", "assistant", "system"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(corpus, trainer)
    return generator.fast_tokenizer(backend)


def reader_config(tokenizer) -> tuple[dict, object]:
    """config.json (the published layout) and transformers' config, with the tokenizer's ids."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config_dict = generator.build_config_dict(replace(READER, vocab_size=len(tokenizer)), ids)
    return config_dict, generator.hf_config_from(config_dict)


def encode(processor, image: Image.Image, text: str | None):
    """input_ids, labels (answer only) and pixel values of one example, as the server builds them."""
    import torch

    batch = processor(text=PROMPT, images=[image], return_tensors="pt")
    # vLLM's LightOnOCR processor drops the image-break and image-end tokens that the Pixtral
    # processor inserts (LightOnOCR was trained without them): the reader learns the prompt vLLM sends.
    prompt_ids = batch["input_ids"][0]
    dropped = processor.tokenizer.convert_tokens_to_ids([generator.IMAGE_BREAK_TOKEN, generator.IMAGE_END_TOKEN])
    prompt_ids = prompt_ids[~torch.isin(prompt_ids, torch.tensor(dropped))]
    answer = torch.tensor(processor.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]) \
        if text is not None else torch.tensor([], dtype=torch.long)
    input_ids = torch.cat([prompt_ids, answer])
    labels = torch.cat([torch.full_like(prompt_ids, -100), answer])
    return input_ids, labels, batch["pixel_values"][0], batch["image_sizes"][0]


def cell_targets(tokenizer, text: str, space: int):
    """The token each of the canvas's cells shows: the line's characters, then blank (space)."""
    import torch

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text), "one token per character"
    return torch.tensor(ids + [space] * (MAX_LINE_CHARS - len(ids)))


def collate(examples, pad_id: int):
    import torch

    longest = max(len(ids) for ids, *_ in examples)
    input_ids = torch.full((len(examples), longest), pad_id)
    labels = torch.full((len(examples), longest), -100)
    attention = torch.zeros((len(examples), longest), dtype=torch.long)
    height = max(p.shape[1] for _, _, p, _ in examples)
    width = max(p.shape[2] for _, _, p, _ in examples)
    pixels = torch.zeros((len(examples), 3, height, width))
    for row, (ids, answer, pixel, _) in enumerate(examples):
        input_ids[row, :len(ids)] = ids
        labels[row, :len(ids)] = answer
        attention[row, :len(ids)] = 1
        pixels[row, :, :pixel.shape[1], :pixel.shape[2]] = pixel
    sizes = torch.stack([size for *_, size in examples])
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention,
            "pixel_values": pixels, "image_sizes": sizes}


def character_error_rate(predictions: list[str], references: list[str]) -> float:
    """Levenshtein distance over characters, summed, over the references' total length."""
    def distance(a: str, b: str) -> int:
        previous = list(range(len(b) + 1))
        for i, char_a in enumerate(a, 1):
            current = [i]
            for j, char_b in enumerate(b, 1):
                current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
            previous = current
        return previous[-1]
    return sum(distance(p, r) for p, r in zip(predictions, references)) / max(1, sum(len(r) for r in references))


def held_out_lines(count: int, seed: int = 12345) -> list[str]:
    rng = random.Random(seed)
    return [random_line(rng) for _ in range(count)]


def greedy_read(model, processor, images: list[Image.Image], max_new_tokens: int = 40) -> list[str]:
    import torch

    texts = []
    with torch.no_grad():
        for image in images:
            input_ids, _, pixels, size = encode(processor, image, None)
            output = model.generate(input_ids=input_ids[None], pixel_values=pixels[None].to(model.dtype),
                                    image_sizes=size[None], max_new_tokens=max_new_tokens, do_sample=False,
                                    eos_token_id=processor.tokenizer.eos_token_id,
                                    pad_token_id=processor.tokenizer.pad_token_id)
            texts.append(processor.tokenizer.decode(output[0, len(input_ids):], skip_special_tokens=True))
    return texts


def train(out: Path, steps: int, batch_size: int, seed: int, device: str, lr: float, eval_lines: int) -> dict:
    import torch
    from transformers import LightOnOcrForConditionalGeneration

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer(seed)
    processor = generator.build_processor(tokenizer)
    config_dict, hf_config = reader_config(tokenizer)
    # float32 to train: the text config says bfloat16 (as served), and AdamW steps in bfloat16
    # round away; the checkpoint is written in bfloat16 like the generator's.
    model = LightOnOcrForConditionalGeneration(hf_config).float().to(device)
    parameters = generator.count_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)))
    # Trained through the decoder alone, the vision tower collapses: while the decoder still guesses
    # from its own text, every image's gradient points the same way, the features become one
    # vector for all images, and the decoder never learns to look (measured: the loss stays at
    # what the words alone predict). So each image token also learns, through the tied LM head,
    # which character sits in its cell (one cell per token): the features become the characters'
    # embeddings, and the decoder only has to copy token j to output j. Training-only: the saved
    # model is the plain architecture.
    space = tokenizer.convert_tokens_to_ids("Ġ")
    print(f"reader: {parameters:,} parameters, vocabulary {len(tokenizer)}, {steps} steps of {batch_size}", flush=True)
    started = time.monotonic()
    model.train()
    for step in range(1, steps + 1):
        examples, cells = [], []
        for _ in range(batch_size):
            text = random_line(rng, curriculum(step, steps))
            examples.append(encode(processor, render_line(text, rng), text))
            cells.append(cell_targets(tokenizer, text, space))
        batch = {k: v.to(device) for k, v in collate(examples, tokenizer.pad_token_id).items()}
        image = model.model.get_image_features(pixel_values=batch.pop("pixel_values"),
                                               image_sizes=batch.pop("image_sizes"), return_dict=True)
        reading = model(**batch, mm_encoder_outputs={"image": image}).loss
        per_cell = model.lm_head(torch.cat(image.pooler_output))
        looking = torch.nn.functional.cross_entropy(per_cell, torch.cat(cells).to(device))
        loss = reading + looking
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == 1:
            print(f"step {step}/{steps} reading {reading.item():.4f} per-cell {looking.item():.4f} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    train_seconds = time.monotonic() - started

    model.eval()
    lines = held_out_lines(eval_lines)
    predictions = greedy_read(model.to(torch.bfloat16), processor, [render_line(t) for t in lines])
    cer = character_error_rate(predictions, lines)
    print(f"held-out CER (bf16, greedy, {len(lines)} lines): {cer:.2%}", flush=True)
    for reference, prediction in list(zip(lines, predictions))[:5]:
        print(f"  {reference!r} -> {prediction!r}")

    generator.save_checkpoint(model.to("cpu"), out, config_dict, processor)
    summary = {"parameters": parameters, "vocabulary": len(tokenizer), "steps": steps, "batch_size": batch_size,
               "seed": seed, "device": device, "lr": lr, "train_seconds": round(train_seconds),
               "held_out_lines": len(lines), "held_out_cer": round(cer, 4),
               "command": "python scripts/train_reader.py " + " ".join(sys.argv[1:])}
    (out / READER_MARKER).write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(
        f"A tiny LightOnOCR-layout reader ({parameters:,} parameters) trained on synthetic text lines rendered "
        f"with Pillow's built-in font; held-out CER {cer:.2%}.\nWritten by `{summary['command']}` "
        f"in {train_seconds:.0f} s on {device}. A test fixture, not an OCR model: it reads single printed lines.\n")
    return summary


def training_parser(doc: str, steps: int, batch_size: int, examples: str) -> argparse.ArgumentParser:
    """The flags every trainer of a test fixture has (this one and train_grounding.py)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the checkpoint into")
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps (default {steps})")
    parser.add_argument("--batch-size", type=int, default=batch_size,
                        help=f"{examples} per step (default {batch_size})")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the data, the weights and the tokenizer")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    return parser


def parse_training_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> int:
    parser = training_parser(__doc__, steps=3000, batch_size=32, examples="lines")
    parser.add_argument("--eval-lines", type=int, default=200, help="held-out lines for the CER (default 200)")
    args = parse_training_args(parser, argv)
    summary = train(args.out, args.steps, args.batch_size, args.seed, args.device, args.lr, args.eval_lines)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

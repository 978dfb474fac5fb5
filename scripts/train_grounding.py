#!/usr/bin/env python3
"""Train a tiny LightOnOCR-3 that answers grounding requests: the test suite's grounding fixture.

LightOnOCR-3 asked for grounding (a text part "grounding" after the page image) answers one
`![label](x1,y1,x2,y2) text` line per layout block, the box on a 0–1000 grid of the page. This
script trains a small checkpoint of the exact LightOnOCR layout (Pixtral encoder, Qwen3 decoder,
served by vLLM unchanged) to do that on generated pages, so that tests can check labels, boxes
and words through the real server, the converter and the page:

    python scripts/train_grounding.py --out tests/fixtures/lightonocr-3-1b-grounding --device cuda \
        --workers 12 --steps 2284       # the fixture: 380 s on one H200 (grounding.json)
    python scripts/train_grounding.py --out /tmp/grounding     # CPU: hours

The folder's name carries "LightOnOCR-3-1B" on purpose: clients tell a grounding model by the
checkpoint the server loaded (ocr_bundle/families.py), as they would for the real one.

What it reads: `render_page(blocks)` — a 224 x 224 page cut into an 8 x 8 grid of 28-px cells (one
image token each: 14-px patches merged 2 x 2), holding 1–4 blocks on whole cells: a title (large
bold letters), lines of text, an image (a picture across 2–3 rows) and a page number (small digits
in the last row), one character per cell, top to bottom. Boxes therefore fall on multiples of 125.
Training adds ink and paper shades, small shifts, blur and noise. A test fixture, not an OCR model.

How a model this small learns it: besides the answer, training-only heads (not saved) teach the
image features what each cell holds (its character, its block's label, whether it opens or closes
the block) and teach the decoder's hidden states where each image token sits (row and column),
which the boxes are read from. The tokenizer is the reader's one character per token, plus one
token per label marker (`![title](`) and per coordinate (`375,`, `375)`), so a box is 5 tokens.

Seeded: the pages, the weights and the tokenizer follow --seed (bit-identical weights also need the
same torch build, device and --workers). The held-out scores (greedy decoding with transformers,
bf16: labels in order, box IoU, character error rate) go into grounding.json; the tests measure
them again through vLLM.
"""

from __future__ import annotations

import json
import math
import random
import string
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_checkpoint as generator  # noqa: E402  (one source for the layout, template and processor)
import train_reader as reader  # noqa: E402  (the character tokenizer and the CER)

MARKER = "grounding.json"
GROUNDING_PROMPT = "grounding"  # ocr_bundle.grounding.GROUNDING_PROMPT: the text part after the image
PROMPT = (f"<|im_start|>user\n{generator.IMAGE_TOKEN}{GROUNDING_PROMPT}<|im_end|>\n"
          "<|im_start|>assistant\n")  # the chat template's output for [image, "grounding"]
CELL, GRID = 28, 8
CANVAS = CELL * GRID  # 224 px square
STEP = 1000 // GRID  # 125: a cell on the 0–1000 grid
LABELS = ("title", "text", "page_number", "image")
CLASSES = ("blank",) + LABELS  # what a cell holds, for the training-only head
MARKERS = [f"![{label}](" for label in LABELS]
COORDINATES = [f"{n * STEP}," for n in range(GRID + 1)] + [f"{n * STEP})" for n in range(GRID + 1)]
TEXT_CHARACTERS = string.ascii_letters + string.digits + " .:-"  # nothing an added token could swallow

# ~2.7M parameters, ~5 MB in bfloat16; a text head_dim of 64 for vLLM's CPU attention.
MODEL = replace(
    generator.PRESETS["tiny"],
    vocab_size=0,  # set from the tokenizer
    text_hidden=192, text_intermediate=576, text_layers=4, text_heads=3, text_kv_heads=1, text_head_dim=64,
    vision_hidden=128, vision_intermediate=256, vision_layers=4, vision_heads=4, vision_head_dim=32,
)
POSITION_LAYER = 2  # the decoder layer whose hidden states learn each image token's row and column
WARMUP, CURRICULUM = 200, 300  # steps; fixed, so that a run cut short by --budget-seconds is a prefix of --steps


@dataclass(frozen=True)
class PageBlock:
    label: str
    row: int  # top cell row
    col: int  # left cell column
    rows: int
    cols: int
    text: str = ""

    @property
    def box(self) -> tuple[int, int, int, int]:
        """x1, y1, x2, y2 on the 0–1000 grid."""
        return (self.col * STEP, self.row * STEP, (self.col + self.cols) * STEP, (self.row + self.rows) * STEP)

    def line(self) -> str:
        x1, y1, x2, y2 = self.box
        return f"![{self.label}]({x1},{y1},{x2},{y2})" + (f" {self.text}" if self.text else "")


def answer_of(blocks: list[PageBlock]) -> str:
    return "\n".join(block.line() for block in blocks)


def example_page() -> list[PageBlock]:
    """The README's page: a title, a line of text, a picture and a page number."""
    return [PageBlock("title", 0, 1, 1, 6, "Report"), PageBlock("text", 2, 0, 1, 8, "net 2026"),
            PageBlock("image", 3, 2, 3, 4), PageBlock("page_number", GRID - 1, 3, 1, 2, "12")]


def _words(rng: random.Random, longest: int, digits: bool = True) -> str:
    """Words (dictionary words, numbers, random letters) of at most `longest` characters."""
    while True:
        words: list[str] = []
        target = rng.randint(min(3, longest), longest)
        while len(" ".join(words)) < target:
            kind = rng.random()
            if kind < 0.55:
                words.append(rng.choice(reader.WORDS))
            elif kind < 0.75 and digits:
                words.append(str(rng.randint(0, 9999)))
            else:
                words.append("".join(rng.choice(string.ascii_letters + string.digits + ".:-")
                                     for _ in range(rng.randint(1, 5))))
        text = " ".join(words)[:target].strip()
        if text and all(char in TEXT_CHARACTERS for char in text):
            return text


def random_page(rng: random.Random, most_blocks: int = 4) -> list[PageBlock]:
    """1 to `most_blocks` blocks in reading order (top to bottom), none sharing a row."""
    count = rng.randint(1, most_blocks)
    kinds = []
    if rng.random() < 0.45:
        kinds.append("title")
    if rng.random() < 0.4 and len(kinds) < count:
        kinds.append("image")
    page_number = rng.random() < 0.4 and len(kinds) < count
    while len(kinds) + page_number < count:
        kinds.append("text")
    body = [kinds[0]] + rng.sample(kinds[1:], len(kinds) - 1) if kinds and kinds[0] == "title" else rng.sample(kinds, len(kinds))
    heights = [rng.randint(2, 3) if kind == "image" else 1 for kind in body]
    free_rows = GRID - (1 if page_number else 0)
    while sum(heights) > free_rows:  # an image of 3 rows on a crowded page: make it 2
        heights[heights.index(max(heights))] -= 1
    gaps = free_rows - sum(heights)
    # spread the spare rows over the gaps before, between and after the blocks
    cuts = sorted(rng.randint(0, gaps) for _ in range(len(body)))
    blocks, row, used = [], 0, 0
    for kind, height, cut in zip(body, heights, cuts):
        row += cut - used
        used = cut
        if kind == "image":
            cols = rng.randint(2, 6)
            blocks.append(PageBlock("image", row, rng.randint(0, GRID - cols), height, cols))
        else:
            text = _words(rng, GRID, digits=kind == "text")
            if kind == "title":
                text = text.title()
            blocks.append(PageBlock(kind, row, rng.randint(0, GRID - len(text)), 1, len(text), text))
        row += height
    if page_number:
        number = str(rng.randint(1, 999))
        blocks.append(PageBlock("page_number", GRID - 1, rng.randint(2, GRID - 1 - len(number)), 1, len(number), number))
    return blocks


def render_page(blocks: list[PageBlock], rng: random.Random | None = None) -> Image.Image:
    """The page: each block's characters one per cell (title large and bold, page numbers small),
    images as pictures filling their cells; `rng` adds the training variation."""
    paper, ink = (rng.randint(215, 255), rng.randint(0, 70)) if rng else (255, 0)
    shift_x, shift_y = (rng.randint(-2, 2), rng.randint(-2, 2)) if rng else (0, 0)
    image = Image.new("RGB", (CANVAS, CANVAS), (paper, paper, paper))
    draw = ImageDraw.Draw(image)
    for block in blocks:
        x0, y0 = block.col * CELL, block.row * CELL
        if block.label == "image":
            _draw_picture(draw, (x0 + 1, y0 + 1, x0 + block.cols * CELL - 2, y0 + block.rows * CELL - 2),
                          rng or random.Random(hash(block.box)))
            continue
        size, stroke = {"title": (24, 1), "text": (17, 0), "page_number": (13, 0)}[block.label]
        if rng is not None:
            size += rng.randint(-2, 2) if block.label != "page_number" else rng.randint(-1, 1)
        font = ImageFont.load_default(size=size)
        for index, char in enumerate(block.text):
            draw.text((x0 + index * CELL + CELL / 2 + shift_x, y0 + CELL / 2 + shift_y), char, font=font,
                      fill=(ink, ink, ink), anchor="mm", stroke_width=stroke, stroke_fill=(ink, ink, ink))
    if rng is not None:
        if rng.random() < 0.3:
            image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.6)))
        if rng.random() < 0.5:
            noise = Image.effect_noise(image.size, rng.uniform(5, 25)).convert("RGB")
            image = Image.blend(image, noise, rng.uniform(0.05, 0.12))
    return image


def _draw_picture(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], rng: random.Random) -> None:
    """A small 'photo': a coloured field with shapes on it."""
    x1, y1, x2, y2 = box
    draw.rectangle(box, fill=tuple(rng.randint(60, 200) for _ in range(3)))
    for _ in range(rng.randint(2, 5)):
        cx, cy = rng.randint(x1, x2), rng.randint(y1, y2)
        r = rng.randint(4, 14)
        shape = (max(x1, cx - r), max(y1, cy - r), min(x2, cx + r), min(y2, cy + r))
        colour = tuple(rng.randint(0, 255) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(shape, fill=colour)


def build_tokenizer(seed: int):
    """The reader's one-token-per-character tokenizer plus the grounding markers and coordinates."""
    from tokenizers import AddedToken

    tokenizer = reader.build_tokenizer(seed)
    tokenizer.add_tokens([AddedToken(text, normalized=False, special=False) for text in MARKERS + COORDINATES])
    return tokenizer


def cell_targets(blocks: list[PageBlock], tokenizer, space: int):
    """Per cell (row-major): the character it shows (space when none), its class, and whether it
    opens (1), closes (2) or opens and closes (3) a block."""
    import torch

    chars = [[space] * GRID for _ in range(GRID)]
    classes = [[0] * GRID for _ in range(GRID)]
    ends = [[0] * GRID for _ in range(GRID)]
    for block in blocks:
        for r in range(block.row, block.row + block.rows):
            for c in range(block.col, block.col + block.cols):
                classes[r][c] = CLASSES.index(block.label)
        for index, token in enumerate(tokenizer(block.text, add_special_tokens=False)["input_ids"]):
            chars[block.row][block.col + index] = token  # one token per character (Encoder.answer checks)
        ends[block.row][block.col] |= 1
        ends[block.row + block.rows - 1][block.col + block.cols - 1] |= 2
    flat = lambda grid: torch.tensor([value for row in grid for value in row])  # noqa: E731
    return flat(chars), flat(classes), flat(ends)


class Encoder:
    """input_ids, labels and pixel values of one page, as vLLM builds the prompt (no image-break or
    image-end tokens: vLLM's LightOnOCR processor drops them), without the processor per page."""

    def __init__(self, tokenizer):
        import torch

        self.tokenizer = tokenizer
        image_id = tokenizer.convert_tokens_to_ids(generator.IMAGE_TOKEN)
        before, after = PROMPT.split(generator.IMAGE_TOKEN)
        ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.prompt = torch.tensor(ids(before) + [image_id] * GRID * GRID + ids(after))
        self.mean = torch.tensor(generator.IMAGE_MEAN).view(3, 1, 1)  # normalised as the processor does
        self.std = torch.tensor(generator.IMAGE_STD).view(3, 1, 1)

    def pixels(self, image: Image.Image):
        import numpy
        import torch

        array = torch.from_numpy(numpy.asarray(image, dtype=numpy.float32).copy()).permute(2, 0, 1) / 255.0
        return (array - self.mean) / self.std

    def answer(self, blocks: list[PageBlock]):
        import torch

        text = answer_of(blocks)
        ids = self.tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
        expected = sum(5 + (1 + len(b.text) if b.text else 0) for b in blocks) + len(blocks)  # + newlines, end
        assert len(ids) == expected, f"tokenized {text!r} into {len(ids)} tokens, not {expected}"
        return torch.tensor(ids)


def batches(seed: int, batch_size: int, steps: int, tokenizer, workers: int):
    """Seeded batches, rendered in `workers` processes (each its own stream of the seed)."""
    import torch

    class Pages(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            worker = info.id if info else 0
            count = info.num_workers if info else 1
            rng = random.Random(seed * 1000 + worker)
            encoder = Encoder(tokenizer)
            space = tokenizer.convert_tokens_to_ids("Ġ")
            for step in range(worker + 1, steps + 1, count):
                most = min(4, 1 + step // CURRICULUM)  # one block first, up to four from step 3 * CURRICULUM on
                yield collate([example(rng, encoder, space, most) for _ in range(batch_size)], tokenizer.pad_token_id)

    def example(rng, encoder, space, most):
        blocks = random_page(rng, most)
        return (encoder.prompt, encoder.answer(blocks), encoder.pixels(render_page(blocks, rng)),
                *cell_targets(blocks, tokenizer, space))

    loader = torch.utils.data.DataLoader(Pages(), batch_size=None, num_workers=workers,
                                         persistent_workers=False, prefetch_factor=4 if workers else None)
    return iter(loader)


def collate(examples, pad_id: int) -> dict:
    import torch

    longest = max(len(prompt) + len(answer) for prompt, answer, *_ in examples)
    input_ids = torch.full((len(examples), longest), pad_id)
    labels = torch.full((len(examples), longest), -100)
    attention = torch.zeros((len(examples), longest), dtype=torch.long)
    for row, (prompt, answer, *_) in enumerate(examples):
        ids = torch.cat([prompt, answer])
        input_ids[row, :len(ids)] = ids
        labels[row, len(prompt):len(ids)] = answer
        attention[row, :len(ids)] = 1
    stack = lambda index: torch.stack([e[index] for e in examples])  # noqa: E731
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention, "pixel_values": stack(2),
            "chars": stack(3), "classes": stack(4), "ends": stack(5)}


def losses(model, heads, batch: dict, image_id: int) -> dict:
    """The answer's loss and the training-only cell and position losses."""
    import torch
    import torch.nn.functional as F

    size = torch.tensor([[CANVAS, CANVAS]] * len(batch["input_ids"]), device=batch["input_ids"].device)
    features = model.model.get_image_features(pixel_values=batch["pixel_values"], image_sizes=size,
                                              return_dict=True).pooler_output
    features = torch.stack(list(features))  # batch, 64 cells, text hidden
    embeds = model.model.get_input_embeddings()(batch["input_ids"])
    is_image = batch["input_ids"] == image_id
    embeds = embeds.masked_scatter(is_image[..., None], features.reshape(-1, features.shape[-1]).to(embeds.dtype))
    out = model.model.language_model(inputs_embeds=embeds, attention_mask=batch["attention_mask"],
                                     output_hidden_states=True)
    logits = model.lm_head(out.last_hidden_state[:, :-1])
    reading = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                              ignore_index=-100)
    cells = features.reshape(-1, features.shape[-1])
    where = out.hidden_states[POSITION_LAYER][is_image]  # row-major cells of every page
    index = torch.arange(GRID * GRID, device=where.device).repeat(len(batch["input_ids"]))
    return {
        "reading": reading,
        "chars": F.cross_entropy(model.lm_head(cells), batch["chars"].reshape(-1)),
        "classes": F.cross_entropy(heads["classes"](cells), batch["classes"].reshape(-1)),
        "ends": F.cross_entropy(heads["ends"](cells), batch["ends"].reshape(-1)),
        "rows": F.cross_entropy(heads["rows"](where), index // GRID),
        "cols": F.cross_entropy(heads["cols"](where), index % GRID),
    }


def held_out_pages(count: int, seed: int = 12345) -> list[list[PageBlock]]:
    rng = random.Random(seed)
    return [random_page(rng) for _ in range(count)]


def score(answers: list[str], pages: list[list[PageBlock]]) -> dict:
    """Held-out scores of grounding replies: pages whose labels come in order, the mean IoU of
    blocks paired in order (0 for a missing one), and the CER of the blocks' text."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ocr_bundle import grounding

    labels_right, ious, predicted_text, true_text = 0, [], [], []
    for answer, blocks in zip(answers, pages):
        parsed = grounding.parse(answer).blocks
        labels_right += [b.label for b in parsed] == [b.label for b in blocks]
        for index, truth in enumerate(blocks):
            ious.append(grounding.iou(parsed[index].box, truth.box) if index < len(parsed) else 0.0)
        predicted_text.append(" | ".join(b.text for b in parsed))
        true_text.append(" | ".join(b.text for b in blocks))
    return {"pages": len(pages), "labels_in_order": round(labels_right / max(1, len(pages)), 4),
            "mean_iou": round(sum(ious) / max(1, len(ious)), 4),
            "blocks_iou_at_least_0.5": round(sum(i >= 0.5 for i in ious) / max(1, len(ious)), 4),
            "cer": round(reader.character_error_rate(predicted_text, true_text), 4)}


def greedy_answers(model, tokenizer, pages: list[list[PageBlock]], device: str, batch: int = 50) -> list[str]:
    """Greedy replies, `batch` pages a time (every prompt has the same length: no padding)."""
    import torch

    encoder = Encoder(tokenizer)
    answers = []
    with torch.no_grad():
        for start in range(0, len(pages), batch):
            chunk = pages[start:start + batch]
            pixels = torch.stack([encoder.pixels(render_page(blocks)) for blocks in chunk]).to(device, model.dtype)
            output = model.generate(input_ids=encoder.prompt.repeat(len(chunk), 1).to(device), pixel_values=pixels,
                                    image_sizes=torch.tensor([[CANVAS, CANVAS]] * len(chunk), device=device),
                                    max_new_tokens=120, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                    pad_token_id=tokenizer.pad_token_id)
            answers += tokenizer.batch_decode(output[:, len(encoder.prompt):], skip_special_tokens=True)
    return answers


def train(out: Path, steps: int, batch_size: int, seed: int, device: str, lr: float, eval_pages: int,
          workers: int, budget_seconds: float | None = None) -> dict:
    import torch
    from transformers import LightOnOcrForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = build_tokenizer(seed)
    processor = generator.build_processor(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in reader.SPECIAL_TOKENS}
    config_dict = generator.build_config_dict(replace(MODEL, vocab_size=len(tokenizer)), ids)
    config_dict["_name_or_path"] = "LightOnOCR-3-1B-grounding-tiny"
    model = LightOnOcrForConditionalGeneration(generator.hf_config_from(config_dict)).float().to(device)
    parameters = generator.count_parameters(model)
    hidden = MODEL.text_hidden
    heads = torch.nn.ModuleDict({"classes": torch.nn.Linear(hidden, len(CLASSES)), "ends": torch.nn.Linear(hidden, 4),
                                 "rows": torch.nn.Linear(hidden, GRID), "cols": torch.nn.Linear(hidden, GRID)}).to(device)
    optimizer = torch.optim.AdamW(list(model.parameters()) + list(heads.parameters()), lr=lr, weight_decay=0.01,
                                  betas=(0.9, 0.98))
    plan = {"steps": steps}  # cut short once, early, when --budget-seconds says the steps will not fit
    # a linear warm-up, then a cosine over the steps left: the warm-up does not depend on the plan
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / WARMUP if step < WARMUP else 0.5 * (
        1 + math.cos(math.pi * min(step - WARMUP, plan["steps"] - WARMUP) / max(1, plan["steps"] - WARMUP))))
    image_id = tokenizer.convert_tokens_to_ids(generator.IMAGE_TOKEN)
    print(f"grounding: {parameters:,} parameters, vocabulary {len(tokenizer)}, {steps} steps of {batch_size} pages",
          flush=True)
    started = time.monotonic()
    model.train()
    for step, batch in enumerate(batches(seed, batch_size, steps, tokenizer, workers), 1):
        batch = {key: value.to(device) for key, value in batch.items()}
        parts = losses(model, heads, batch, image_id)
        loss = sum(parts.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if budget_seconds and step == WARMUP // 2:  # the rate is known; the schedule has not yet depended on it
            per_step = (time.monotonic() - started) / step
            plan["steps"] = min(steps, int(step + (budget_seconds - (time.monotonic() - started)) / per_step))
            print(f"{per_step:.3f} s a step: {plan['steps']} steps fit in {budget_seconds:.0f} s", flush=True)
        if step >= plan["steps"]:
            break
        if step % 100 == 0 or step == 1:
            print(f"step {step}/{steps} " + " ".join(f"{k} {v.item():.4f}" for k, v in parts.items())
                  + f" ({time.monotonic() - started:.0f} s)", flush=True)
    train_seconds = time.monotonic() - started

    model.eval()
    pages = held_out_pages(eval_pages)
    answers = greedy_answers(model.to(torch.bfloat16), tokenizer, pages, device)
    scores = score(answers, pages)
    print(f"held-out (bf16, greedy, {len(pages)} pages): {scores}", flush=True)
    for blocks, answer in list(zip(pages, answers))[:3]:
        print(f"  truth: {answer_of(blocks)!r}\n  read:  {answer!r}")

    generator.save_checkpoint(model.to("cpu"), out, config_dict, processor)
    generation = json.loads((out / "generation_config.json").read_text())
    generation.update(temperature=0.1, top_p=1.0)  # LightOnOCR-3's sampling (families.py), not generation 2's
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    summary = {"parameters": parameters, "vocabulary": len(tokenizer), "steps": plan["steps"], "batch_size": batch_size,
               "seed": seed, "device": device, "workers": workers, "lr": lr, "train_seconds": round(train_seconds),
               "held_out": scores, "command": reproducing_command(sys.argv[1:], plan["steps"])}
    (out / MARKER).write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(
        f"A tiny LightOnOCR-3-layout grounding model ({parameters:,} parameters) trained on generated 224 px "
        f"pages of 1–4 blocks (title, text, image, page_number); held out: labels in order on "
        f"{scores['labels_in_order']:.0%} of pages, mean box IoU {scores['mean_iou']:.2f}, CER {scores['cer']:.2%}.\n"
        f"Written by `{summary['command']}` in {train_seconds:.0f} s on {device}. A test fixture, not an OCR model.\n")
    return summary


def reproducing_command(argv: list[str], steps: int) -> str:
    """This run's command with the steps it made in place of a time budget."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--budget-seconds", "--steps"):
            skip = True
        elif not arg.startswith(("--budget-seconds=", "--steps=")):
            kept.append(arg)
    return "python scripts/train_grounding.py " + " ".join(kept + ["--steps", str(steps)])


def main(argv: list[str] | None = None) -> int:
    parser = reader.training_parser(__doc__, steps=6000, batch_size=64, examples="pages")
    parser.add_argument("--workers", type=int, default=8, help="processes rendering pages (default 8)")
    parser.add_argument("--eval-pages", type=int, default=200, help="held-out pages for the scores (default 200)")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="train at most this long: fewer steps when --steps would not fit (the summary's "
                             "command names the steps made, which reproduce the run)")
    args = reader.parse_training_args(parser, argv)
    summary = train(args.out, args.steps, args.batch_size, args.seed, args.device, args.lr, args.eval_pages,
                    args.workers, args.budget_seconds)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

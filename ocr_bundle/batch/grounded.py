"""A grounded page on disk (batch_ocr.py --grounding): LightOnOCR-3's reply → its blocks file,
its raw reply, the pictures cut out of the page, and the page's Markdown.

    pages/0003.md              the page's Markdown from its blocks (titles as headings, pictures
                               linked); when the reply did not parse cleanly, the reply as it came
    pages/0003.blocks.jsonl    one block per line: label, box (0–1000 and in the rendered page's
                               pixels), text, continued
    pages/0003.raw.txt         the reply as the model wrote it
    pages/0003-4-image.png     block 4, an image (or chart), cut from the page the model saw
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..grounding import CROPPED, Block, parse, to_markdown
from ..images import decode_data_url, encode_image
from .render_pool import RenderedPage


@dataclass
class Pictures:
    """A grounded page's pictures (image and chart blocks) cut out of the page the model saw."""

    width: int  # the page's pixels, which the boxes are in
    height: int
    names: dict[int, str] = field(default_factory=dict)  # block index -> the crop's name
    crops: dict[int, bytes] = field(default_factory=dict)  # block index -> PNG
    skipped: list[str] = field(default_factory=list)  # why a picture block was not cut


def cut_pictures(blocks: list[Block], rendered: RenderedPage, name_of: Callable[[int, Block], str],
                 min_size: int = 1) -> Pictures:
    """Each picture block at least `min_size` px each way on the page, cut out as a PNG named `name_of(index,
    block)`; the others skipped with the reason (a box under a pixel after scaling cannot be cut)."""
    pictures = Pictures(rendered.width, rendered.height)
    if not rendered.data_url or not any(block.label in CROPPED for block in blocks):
        return pictures
    page = decode_data_url(rendered.data_url)
    pictures.width, pictures.height = page.size
    for index, block in enumerate(blocks):
        if block.label in CROPPED:
            box = block.pixels(*page.size)
            if box[2] - box[0] < min_size or box[3] - box[1] < min_size:
                pictures.skipped.append(f"block {index + 1} ({block.label}): under {min_size} px on the "
                                        f"{page.width}x{page.height} page")
                continue
            pictures.names[index] = name_of(index, block)
            pictures.crops[index] = encode_image(page.crop(box), "PNG")[0]
    return pictures


def grounded_page(reply: str, cut: bool, rendered: RenderedPage,
                  page_file: PurePosixPath) -> tuple[str, dict[str, bytes], dict]:
    """(the page's Markdown, its files by path relative to the document folder, its record's fields).
    `page_file`: the page's Markdown file relative to the document folder (pages/0003.md)."""
    parsed = parse(reply, cut=cut)
    folder, stem = page_file.parent, page_file.stem
    pictures = cut_pictures(parsed.blocks, rendered, lambda index, block: f"{stem}-{index + 1}-{block.label}.png")
    files = {(folder / pictures.names[index]).as_posix(): crop for index, crop in pictures.crops.items()}
    blocks_file = (folder / f"{stem}.blocks.jsonl").as_posix()
    files[blocks_file] = "".join(json.dumps(block.as_dict(pictures.width, pictures.height), ensure_ascii=False)
                                 + "\n" for block in parsed.blocks).encode("utf-8")
    files[(folder / f"{stem}.raw.txt").as_posix()] = reply.encode("utf-8")
    markdown = to_markdown(parsed.blocks, pictures=pictures.names) if parsed.clean else reply
    # "parsed": the reply parsed cleanly, so the page's Markdown is made from its blocks (and --drop applies),
    # whatever the page's status (a flagged page's blocks may have parsed).
    fields = {"blocks_file": blocks_file, "blocks": len(parsed.blocks), "parsed": parsed.clean,
              "pictures": {str(index): (folder / name).as_posix() for index, name in pictures.names.items()},
              **({"pictures_skipped": pictures.skipped} if pictures.skipped else {})}
    return markdown, files, fields

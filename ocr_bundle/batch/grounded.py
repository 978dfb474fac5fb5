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
from pathlib import PurePosixPath

from ..grounding import CROPPED, parse, to_markdown
from ..images import decode_data_url, encode_image
from .render_pool import RenderedPage


def grounded_page(reply: str, cut: bool, rendered: RenderedPage,
                  page_file: PurePosixPath) -> tuple[str, dict[str, bytes], dict]:
    """(the page's Markdown, its files by path relative to the document folder, its record's fields).
    `page_file`: the page's Markdown file relative to the document folder (pages/0003.md)."""
    parsed = parse(reply, cut=cut)
    folder, stem = page_file.parent, page_file.stem
    width, height = rendered.width, rendered.height
    files: dict[str, bytes] = {}
    pictures: dict[int, str] = {}
    skipped: list[str] = []
    if rendered.data_url and any(block.label in CROPPED for block in parsed.blocks):
        page = decode_data_url(rendered.data_url)
        width, height = page.size
        for index, block in enumerate(parsed.blocks):
            if block.label in CROPPED:
                box = block.pixels(width, height)
                if box[2] - box[0] < 1 or box[3] - box[1] < 1:  # under a pixel on this page: nothing to cut
                    skipped.append(f"block {index + 1} ({block.label}): under 1 px on the {width}x{height} page")
                    continue
                name = f"{stem}-{index + 1}-{block.label}.png"
                files[(folder / name).as_posix()] = encode_image(page.crop(box), "PNG")[0]
                pictures[index] = name
    blocks_file = (folder / f"{stem}.blocks.jsonl").as_posix()
    files[blocks_file] = "".join(json.dumps(block.as_dict(width, height), ensure_ascii=False) + "\n"
                                 for block in parsed.blocks).encode("utf-8")
    files[(folder / f"{stem}.raw.txt").as_posix()] = reply.encode("utf-8")
    markdown = to_markdown(parsed.blocks, pictures=pictures) if parsed.clean else reply
    # "parsed": the reply parsed cleanly, so the page's Markdown is made from its blocks (and --drop applies),
    # whatever the page's status (a flagged page's blocks may have parsed).
    fields = {"blocks_file": blocks_file, "blocks": len(parsed.blocks), "parsed": parsed.clean,
              "pictures": {str(index): (folder / name).as_posix() for index, name in pictures.items()},
              **({"pictures_skipped": skipped} if skipped else {})}
    return markdown, files, fields

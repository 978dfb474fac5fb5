"""LightOnOCR-3's grounding output → layout blocks; one parser for the converter, the page and the tests.

Asked for grounding (a text part "grounding" after the page image), LightOnOCR-3 answers one
block per layout element, each opened by a marker:

    ![title](112,64,880,118) Annual report 2025
    ![text](112,140,880,402) The year began with ...
    ![image](120,420,870,760)
    ![text+](60,40,940,300) ... a paragraph continued from the previous page

The four numbers are the block's box, x1,y1,x2,y2 on a 0–1000 scale of the page; the label
is one of LABELS, `text+` marking a block continued from the previous page. A block's text
runs to the next marker.

Parsing never raises: whatever the model wrote (a marker it garbled, a box out of range or
inverted, text before the first marker, a reply cut at max_tokens in the middle of a block),
`parse` returns the blocks it could read and, in `problems`, why the page should be flagged;
the caller keeps the raw reply as the page's text. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

LABELS = ("title", "section", "text", "list", "caption", "footnote", "aside_text", "header", "footer",
          "page_number", "table", "chart", "formula", "code", "image")
CONTINUED = "+"  # "text+": the block goes on from the previous page
CROPPED = ("image", "chart")  # blocks cut out of the page as pictures
DROPPABLE = ("header", "footer", "page_number")  # what a user asks to drop from the Markdown
SCALE = 1000  # boxes are on a 0–SCALE grid of the page
GROUNDING_PROMPT = "grounding"  # the text part after the image that asks for blocks

# A marker: ![label](box). Loose on purpose (any label, any box text): what is wrong in it is
# reported, not silently taken for the block's text.
_MARKER = re.compile(r"!\[(?P<label>[^\]\n]{0,40})\]\((?P<box>[^)\n]{0,80})\)")
_NUMBER = re.compile(r"\s*-?\d+(?:\.\d+)?\s*")


@dataclass(frozen=True)
class Block:
    label: str  # one of LABELS
    box: tuple[int, int, int, int]  # x1, y1, x2, y2 on the 0–1000 grid, ordered and within it
    text: str
    continued: bool = False  # "text+": goes on from the previous page

    def pixels(self, width: int, height: int) -> tuple[int, int, int, int]:
        """The box on a page of `width` × `height` pixels."""
        x1, y1, x2, y2 = self.box
        return (round(x1 * width / SCALE), round(y1 * height / SCALE), round(x2 * width / SCALE),
                round(y2 * height / SCALE))

    def as_dict(self, width: int | None = None, height: int | None = None) -> dict:
        out = asdict(self)
        out["box"] = list(self.box)
        if width and height:
            out["box_px"] = list(self.pixels(width, height))
        return out


@dataclass
class Grounding:
    blocks: list[Block] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why the page is flagged; empty when it parsed cleanly

    @property
    def clean(self) -> bool:
        return not self.problems


def parse(reply: str, cut: bool = False) -> Grounding:
    """The blocks of a grounding reply and what was wrong with it. `cut`: the reply stopped at
    max_tokens (finish_reason "length"), so its last block may be incomplete."""
    result = Grounding()
    markers = list(_MARKER.finditer(reply))
    if not markers:
        result.problems.append("no grounding blocks in the reply" if reply.strip()
                               else "the reply is empty")
        return result
    before = reply[:markers[0].start()].strip()
    if before:
        result.problems.append(f"text before the first block ({len(before)} characters), not in any block")
    for index, marker in enumerate(markers):
        end = markers[index + 1].start() if index + 1 < len(markers) else len(reply)
        text = reply[marker.end():end].strip()
        where = f"block {index + 1}"
        label, continued = marker["label"].strip(), False
        if label.endswith(CONTINUED):
            label, continued = label[:-len(CONTINUED)], True
            if index:
                result.problems.append(f"{where}: '{label}+' (continued from the previous page) is not the first block")
        if label not in LABELS:
            result.problems.append(f"{where}: unknown label {marker['label']!r}: left out")
            continue
        box, trouble = _box(marker["box"])
        if box is None:
            result.problems.append(f"{where} ({label}): {trouble}: left out")
            continue
        if trouble:
            result.problems.append(f"{where} ({label}): {trouble}")
        result.blocks.append(Block(label, box, text, continued))
    if cut:
        last = result.blocks[-1].label if result.blocks else "?"
        result.problems.append(f"cut at max_tokens in the last block ({last}): the page may have more")
    return result


def _box(text: str) -> tuple[tuple[int, int, int, int] | None, str | None]:
    """(box, what was wrong): None when it is not four numbers; out of range or inverted, it is
    clamped and ordered, and said so."""
    parts = text.split(",")
    if len(parts) != 4 or not all(_NUMBER.fullmatch(part) for part in parts):
        return None, f"box ({text}) is not four numbers"
    x1, y1, x2, y2 = (round(float(part)) for part in parts)
    trouble = []
    if any(value < 0 or value > SCALE for value in (x1, y1, x2, y2)):
        trouble.append(f"box ({text}) outside 0–{SCALE}: clamped")
    if x1 > x2 or y1 > y2:
        trouble.append(f"box ({text}) inverted: reordered")
    x1, x2 = sorted(min(max(v, 0), SCALE) for v in (x1, x2))
    y1, y2 = sorted(min(max(v, 0), SCALE) for v in (y1, y2))
    if x1 == x2 or y1 == y2:
        return None, f"box ({text}) is empty"
    return (x1, y1, x2, y2), "; ".join(trouble) or None


def to_markdown(blocks: list[Block], drop: frozenset[str] | set[str] = frozenset(),
                pictures: dict[int, str] | None = None) -> str:
    """The page's Markdown from its blocks: titles and sections as headings, each picture (an
    image or chart block) as a link to its crop (`pictures`: block index → file name), the blocks
    whose label is in `drop` left out."""
    parts = []
    for index, block in enumerate(blocks):
        if block.label in drop:
            continue
        if block.label in CROPPED and pictures and index in pictures:
            parts.append(f"![{block.label}]({pictures[index]})" + (f"\n\n{block.text}" if block.text else ""))
        elif block.label == "title":
            parts.append(f"# {block.text}")
        elif block.label == "section":
            parts.append(f"## {block.text}")
        elif block.text:
            parts.append(block.text)
    return "\n\n".join(parts)


def iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """Intersection over union of two boxes (x1, y1, x2, y2): 1 the same box, 0 apart."""
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    if width <= 0 or height <= 0:
        return 0.0
    overlap = width * height
    return overlap / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - overlap)


def parse_drop(text: str) -> frozenset[str]:
    """'header,footer' → the labels; ValueError naming what is not a label."""
    labels = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(labels - set(LABELS))
    if unknown:
        raise ValueError(f"not a block label: {', '.join(unknown)} (labels: {', '.join(LABELS)})")
    return labels

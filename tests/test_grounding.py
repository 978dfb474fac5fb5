"""The grounding parser (ocr_bundle/grounding.py): LightOnOCR-3's blocks, and every way a reply
can be malformed without the parser ever raising (fast tier: no server)."""

from __future__ import annotations

import random

import pytest

from ocr_bundle.grounding import LABELS, Block, iou, parse, parse_drop, to_markdown

PAGE = """![header](40,20,960,50) ACME Corp — Annual report
![title](112,64,880,118) Annual report 2025
![text](112,140,880,402) The year began with a new plant.
It opened in March.
![image](120,420,870,760)
![caption](120,770,870,800) Figure 1: the plant
![page_number](480,960,520,985) 3"""


def test_a_well_formed_page_gives_every_block_in_order():
    grounding = parse(PAGE)
    assert grounding.clean and [b.label for b in grounding.blocks] == [
        "header", "title", "text", "image", "caption", "page_number"]
    text = grounding.blocks[2]
    assert text.box == (112, 140, 880, 402) and text.text == "The year began with a new plant.\nIt opened in March."
    assert grounding.blocks[3].text == "" and not any(b.continued for b in grounding.blocks)
    assert text.pixels(1000, 2000) == (112, 280, 880, 804) and text.pixels(1089, 1540) == (122, 216, 958, 619)
    assert text.as_dict(1089, 1540) == {"label": "text", "box": [112, 140, 880, 402], "text": text.text,
                                        "continued": False, "box_px": [122, 216, 958, 619]}


def test_a_block_continued_from_the_previous_page():
    grounding = parse("![text+](60,40,940,300) and so the story ends.\n![text](60,320,940,500) Next.")
    assert grounding.clean and grounding.blocks[0] == Block("text", (60, 40, 940, 300), "and so the story ends.", True)
    late = parse("![title](0,0,1000,100) T\n![text+](60,140,940,300) x")
    assert late.blocks[1].continued and late.problems == [
        "block 2: 'text+' (continued from the previous page) is not the first block"]


@pytest.mark.parametrize("reply, kept, problem", [
    ("", [], "the reply is empty"),
    ("Just plain text, no markers at all.", [], "no grounding blocks in the reply"),
    ("Preamble.\n![text](0,0,500,500) body", ["text"], "text before the first block (9 characters), not in any block"),
    ("![paragraph](0,0,500,500) x\n![text](0,500,500,900) y", ["text"], "block 1: unknown label 'paragraph': left out"),
    ("![text](0,0,500) x", [], "block 1 (text): box (0,0,500) is not four numbers: left out"),
    ("![text](a,b,c,d) x", [], "block 1 (text): box (a,b,c,d) is not four numbers: left out"),
    ("![text](10,10,10,900) x", [], "block 1 (text): box (10,10,10,900) is empty: left out"),
    ("![text](-20,0,500,1200) x", ["text"], "block 1 (text): box (-20,0,500,1200) outside 0–1000: clamped"),
    ("![text](500,900,0,0) x", ["text"], "block 1 (text): box (500,900,0,0) inverted: reordered"),
])
def test_each_malformed_reply_keeps_what_parsed_and_says_why(reply, kept, problem):
    grounding = parse(reply)
    assert [b.label for b in grounding.blocks] == kept and grounding.problems == [problem]
    assert all(0 <= v <= 1000 for b in grounding.blocks for v in b.box)
    assert all(b.box[0] < b.box[2] and b.box[1] < b.box[3] for b in grounding.blocks)


def test_a_reply_cut_at_max_tokens_flags_its_last_block():
    grounding = parse("![title](0,0,1000,100) T\n![text](0,120,1000,900) The paragraph stops mid-", cut=True)
    assert [b.label for b in grounding.blocks] == ["title", "text"]
    assert grounding.problems == ["cut at max_tokens in the last block (text): the page may have more"]
    half_marker = parse("![title](0,0,1000,100) T\n![te", cut=True)
    assert [b.text for b in half_marker.blocks] == ["T\n![te"] and not half_marker.clean


def test_the_parser_never_raises_whatever_comes():
    rng = random.Random(7)
    pieces = ["![", "]", "(", ")", ",", "text", "image+", "title", "1000", "-5", "12.5", "\n", " ", "é", "x" * 30,
              "![text](0,0,10,10)", "![](", ")(", "![image](1,2,3,4) caption"]
    for _ in range(3000):
        reply = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        grounding = parse(reply, cut=rng.random() < 0.3)
        assert all(b.label in LABELS for b in grounding.blocks)
        assert grounding.blocks or grounding.problems


def test_markdown_of_the_blocks_with_headings_pictures_and_what_is_dropped():
    blocks = parse(PAGE).blocks
    kept = to_markdown(blocks, pictures={3: "pictures/p0001-4-image.png"})
    assert kept == ("ACME Corp — Annual report\n\n# Annual report 2025\n\nThe year began with a new plant.\nIt opened "
                    "in March.\n\n![image](pictures/p0001-4-image.png)\n\nFigure 1: the plant\n\n3")
    dropped = to_markdown(blocks, drop=parse_drop("header,footer,page_number"))
    assert "ACME Corp" not in dropped and not dropped.endswith("3") and dropped.startswith("# Annual report 2025")
    assert "![image]" not in dropped  # no crop made: no link to a missing file
    with pytest.raises(ValueError, match="not a block label: headers"):
        parse_drop("headers,footer")


def test_iou():
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)

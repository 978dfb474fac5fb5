"""batch_ocr.py --grounding against the scripted server (a LightOnOCR-3-1B by its hub id): the
blocks file, the pictures cut out of the page, the page's and the document's Markdown, --drop,
continuations across pages, malformed replies, and a grounding run never reusing plain pages
(fast tier: the trained model's words and boxes come through the real server elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from scripted_server import Reply, ScriptedServer
from test_batch_faults import convert, manifest, small_pdf

pytestmark = pytest.mark.usefixtures("no_server_environment")

V3 = "lightonai/LightOnOCR-3-1B"
PAGE = """![header](40,20,960,50) ACME Corp
![title](100,60,900,110) Annual report
![text](100,130,900,380) The year began well.
![image](200,400,800,700)
![page_number](480,950,520,980) 7"""


@pytest.fixture
def v3():
    with ScriptedServer(models=(V3,)) as running:
        yield running


def picture_page(path: Path) -> Path:
    """A white 500×800 page with a red rectangle where PAGE's image block is (200,400)-(800,700) of 1000."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page = Image.new("RGB", (500, 800), "white")
    ImageDraw.Draw(page).rectangle((100, 320, 399, 559), fill="red")
    page.save(path)
    return path


def test_a_grounded_page_gets_its_blocks_its_pictures_and_markdown(v3, tmp_path, capsys):
    image = picture_page(tmp_path / "in" / "report.png")
    v3.responder = lambda request: Reply(text=PAGE)
    run = convert(capsys, v3.url, tmp_path / "out", str(image), "--grounding")
    assert run.code == 0, run.err
    content = v3.requests[0].body["messages"][0]["content"]
    assert content[1] == {"type": "text", "text": "grounding"}  # the grounding request: the image, then the word
    folder = tmp_path / "out" / "report.png"
    blocks = [json.loads(line) for line in (folder / "pages" / "0001.blocks.jsonl").read_text().splitlines()]
    assert [b["label"] for b in blocks] == ["header", "title", "text", "image", "page_number"]
    assert blocks[3]["box"] == [200, 400, 800, 700] and blocks[3]["box_px"] == [100, 320, 400, 560]
    picture = Image.open(folder / "pages" / "0001-4-image.png")
    assert picture.size == (300, 240)
    red = sum(1 for pixel in picture.getdata() if pixel[:3] == (255, 0, 0))
    assert red / (300 * 240) > 0.98  # the picture is the red rectangle, cut where the box says
    page_md = (folder / "pages" / "0001.md").read_text()
    assert page_md.startswith("ACME Corp\n\n# Annual report\n\nThe year began well.\n\n![image](0001-4-image.png)")
    assert (folder / "pages" / "0001.raw.txt").read_text() == PAGE
    document = (folder / "report.md").read_text()
    assert "![image](pages/0001-4-image.png)" in document and "ACME Corp" in document
    record = manifest(folder)
    assert record["settings"]["grounding"] is True and record["pages"]["1"]["blocks"] == 5
    assert record["pages"]["1"]["status"] == "ok"


def test_drop_leaves_blocks_out_of_the_document_only_and_a_change_reassembles_without_converting(v3, tmp_path,
                                                                                               capsys):
    image = picture_page(tmp_path / "in" / "report.png")
    v3.responder = lambda request: Reply(text=PAGE)
    out = tmp_path / "out"
    assert convert(capsys, v3.url, out, str(image), "--grounding", "--drop", "header,footer,page_number").code == 0
    document = (out / "report.png" / "report.md").read_text()
    assert "ACME Corp" not in document and not document.rstrip().endswith("7") and "# Annual report" in document
    assert "ACME Corp" in (out / "report.png" / "pages" / "0001.blocks.jsonl").read_text()  # the blocks keep it
    again = convert(capsys, v3.url, out, str(image), "--grounding")
    assert again.code == 0 and "1 done before, 0 to convert" in again.err and v3.chat_count() == 1
    assert "ACME Corp" in (out / "report.png" / "report.md").read_text()
    refused = convert(capsys, v3.url, out, str(image), "--drop", "header")
    assert refused.code == 2 and "--drop leaves grounded blocks out: add --grounding" in refused.err
    with pytest.raises(SystemExit):
        convert(capsys, v3.url, out, str(image), "--grounding", "--drop", "headers")


def test_a_paragraph_continued_on_the_next_page_is_joined_in_the_document(v3, tmp_path, capsys):
    pdf = small_pdf(tmp_path / "in" / "doc.pdf", 2)
    replies = {0: "![title](100,50,900,100) Chapter\n![text](100,120,900,950) The sentence runs over the",
               1: "![text+](100,40,900,120) page break and ends here.\n![text](100,140,900,300) Next paragraph."}
    v3.responder = lambda request: Reply(text=replies[request.index])
    assert convert(capsys, v3.url, tmp_path / "out", str(pdf), "--grounding", "--concurrency", "1").code == 0
    document = (tmp_path / "out" / "doc.pdf" / "doc.md").read_text()
    assert "The sentence runs over the page break and ends here." in document
    assert document.index("ends here.") < document.index("<!-- page 2 -->") < document.index("Next paragraph.")
    second = json.loads((tmp_path / "out" / "doc.pdf" / "pages" / "0002.blocks.jsonl").read_text().splitlines()[0])
    assert second["continued"] is True and second["label"] == "text"


def test_a_malformed_reply_keeps_its_raw_text_and_flags_the_page_with_the_reason(v3, tmp_path, capsys):
    image = picture_page(tmp_path / "in" / "report.png")
    garbled = "Some preamble.\n![title](100,60,900) Annual report\n![text](100,130,900,380) Body text."
    v3.responder = lambda request: Reply(text=garbled)
    run = convert(capsys, v3.url, tmp_path / "out", str(image), "--grounding", "--max-attempts", "2")
    assert run.code == 0 and v3.chat_count() == 2  # retried hotter, as a looping or cut page is
    record = manifest(tmp_path / "out" / "report.png")["pages"]["1"]
    assert record["status"] == "flagged" and record["flag"].startswith("grounding: text before the first block")
    assert "box (100,60,900) is not four numbers" in record["flag"]
    folder = tmp_path / "out" / "report.png"
    assert (folder / "pages" / "0001.md").read_text() == garbled  # nothing the model wrote is lost
    blocks = (folder / "pages" / "0001.blocks.jsonl").read_text().splitlines()
    assert [json.loads(line)["label"] for line in blocks] == ["text"]  # what parsed


def test_grounded_and_plain_pages_are_never_taken_for_each_other(v3, tmp_path, capsys):
    image = picture_page(tmp_path / "in" / "report.png")
    out = tmp_path / "out"
    v3.responder = lambda request: Reply(text=PAGE if len(request.body["messages"][0]["content"]) == 2 else "plain")
    assert convert(capsys, v3.url, out, str(image)).code == 0
    grounded = convert(capsys, v3.url, out, str(image), "--grounding")
    assert grounded.code == 0 and "0 done before, 1 to convert" in grounded.err
    assert "# Annual report" in (out / "report.png" / "pages" / "0001.md").read_text()
    plain = convert(capsys, v3.url, out, str(image))
    assert plain.code == 0 and "0 done before, 1 to convert" in plain.err
    assert (out / "report.png" / "pages" / "0001.md").read_text() == "plain"


def test_grounding_is_refused_for_a_model_without_it(server, tmp_path, capsys):
    image = picture_page(tmp_path / "in" / "report.png")
    run = convert(capsys, server.url, tmp_path / "out", str(image), "--grounding")
    assert run.code == 2 and "--grounding needs a LightOnOCR-3 model" in run.err and server.chat_count() == 0


def test_a_picture_under_a_pixel_is_skipped_with_a_note_and_the_page_is_done(v3, tmp_path, capsys):
    """issue 44, case 7: a box narrower than a pixel once scaled to the page (2..3 of 1000 on 800 px) was an
    empty crop: 'cannot write empty image', the page pending forever."""
    image = tmp_path / "in" / "page.png"
    image.parent.mkdir(parents=True)
    Image.new("RGB", (800, 600), "white").save(image)
    v3.responder = lambda request: Reply(text="![text](100,100,900,200) Words\n![image](2,300,3,400)")
    run = convert(capsys, v3.url, tmp_path / "out", str(image), "--grounding")
    assert run.code == 0, run.err
    record = manifest(tmp_path / "out" / "page.png")["pages"]["1"]
    assert record["status"] == "ok" and record["pictures"] == {}
    assert record["pictures_skipped"] == ["block 2 (image): under 1 px on the 800x600 page"]
    assert (tmp_path / "out" / "page.png" / "page.md").read_text().count("Words") == 1


def test_drop_applies_to_a_flagged_page_whose_reply_parsed(v3, tmp_path, capsys):
    """issue 44, case 7: a page flagged (here: its text ends in a loop on every attempt) whose blocks parsed
    kept its header and page number in <name>.md whatever --drop said."""
    image = picture_page(tmp_path / "in" / "report.png")
    looping = PAGE + "\n![text](100,985,900,995) The end" + " and well" * 80  # the reply's tail loops
    v3.responder = lambda request: Reply(text=looping)
    run = convert(capsys, v3.url, tmp_path / "out", str(image), "--grounding", "--drop", "header,page_number")
    assert run.code == 0  # a flagged page is kept, not failed
    record = manifest(tmp_path / "out" / "report.png")["pages"]["1"]
    assert record["status"] == "flagged" and record["parsed"] is True, record
    document = (tmp_path / "out" / "report.png" / "report.md").read_text()
    assert "Annual report" in document and "ACME Corp" not in document and "\n7\n" not in document + "\n"


def test_a_garbled_page_of_700_boxes_keeps_a_small_record(v3, tmp_path, capsys):
    """issue 44, case 8: every attempt's whole problem list went into the manifest (227 KB for one page)."""
    image = picture_page(tmp_path / "in" / "report.png")
    garbled = "\n".join(f"![text](9{i},1,2,3) x" for i in range(700))  # boxes with x2 < x1: each a problem
    v3.responder = lambda request: Reply(text=garbled)
    run = convert(capsys, v3.url, tmp_path / "out", str(image), "--grounding", "--max-attempts", "2")
    assert run.code == 0
    folder = tmp_path / "out" / "report.png"
    record = manifest(folder)["pages"]["1"]
    assert record["status"] == "flagged" and len(record["attempt_log"]) == 2, record
    assert all(len(a["problems"]) == 5 and a["problem_count"] >= 700 for a in record["attempt_log"])
    assert (folder / "manifest.json").stat().st_size < 10_000

"""The batch converter's pure parts, with exact answers: loop detection, page ranges, input
discovery and output folders, atomic files, manifests and resume decisions, retries."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path, PurePath

import pytest

from ocr_bundle.batch.attempts import Attempt, PageStats, flag_of, is_transient
from ocr_bundle.batch.options import BatchOptions
from ocr_bundle.batch.summary import client_cost
from ocr_bundle.client import OcrError
from ocr_bundle.files import atomic_write_json, atomic_write_text, is_partial, remove_partials
from ocr_bundle.inputs import InputFile, InputNotFound, discover, output_folders, pages_in, parse_page_ranges
from ocr_bundle.batch.identity import file_sha256, take
from helpers import as_input
from ocr_bundle.batch.manifest import ConversionSettings, DocumentOutput
from ocr_bundle.batch.repetition import Repetition, repeated_tail, tokens_of

# ------------------------------------------------------------------ loops


def test_tokens_are_words_single_symbols_and_single_cjk_characters():
    assert tokens_of("Total: 42 €, 中文字 カナ") == ["Total", ":", "42", "€", ",", "中", "文", "字", "カ", "ナ"]


@pytest.mark.parametrize("text, unit, repeats", [
    ("Intro. " + "| a | b |\n" * 20, "| a | b |", 20.0),             # a table row, over and over
    ("价格表 " + "的" * 60, "的", 60.0),                                  # one CJK character, no spaces
    ("Header\n" + "The same sentence again. " * 12, "The same sentence again .", 12.0),
])
def test_a_tail_loop_is_found_with_its_shortest_unit(text, unit, repeats):
    found = repeated_tail(text)
    assert found is not None and found.unit == unit and found.repeats == repeats
    assert found.covered_tokens == found.unit_tokens * repeats


@pytest.mark.parametrize("text", [
    "Some normal text. " * 3,                                   # 3 repeats of 4 tokens: too short to call a loop
    "A table of contents . . . . . . . . . . 12\nNext line",    # dot leaders, then text: the tail is not a loop
    " ".join(f"word{i}" for i in range(3000)),                  # long, never repeating
    "| 1 | 2 |\n| 3 | 4 |\n| 5 | 6 |\n" * 1,                      # rows that differ
    "",
])
def test_ordinary_text_is_not_a_loop(text):
    assert repeated_tail(text) is None


def test_thresholds_are_both_needed():
    assert repeated_tail("x " * 47) is None and repeated_tail("x " * 48).repeats == 48  # 1-token unit: 48 in a row
    eleven = " ".join(f"t{i}" for i in range(12)) + " "
    assert repeated_tail(eleven * 3) is None and repeated_tail(eleven * 4).unit_tokens == 12  # 4 × 12 = 48


# ------------------------------------------------------------------ inputs


def test_page_ranges():
    assert parse_page_ranges("1,3-5, 10-") == [(1, 1), (3, 5), (10, None)]
    assert pages_in(parse_page_ranges("1,3-5,10-"), 12) == [1, 3, 4, 5, 10, 11, 12]
    assert pages_in(parse_page_ranges("2-40"), 3) == [2, 3]
    assert pages_in(None, 3) == [1, 2, 3]
    for bad in ("0", "5-3", "a", "1-2-3", ""):
        with pytest.raises(ValueError):
            parse_page_ranges(bad)


def test_discover_files_folders_and_globs(tmp_path: Path):
    for name in ("a/one.pdf", "a/b/two.PNG", "a/b/notes.txt", "a/.hidden/three.png", "c/four.jpg", "c/x.tif"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    found = discover([tmp_path / "a", str(tmp_path / "c" / "*.jpg"), tmp_path / "a" / "one.pdf"])
    assert [(f.path.relative_to(tmp_path).as_posix(), f.relative.as_posix()) for f in found] == [
        ("a/one.pdf", "one.pdf"), ("a/b/two.PNG", "b/two.PNG"), ("c/four.jpg", "four.jpg")]  # each once
    assert [f.relative.as_posix() for f in discover([str(tmp_path / "**" / "*.tif")])] == ["c/x.tif"]
    assert [f.path.name for f in discover([tmp_path / "a"], recursive=False)] == ["one.pdf"]
    with pytest.raises(InputNotFound, match="no such file or folder"):
        discover([tmp_path / "missing"])
    with pytest.raises(InputNotFound, match="no image or PDF file matches"):
        discover([str(tmp_path / "*.docx")])


def test_output_folders_mirror_the_inputs_and_never_collide():
    inputs = [InputFile(Path("/z/a.pdf"), PurePath("a.pdf")), InputFile(Path("/x/a.png"), PurePath("a.png")),
              InputFile(Path("/x/sub/b.pdf"), PurePath("sub/b.pdf")), InputFile(Path("/y/b.jpg"), PurePath("c.jpg")),
              InputFile(Path("/x/a.pdf"), PurePath("a.pdf"))]
    expected = {"/x/a.pdf": "a.pdf", "/x/a.png": "a.png", "/x/sub/b.pdf": "sub/b.pdf", "/y/b.jpg": "c.jpg",
                "/z/a.pdf": "a.pdf~2"}  # the same name twice: numbered in path order, not argument order
    assert {str(k): v.as_posix() for k, v in output_folders(inputs).items()} == expected
    assert {str(k): v.as_posix() for k, v in output_folders(inputs[::-1]).items()} == expected


def test_output_folders_stay_with_the_input_whose_output_they_hold():
    inputs = [InputFile(Path("/x/a.pdf"), PurePath("a.pdf")), InputFile(Path("/z/a.pdf"), PurePath("a.pdf"))]
    # /z/a.pdf was converted first, alone: a.pdf is its folder; a folder a.pdf~2 holds something else.
    holders = {"a.pdf": "/z/a.pdf", "a.pdf~2": "/elsewhere/a.pdf"}

    def belongs(item: InputFile, folder: PurePath):
        holder = holders.get(folder.as_posix())
        return None if holder is None else holder == str(item.path)

    assert {str(k): v.as_posix() for k, v in output_folders(inputs, belongs).items()} == {
        "/z/a.pdf": "a.pdf", "/x/a.pdf": "a.pdf~3"}
    holders["a"] = "/x/a.pdf"  # the converter's earlier naming, without the suffix
    assert output_folders(inputs, belongs)[Path("/x/a.pdf")] == PurePath("a")


# ------------------------------------------------------------------ files and manifests


def test_atomic_write_leaves_the_old_file_or_the_new_one(tmp_path: Path):
    target = tmp_path / "d" / "page.md"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and [p.name for p in target.parent.iterdir()] == ["page.md"]


def test_a_writer_killed_mid_write_leaves_only_a_partial_file_that_the_next_run_removes(tmp_path: Path):
    """SIGKILL while the temporary file is being written: the real name keeps its old content."""
    target = tmp_path / "manifest.json"
    atomic_write_text(target, '{"complete": true}')
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "import ocr_bundle.files as f\n"
            "real = os.replace\n"
            "os.replace = lambda *a: os.kill(os.getpid(), 9)  # dies just before the rename\n"
            "f.atomic_write_text(f.Path(%r), 'half')\n") % (str(Path(__file__).resolve().parents[1]), str(target))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert done.returncode == -signal.SIGKILL
    assert json.loads(target.read_text()) == {"complete": True}
    leftovers = [p for p in tmp_path.iterdir() if is_partial(p)]
    assert len(leftovers) == 1 and leftovers[0].read_text() == "half"
    assert remove_partials(tmp_path) == 1 and [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


SETTINGS = ConversionSettings("m", 4096, 200, 1540, "PNG")


def test_a_manifest_resumes_under_the_same_basis_and_keeps_pages_of_another(tmp_path: Path):
    source = tmp_path / "doc.pdf"
    source.write_bytes(b"%PDF-1.7 one")
    folder = tmp_path / "out"
    output, note = DocumentOutput.open(folder, as_input(source), take(source), SETTINGS)
    assert note is None and output.manifest["pages"] == {} and output.known_shape is None
    output.describe("pdf", 3)
    assert output.record_page(2, {"status": "ok"}, "page two")
    assert output.record_page(3, {"status": "failed", "error": "bad -- page"}, None)
    assert (folder / "pages" / "0002.md").read_text() == "page two"

    again, note = DocumentOutput.open(folder, as_input(source), take(source), SETTINGS)
    assert note is None and again.done_pages() == {2} and again.known_shape == ("pdf", 3)
    document = again.write_document().read_text()
    assert document.index("<!-- page 1 not converted yet") < document.index("page two") < document.index(
        "<!-- page 3 not converted: bad — page -->")  # "--" cannot end the comment early

    changed = ConversionSettings("m", 1000, 200, 1540, "PNG")
    stale, note = DocumentOutput.open(folder, as_input(source), take(source), changed)
    assert note == "1 page(s) converted earlier with other settings (max_tokens 4096): kept until converted again"
    assert stale.done_pages() == set() and stale.stale_pages() == [2]
    assert not stale.record_page(2, {"status": "failed", "error": "server down"}, None)  # text is never replaced by nothing
    assert stale.manifest["pages"]["2"]["status"] == "ok" and stale.manifest["pages"]["2"]["redo"]["why"] == "server down"
    assert "page two" in stale.write_document().read_text()
    assert stale.record_page(2, {"status": "ok"}, "page two again")
    assert stale.done_pages() == {2} and stale.stale_pages() == []

    source.write_bytes(b"%PDF-1.7 two")
    other, note = DocumentOutput.open(folder, as_input(source), take(source), changed)
    assert note.endswith("from an earlier version of the file: kept until converted again") and other.known_shape is None
    (folder / "manifest.json").write_text("{ torn")
    torn, note = DocumentOutput.open(folder, as_input(source), take(source), SETTINGS)
    assert note.startswith("its manifest could not be read: moved to manifest.json.unreadable-")
    assert [p.name for p in folder.glob("manifest.json.unreadable-*")] and torn.manifest["pages"] == {}


def test_a_manifest_of_the_first_format_is_upgraded_with_its_pages(tmp_path: Path):
    source = tmp_path / "doc.png"
    source.write_bytes(b"png bytes")
    folder = tmp_path / "out"
    (folder / "pages").mkdir(parents=True)
    (folder / "pages" / "0001.md").write_text("kept")
    atomic_write_json(folder / "manifest.json", {
        "format": 1, "source": str(source), "source_sha256": file_sha256(source), "settings": SETTINGS.as_dict(),
        "kind": "image", "page_count": 1, "error": None,
        "pages": {"1": {"status": "ok", "file": "pages/0001.md"}}})
    output, note = DocumentOutput.open(folder, as_input(source), take(source), SETTINGS)
    assert note is None and output.done_pages() == {1} and output.manifest["format"] == 2


# ------------------------------------------------------------------ retries


def attempt(finish: str | None, tokens: int = 100, loop: Repetition | None = None, temperature: float = 0.2):
    return Attempt(temperature, finish, 2150, tokens, 1.0, loop)


LOOP = Repetition("| a |", 4, 30.0, 120)


def test_the_best_attempt_and_its_flag():
    clean, cut, looping = attempt("stop"), attempt("length", 4096), attempt("length", 4096, LOOP)
    assert clean.clean and not cut.clean and not looping.clean
    assert max([looping, cut, clean], key=Attempt.quality) is clean
    assert max([looping, cut], key=Attempt.quality) is cut  # cut but not looping beats a loop
    shorter_loop = attempt("length", 4096, Repetition("x", 1, 50.0, 50))
    assert max([looping, shorter_loop], key=Attempt.quality) is shorter_loop
    assert flag_of(clean, 4096) is None
    assert flag_of(cut, 4096) == "stopped at max_tokens (4096): the page may have more text"
    assert flag_of(attempt("length", 1900), 4096).startswith("cut at the server's context limit after 1900 tokens")
    assert flag_of(looping, 4096) == "ends in a loop: '| a |' repeated 30 times"
    assert BatchOptions(max_attempts=4).temperatures() == [0.2, 0.4, 0.6, 0.8]
    assert BatchOptions(max_attempts=6, temperature=0.5).temperatures() == [0.5, 0.7, 0.9, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("error, transient", [
    (OcrError("down", "connection"), True),
    (OcrError("slow", "timeout"), True),
    (OcrError("torn", "bad_response"), True),
    (OcrError("overloaded", "http", 503), True),
    (OcrError("too many", "http", 429), True),
    (OcrError("bad image", "http", 400), False),
    (OcrError("no such model", "http", 404), False),
    (OcrError("unreadable", "input"), False),
])
def test_which_errors_are_retried(error, transient):
    assert is_transient(error) is transient


def test_client_cost_says_whether_the_client_limited_the_run():
    fast = [PageStats(render_wall_s=0.1, render_cpu_s=0.09, render_wait_s=0.0, send_cpu_s=0.002, latency_s=10)] * 20
    report = client_cost(fast, render_workers=4, pages_per_s=7.0, concurrency=4)
    assert report["render_capacity_pages_per_s"] == pytest.approx(40)
    assert report["send_capacity_pages_per_s"] == pytest.approx(500)
    assert report["verdict"].startswith("not the bottleneck") and report["render_ms_per_page"] == 100
    slow = [PageStats(render_wall_s=0.5, send_cpu_s=0.002, render_wait_s=0.0, latency_s=10)] * 20
    assert client_cost(slow, 2, 7.0, 4)["verdict"] == (
        "MAY LIMIT THE RESULT: the client could drive ~4.0 pages/s against 7.00 measured "
        "(more --render-workers, or --encoding JPEG)")
    # Waiting for pages after the pipeline filled is the render pool falling behind, whatever its speed.
    waiting = fast[:4] + [PageStats(render_wall_s=0.1, render_wait_s=2.0, send_cpu_s=0.002, latency_s=10)] * 16
    assert "senders waited for pages to be prepared" in client_cost(waiting, 4, 7.0, 4)["verdict"]


def test_render_workers_leave_with_a_killed_converter(tmp_path: Path):
    """A converter killed outright cannot shut its pool down: its workers must not linger."""
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from ocr_bundle.batch.render_pool import RenderPool, PageJob\n"
            "pool = RenderPool(2)\n"
            "jobs = [pool.submit(PageJob('/nonexistent.png', 1, 'image', 'PNG', 200, 1540, 10**6)) for _ in range(4)]\n"
            "[pool.result(job) for job in jobs]\n"
            "print(' '.join(str(pid) for pid in pool.worker_pids()), flush=True)\n"
            "time.sleep(60)\n") % str(Path(__file__).resolve().parents[1])
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert workers
    parent.kill()
    parent.wait()
    from helpers import wait_for

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")

    wait_for(lambda: all(gone(pid) for pid in workers), 10, "the orphaned render workers to exit")

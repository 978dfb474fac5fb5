"""The stress test's threaded replay (ocr_bundle.loadtest.Replayer) against a scripted
server: every request is accounted for, whatever the server does, and identical errors are
counted together. No vLLM here (the fast tier); test_stress.py runs it against the real one."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import stress_test
from ocr_bundle.samples import sample_path
from scripted_server import MODEL, Reply, ScriptedServer

MISBEHAVIOUR = [Reply(), Reply(status=503, error="engine restarting"), Reply(action="reset"),
                Reply(action="malformed"), Reply(status=429, retry_after=1, error="too many requests")]


pytestmark = pytest.mark.usefixtures("no_server_environment")


def stress(url: str, out: Path, *argv: str) -> int:
    return stress_test.main(["--url", url, "--images", str(sample_path("table_screenshot.png")), "--warmup", "0",
                             "--no-stream", "--quiet", "--out", str(out), *argv])


def test_every_request_is_accounted_for_and_errors_are_grouped(tmp_path, capsys):
    with ScriptedServer(responder=lambda request: MISBEHAVIOUR[request.index % len(MISBEHAVIOUR)]) as server:
        code = stress(server.url, tmp_path / "r", "--concurrency", "1,4", "--requests", "20")
        assert server.chat_count() == 40
    assert code == 1  # errors above --max-error-rate 0
    report = json.loads((tmp_path / "r" / "results.json").read_text())
    for level in report["levels"]:
        assert level["requests"] == 20 and level["ok"] + level["errors"] == 20
    errors = {}
    for level in report["levels"]:
        for message, count in level["errors_by_message"].items():
            errors[message] = errors.get(message, 0) + count
    assert sum(errors.values()) == 32 and sum(level["ok"] for level in report["levels"]) == 8
    by_kind = {kind: sum(n for m, n in errors.items() if kind in m)
               for kind in ("(503): engine restarting", "(429): too many requests", "unexpected answer")}
    assert by_kind == {"(503): engine restarting": 8, "(429): too many requests": 8, "unexpected answer": 8}
    assert (tmp_path / "r" / "report.md").exists() and "Traceback" not in capsys.readouterr().err


def test_a_stalled_server_costs_each_request_its_timeout_and_no_more(tmp_path):
    with ScriptedServer(responder=lambda request: Reply(action="stall")) as server:
        code = stress(server.url, tmp_path / "r", "--concurrency", "4", "--requests", "4", "--timeout", "1",
                      "--max-error-rate", "1")
    assert code == 0
    level = json.loads((tmp_path / "r" / "results.json").read_text())["levels"][0]
    assert level["errors"] == 4 and list(level["errors_by_message"]) == [
        f"The vLLM server at {server.url} did not answer in time (read timeout)."]
    assert level["duration_s"] < 5


def test_a_model_the_server_does_not_serve_is_refused_before_any_request(tmp_path, capsys):
    with ScriptedServer() as server:
        code = stress(server.url, tmp_path / "r", "--model", "lightonocr-tny")
        assert server.chat_count() == 0
    assert code == 2
    assert f"does not serve the model 'lightonocr-tny'; it serves '{MODEL}'" in capsys.readouterr().err


def test_a_ramp_spreads_the_first_sends_and_reports_the_sustained_rate(tmp_path, capsys):
    """--ramp 0.4 at concurrency 4 with pages of 0.6 s: the first four sends leave ~0.1 s apart, not together,
    and the level reports the pages answered per second from the first answer to a page sent with every slot
    busy to the last send; without it, none."""
    def slow(request):
        time.sleep(0.6)
        return Reply()

    with ScriptedServer(responder=slow) as server:
        assert stress(server.url, tmp_path / "ramp", "--concurrency", "4", "--requests", "32", "--ramp", "0.4") == 0
        assert stress(server.url, tmp_path / "at-once", "--concurrency", "4", "--requests", "8") == 0
    report = json.loads((tmp_path / "ramp" / "results.json").read_text())
    level = report["levels"][0]
    first = sorted(r["start_s"] for r in report["requests"])[:4]
    gaps = [later - earlier for earlier, later in zip(first, first[1:])]
    assert all(0.05 < gap < 0.2 for gap in gaps), gaps
    sustained = level["sustained"]
    window = sustained["window_s"][1] - sustained["window_s"][0]
    assert sustained["pages"] >= 4 and sustained["pages_per_s"] == pytest.approx(sustained["pages"] / window)
    assert 2 < sustained["pages_per_s"] < 4 / 0.6 + 0.5  # four slots of pages of 0.6 s: 6.7 a second at most
    assert "sustained pages/s" in (tmp_path / "ramp" / "report.md").read_text()
    assert f"sustained {sustained['pages_per_s']:.2f} pages/s" in capsys.readouterr().out
    assert json.loads((tmp_path / "at-once" / "results.json").read_text())["levels"][0]["sustained"] is None


@pytest.mark.parametrize("ramp", ["-1", "nan", "soon"])
def test_a_ramp_that_is_no_number_of_seconds_is_refused(tmp_path, capsys, ramp):
    with pytest.raises(SystemExit) as exited:
        stress("http://127.0.0.1:9", tmp_path / "r", "--ramp", ramp)
    assert exited.value.code == 2 and "--ramp" in capsys.readouterr().err

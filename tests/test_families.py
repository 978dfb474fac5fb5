"""The model families (ocr_bundle/families.py): which LightOnOCR a model is, what the launcher
serves it with, and the sizes it refuses (fast tier: no server)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import PYTHON, ROOT
from ocr_bundle.families import FAMILIES, FamilyError, family_of
from ocr_bundle.serve import launch as launcher


@pytest.mark.parametrize("model, family", [
    ("lightonai/LightOnOCR-2-1B", "LightOnOCR-2-1B"),
    ("lightonai/LightOnOCR-2-1B-bbox", "LightOnOCR-2-1B-bbox"),
    ("lightonai/LightOnOCR-3-1B", "LightOnOCR-3-1B"),
    ("/models/LightOnOCR-3-1B", "LightOnOCR-3-1B"),  # a local copy named like the hub's
    ("/models/lightonocr-3-1b-awq", "LightOnOCR-3-1B"),  # a variant of it
    ("models/lightonocr-tiny", "LightOnOCR-2-1B"),  # the generated test checkpoints
    ("someone/other-ocr", "LightOnOCR-2-1B"),
])
def test_a_model_is_matched_by_its_name(model, family):
    assert family_of(model).name == family


def test_the_table_holds_each_familys_settings():
    by_name = {f.name: f for f in FAMILIES}
    three, two = by_name["LightOnOCR-3-1B"], by_name["LightOnOCR-2-1B"]
    assert (three.max_model_len, three.temperature, three.top_p, three.grounding) == (16384, 0.1, 1.0, "blocks")
    assert (two.max_model_len, two.temperature, two.top_p, two.grounding) == (8192, 0.2, 0.9, None)
    assert by_name["LightOnOCR-2-1B-bbox"].grounding == "images"
    assert {f.longest_edge for f in FAMILIES} == {1540}
    assert three.describe() == ("LightOnOCR-3-1B: max_model_len 16384, sampling temperature 0.1 top_p 1, "
                                "longest edge 1540 px, grounding (layout blocks)")


def test_a_local_checkpoint_is_matched_by_its_config(tmp_path: Path):
    folder = tmp_path / "my-ocr"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "lightonai/LightOnOCR-3-1B",
                                                    "architectures": ["LightOnOCRForConditionalGeneration"]}))
    assert family_of(str(folder)).name == "LightOnOCR-3-1B"
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]}))
    with pytest.raises(FamilyError, match="Qwen3.5-VL model"):
        family_of(str(folder))


@pytest.mark.parametrize("model", ["lightonai/LightOnOCR-3-0.8B", "lightonai/LightOnOCR-3-4B"])
def test_the_qwen35_sizes_are_refused_saying_which_vllm_has_them(model):
    with pytest.raises(FamilyError) as refused:
        family_of(model)
    assert "vLLM 0.26.0, pinned here, has that architecture" in str(refused.value)
    assert "use LightOnOCR-3-1B" in str(refused.value)


def test_family_overrides_the_match_and_a_typo_is_refused():
    assert family_of("/models/custom", "lightonocr-3-1b").name == "LightOnOCR-3-1B"
    with pytest.raises(FamilyError, match="unknown model family 'LightOnOCR-3'"):
        family_of("/models/custom", "LightOnOCR-3")


def launcher_command(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "start_vllm_server.py"), "--device", "cuda", "--dry-run", *argv],
                          capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "MAX_MODEL_LEN"},
                               "DATA_PARALLEL_SIZE": "1", **(env or {})})


def test_the_launcher_serves_3_1b_with_its_own_context_and_says_which_family():
    three = launcher_command("--model", "lightonai/LightOnOCR-3-1B")
    assert three.returncode == 0, three.stderr
    assert "--max-model-len 16384" in three.stdout
    assert "[start_vllm_server] model family: LightOnOCR-3-1B: max_model_len 16384" in three.stdout
    asked = launcher_command("--model", "lightonai/LightOnOCR-3-1B", env={"MAX_MODEL_LEN": "12000"})
    assert "--max-model-len 12000" in asked.stdout  # what the user asks wins, and the banner says so
    assert "model family: LightOnOCR-3-1B: max_model_len 12000 (asked; the family's is 16384)" in asked.stdout
    two = launcher_command("--model", "lightonai/LightOnOCR-2-1B")
    assert "--max-model-len 8192" in two.stdout and "model family: LightOnOCR-2-1B:" in two.stdout


def test_the_launcher_refuses_a_qwen35_size_before_anything_starts():
    refused = launcher_command("--model", "lightonai/LightOnOCR-3-4B")
    assert refused.returncode == 2 and "Qwen3.5-VL model" in refused.stderr and "backend:" not in refused.stdout


def test_the_command_builder_takes_the_familys_context_when_none_was_asked(monkeypatch):
    monkeypatch.delenv("MAX_MODEL_LEN", raising=False)
    args = launcher.build_parser().parse_args(["--model", "lightonai/LightOnOCR-3-1B"])
    command, _ = launcher.build_command(args, [], "cuda")
    assert command[command.index("--max-model-len") + 1] == "16384"


# ------------------------------------------------------------------ clients take the served family's sampling


@pytest.fixture
def three_1b():
    """A scripted server serving LightOnOCR-3-1B by its hub id."""
    from scripted_server import ScriptedServer

    with ScriptedServer(models=("lightonai/LightOnOCR-3-1B",)) as running:
        yield running


@pytest.mark.usefixtures("no_server_environment")
def test_the_converter_and_the_stress_test_sample_as_the_served_family_unless_told(three_1b, tmp_path, capsys):
    import batch_ocr
    import stress_test
    from ocr_bundle.samples import sample_path

    image = sample_path("table_screenshot.png")
    assert batch_ocr.main(["--url", three_1b.url, "--out", str(tmp_path / "a"), "--quiet", str(image),
                           "--max-attempts", "1"]) == 0
    sent = three_1b.requests[-1].body
    assert (sent["temperature"], sent["top_p"]) == (0.1, 1.0)
    assert "(temperature 0.1, top_p 1)" in capsys.readouterr().err
    assert batch_ocr.main(["--url", three_1b.url, "--out", str(tmp_path / "b"), "--quiet", str(image),
                           "--max-attempts", "1", "--temperature", "0.3"]) == 0
    assert three_1b.requests[-1].body["temperature"] == 0.3
    assert stress_test.main(["--url", three_1b.url, "--images", str(image), "--warmup", "0", "--requests", "1",
                             "--concurrency", "1", "--no-stream", "--quiet", "--out", str(tmp_path / "s")]) == 0
    sent = three_1b.requests[-1].body
    assert (sent["temperature"], sent["top_p"]) == (0.1, 1.0)
    assert "(LightOnOCR-3-1B: temperature 0.1, top_p 1)" in capsys.readouterr().out


def test_a_client_of_a_model_this_bundle_does_not_name_samples_as_lightonocr_2():
    from ocr_bundle.client import ServerStatus

    status = ServerStatus(True, ("lightonocr-tiny", "served-name"), ("/models/lightonocr-tiny", "/m/LightOnOCR-3-1B"))
    assert status.family("lightonocr-tiny").name == "LightOnOCR-2-1B"
    assert status.family("served-name").name == "LightOnOCR-3-1B"  # its checkpoint says which
    assert ServerStatus(True, ("lightonai/LightOnOCR-3-4B",)).family("lightonai/LightOnOCR-3-4B").name == "LightOnOCR-2-1B"


@pytest.mark.usefixtures("no_server_environment")
def test_the_stress_test_sends_grounding_requests_when_asked_and_says_so(three_1b, tmp_path, server):
    import stress_test
    from ocr_bundle.samples import sample_path

    image = str(sample_path("table_screenshot.png"))
    common = ["--images", image, "--warmup", "0", "--requests", "2", "--concurrency", "1", "--no-stream", "--quiet"]
    assert stress_test.main(["--url", three_1b.url, *common, "--grounding", "--out", str(tmp_path / "g")]) == 0
    assert all(r.body["messages"][0]["content"][1] == {"type": "text", "text": "grounding"} for r in three_1b.requests)
    assert "grounding requests (layout blocks)" in (tmp_path / "g" / "report.md").read_text()
    assert stress_test.main(["--url", server.url, *common, "--grounding", "--out", str(tmp_path / "p")]) == 2

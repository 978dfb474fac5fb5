"""The generated checkpoint has LightOnOCR-2-1B's layout and loads with transformers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_vllm  # torch, transformers, safetensors: the CPU environment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import make_checkpoint  # noqa: E402


def test_full_preset_has_the_real_parameter_count():
    count = make_checkpoint.parameter_count("full")
    assert 0.95e9 <= count <= 1.05e9, count


def test_full_preset_config_matches_the_published_dims():
    config = make_checkpoint.build_config_dict(make_checkpoint.PRESETS["full"])
    text, vision = config["text_config"], config["vision_config"]
    assert config["model_type"] == "mistral3"
    assert config["architectures"] == ["LightOnOCRForConditionalGeneration"]
    assert config["image_token_id"] == 151655 and config["spatial_merge_size"] == 2
    assert (text["model_type"], text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"],
            text["num_key_value_heads"], text["head_dim"], text["vocab_size"], text["tie_word_embeddings"]) == (
        "qwen3", 1024, 28, 16, 8, 128, 151936, True)
    assert (vision["model_type"], vision["hidden_size"], vision["num_hidden_layers"], vision["num_attention_heads"],
            vision["head_dim"], vision["patch_size"], vision["image_size"]) == ("pixtral", 1024, 24, 16, 64, 14, 1540)


def test_configs_keep_the_published_rope_names_that_every_transformers_reads():
    """transformers 5.19 renames the vision rope_type "default" to "axial" in the dict it is handed; the reader
    fixture once shipped that, and vLLM 0.26.0's transformers (5.16) refused to start it on the GPU machine. The
    generator hands transformers copies, and every committed checkpoint says what the published model says."""
    config = make_checkpoint.build_config_dict(make_checkpoint.PRESETS["tiny"])
    written = json.loads(json.dumps(config))
    make_checkpoint.hf_config_from(config)
    assert config == written
    fixtures = Path(__file__).resolve().parent / "fixtures"
    for config_file in sorted(fixtures.glob("*/config.json")):
        committed = json.loads(config_file.read_text())
        ropes = {part: committed[part]["rope_parameters"]["rope_type"] for part in ("text_config", "vision_config")}
        assert ropes == {"text_config": "default", "vision_config": "default"}, config_file


def test_tiny_checkpoint_files_and_weight_names(tiny_checkpoint: Path):
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["model_type"] == "mistral3"
    assert config["text_config"]["head_dim"] == 64  # 16 crashes vLLM's CPU attention
    processor = json.loads((tiny_checkpoint / "processor_config.json").read_text())
    assert processor["processor_class"] == "PixtralProcessor"
    assert (processor["image_token"], processor["image_break_token"], processor["image_end_token"]) == (
        "<|image_pad|>", "<|vision_pad|>", "<|vision_end|>")
    from safetensors import safe_open

    with safe_open(str(tiny_checkpoint / "model.safetensors"), "pt") as weights:
        prefixes = {".".join(name.split(".")[:2]) for name in weights.keys()}
    assert prefixes == {"model.vision_encoder", "model.vision_projection", "model.language_model"}


def test_tiny_checkpoint_loads_with_transformers_and_tokenizes_the_chat(tiny_checkpoint: Path):
    from transformers import AutoProcessor, LightOnOcrForConditionalGeneration

    model = LightOnOcrForConditionalGeneration.from_pretrained(tiny_checkpoint)
    assert model.config.text_config.hidden_size == 128
    processor = AutoProcessor.from_pretrained(tiny_checkpoint)
    ids = make_checkpoint.special_token_ids(2048)
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == ids["<|image_pad|>"]
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}]}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\n<|image_pad|><|im_end|>\n<|im_start|>assistant\n"
    # Every id the model can sample decodes to something (random weights sample anything).
    assert processor.tokenizer.decode([0, 5, 2047 - 300]).strip() != ""


def test_generation_is_deterministic(tmp_path: Path):
    first, second = tmp_path / "a", tmp_path / "b"
    make_checkpoint.write_checkpoint("tiny", first, seed=3)
    make_checkpoint.write_checkpoint("tiny", second, seed=3)
    from safetensors import safe_open

    with safe_open(str(first / "model.safetensors"), "pt") as a, safe_open(str(second / "model.safetensors"), "pt") as b:
        name = "model.language_model.embed_tokens.weight"
        assert a.get_tensor(name).equal(b.get_tensor(name))


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_presets_keep_special_tokens_inside_the_vocab(preset: str):
    vocab = make_checkpoint.PRESETS[preset].vocab_size
    assert all(0 <= i < vocab for i in make_checkpoint.special_token_ids(vocab).values())

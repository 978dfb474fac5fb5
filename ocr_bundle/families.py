"""The LightOnOCR models this bundle serves, and what each needs: one table.

    family                 hub id                           max_model_len  sampling (temp / top_p)  grounding
    LightOnOCR-2-1B        lightonai/LightOnOCR-2-1B        8192           0.2 / 0.9                none
    LightOnOCR-2-1B-bbox   lightonai/LightOnOCR-2-1B-bbox   8192           0.2 / 0.9                embedded images' boxes
    LightOnOCR-3-1B        lightonai/LightOnOCR-3-1B        16384          0.1 / 1.0                layout blocks

All three are the Pixtral vision encoder and a Qwen3 decoder (vLLM's
LightOnOCRForConditionalGeneration), pages prepared at a longest edge of 1540 px. The 3-1B
context is LightOn's (its `max_position_embeddings`, up to 12,288 output tokens in LightOn's
harness), and so is each generation's sampling. LightOnOCR-3-0.8B and -4B are Qwen3.5-VL
models: vLLM has their architecture (Qwen3_5ForConditionalGeneration, in 0.26.0 as pinned
here), but this bundle's page preparation, encoder patch and tuning are made for the Pixtral
models, so they are refused with that said rather than served half right.

A model is matched by its hub id, or a local checkpoint by its folder name and its config
(`_name_or_path`, architectures); anything else of the LightOnOCR architecture is taken for
2-1B (the generated test checkpoints are). `--family` overrides the match. Standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    name: str
    hub_id: str
    max_model_len: int
    temperature: float
    top_p: float
    longest_edge: int
    grounding: str | None  # None; "images" (2-1B-bbox: boxes of embedded images); "blocks" (3: layout blocks)

    def describe(self, max_model_len: int | None = None) -> str:
        """One line for the start banner; `max_model_len`: what the server was started with, when asked otherwise."""
        grounding = {None: "no grounding", "images": "boxes of embedded images",
                     "blocks": "grounding (layout blocks)"}[self.grounding]
        context = f"max_model_len {max_model_len or self.max_model_len}" + (
            f" (asked; the family's is {self.max_model_len})" if max_model_len not in (None, self.max_model_len) else "")
        return (f"{self.name}: {context}, sampling temperature {self.temperature:g} top_p {self.top_p:g}, "
                f"longest edge {self.longest_edge} px, {grounding}")


FAMILIES = (
    Family("LightOnOCR-2-1B", "lightonai/LightOnOCR-2-1B", 8192, 0.2, 0.9, 1540, None),
    Family("LightOnOCR-2-1B-bbox", "lightonai/LightOnOCR-2-1B-bbox", 8192, 0.2, 0.9, 1540, "images"),
    Family("LightOnOCR-3-1B", "lightonai/LightOnOCR-3-1B", 16384, 0.1, 1.0, 1540, "blocks"),
)
DEFAULT = FAMILIES[0]
BY_NAME = {family.name.lower(): family for family in FAMILIES}
# The other LightOnOCR-3 sizes and why they are not served here.
QWEN35_SIZES = ("LightOnOCR-3-0.8B", "LightOnOCR-3-4B")
QWEN35_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")


class FamilyError(ValueError):
    """A model this bundle does not serve (or a --family it does not know); the message says why."""


def _qwen35_refusal(what: str) -> FamilyError:
    return FamilyError(f"{what} is a Qwen3.5-VL model (Qwen3_5ForConditionalGeneration). vLLM 0.26.0, pinned here, "
                       "has that architecture, but this bundle prepares pages, patches the encoder and tunes "
                       "the server for the Pixtral-encoder models (LightOnOCR-2-1B, -2-1B-bbox, -3-1B): serve "
                       "it with `vllm serve` directly, or use LightOnOCR-3-1B")


def _name_match(text: str) -> Family | None:
    """The family a hub id or folder name names: the longest name it contains (2-1B-bbox before 2-1B)."""
    lowered = text.lower()
    for size in QWEN35_SIZES:
        if re.search(re.escape(size.lower()) + r"(?![\w.])", lowered):
            raise _qwen35_refusal(size)
    found = [family for family in FAMILIES if re.search(re.escape(family.name.lower()) + r"(?![\w.])", lowered)]
    return max(found, key=lambda family: len(family.name)) if found else None


def family_of(model: str, override: str | None = None) -> Family:
    """The family of a hub id or local checkpoint folder; `override` (a family's name) wins."""
    if override and override != "auto":
        family = BY_NAME.get(override.lower())
        if family is None:
            raise FamilyError(f"unknown model family {override!r}: one of {', '.join(f.name for f in FAMILIES)}")
        return family
    config = _config_of(model)
    architectures = config.get("architectures") or []
    if any(architecture in QWEN35_ARCHITECTURES for architecture in architectures):
        raise _qwen35_refusal(model)
    for name in (Path(model).name, model, str(config.get("_name_or_path") or "")):
        if name and (family := _name_match(name)):
            return family
    return DEFAULT


def served_family(model: str, weights: str | None = None) -> Family:
    """A client's view: the family of a model a server serves, from its name and the checkpoint it
    loaded (/v1/models' "root"). LightOnOCR-2-1B's when neither says, and for a model not served
    by this bundle (a client still talks to it, with the default sampling)."""
    for name in filter(None, (weights, model)):
        try:
            if family := _name_match(name):
                return family
        except FamilyError:
            return DEFAULT
    return DEFAULT


def _config_of(model: str) -> dict:
    """A local checkpoint's config.json ({} for a hub id or a folder without one)."""
    path = Path(model).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}

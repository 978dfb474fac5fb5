"""The bundled sample pages (drawn by scripts/make_samples.py)."""

from __future__ import annotations

from pathlib import Path

from .inputs import discover

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"
SAMPLE_NAMES = ("english_a4_document.png", "chinese_mixed_flyer.png", "table_screenshot.png")


def sample_path(name: str) -> Path:
    return SAMPLES_DIR / name


def sample_paths() -> list[Path]:
    return [sample_path(name) for name in SAMPLE_NAMES]


def find_images(sources: list[str | Path] | None) -> list[Path]:
    """Files given, the image/PDF files inside folders given (not below), glob matches; the
    samples when none. Raises FileNotFoundError (inputs.InputNotFound) when there is nothing."""
    if not sources:
        return sample_paths()
    found = [item.path for item in discover(sources, recursive=False)]
    if not found:
        raise FileNotFoundError(f"no image or PDF files in {', '.join(map(str, sources))}")
    return found

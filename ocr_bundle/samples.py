"""The bundled sample pages (drawn by scripts/make_samples.py)."""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "samples"
SAMPLE_NAMES = ("english_a4_document.png", "chinese_mixed_flyer.png", "table_screenshot.png")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif", ".pdf")


def sample_path(name: str) -> Path:
    return SAMPLES_DIR / name


def sample_paths() -> list[Path]:
    return [sample_path(name) for name in SAMPLE_NAMES]


def find_images(sources: list[str | Path] | None) -> list[Path]:
    """Files given, and the image/PDF files inside folders given; the samples when none."""
    if not sources:
        return sample_paths()
    found: list[Path] = []
    for source in map(Path, sources):
        if source.is_dir():
            found += sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        elif source.is_file():
            found.append(source)
        else:
            raise FileNotFoundError(f"no such file or folder: {source}")
    if not found:
        raise FileNotFoundError(f"no image or PDF files in {', '.join(map(str, sources))}")
    return found

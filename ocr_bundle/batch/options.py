"""What a batch run is asked to do (batch_ocr.py's flags, as the pipeline takes them)."""

from __future__ import annotations

from dataclasses import dataclass

TEMPERATURE_STEP = 0.2
MAX_TEMPERATURE = 1.0


@dataclass(frozen=True)
class BatchOptions:
    concurrency: int = 64
    render_workers: int = 2
    max_attempts: int = 4
    temperature: float = 0.2
    top_p: float = 0.9
    max_bytes: int = 1024 * 10**6  # --max-file-mb's default, in its unit (10^6 bytes)
    pages: list[tuple[int, int | None]] | None = None  # ocr_bundle.inputs.parse_page_ranges
    force: bool = False
    redo_flagged: bool = False
    max_transport_retries: int = 5
    server_wait_s: float = 180.0
    drain_s: float = 60.0
    drop: frozenset[str] = frozenset()  # grounded blocks left out of the assembled documents (--drop)

    def temperatures(self) -> list[float]:
        """0.2 → 0.4 → 0.6 → 0.8 for four attempts from LightOn's 0.2."""
        return [round(min(self.temperature + TEMPERATURE_STEP * i, MAX_TEMPERATURE), 3)
                for i in range(self.max_attempts)]

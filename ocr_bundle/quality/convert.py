"""The benchmark's PDFs through the server with the bundle's own converter, one run per repeat.

Each repeat is the batch converter (`python -m ocr_bundle.batch`, what batch_ocr.py runs) over
BENCH/pdfs into RUN/convert/repeat<r>, as a user would run it:
the same page preparation (200 DPI, longest edge 1540 px), client, retries of looping or cut
pages, and resumable output, so an interrupted check converts only what is left. The
Markdown of a page is read back from the converter's manifest: only pages done under the
run's own settings count (a page kept from other settings is not this profile's).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..batch.identity import relative_of
from ..batch.manifest import DONE, MANIFEST, DocumentOutput
from ..client import OcrClient
from ..settings import ENV_API_KEY, child_environment
from .bench import Bench

BUNDLE_ROOT = Path(__file__).resolve().parents[2]  # where the ocr_bundle package is imported from


@dataclass(frozen=True)
class ClientSettings:
    """The client's side of a profile: what batch_ocr.py is given."""

    max_tokens: int
    dpi: int
    temperature: float
    max_attempts: int
    grounding: bool = False  # LightOnOCR-3's layout blocks; the Markdown scored is made from them
    drop: tuple[str, ...] = ()  # grounded blocks left out of the Markdown scored (e.g. header, footer)

    def as_dict(self) -> dict:
        """The client's side of the profile; grounding and drop only when used (runs before them resume)."""
        out = asdict(self)
        for key in ("grounding", "drop"):
            if not out[key]:
                del out[key]
        return out

    def batch_arguments(self) -> list[str]:
        return (["--max-tokens", str(self.max_tokens), "--dpi", str(self.dpi), "--temperature", str(self.temperature),
                 "--max-attempts", str(self.max_attempts)] + (["--grounding"] if self.grounding else []))


def repeat_folder(run: Path, repeat: int) -> Path:
    return run / "convert" / f"repeat{repeat}"


def convert_repeat(bench: Bench, run: Path, repeat: int, client: OcrClient, settings: ClientSettings,
                   concurrency: int, quiet: bool) -> int:
    """batch_ocr.py over the benchmark's PDFs, against the client's server and model; its exit status
    (0, 1 some page failed, 2 cannot start, 130 interrupted). The key goes through the environment,
    never the command line."""
    command = [sys.executable, "-m", "ocr_bundle.batch", str(bench.pdf_folder), "--out", str(repeat_folder(run, repeat)),
               "--url", client.base_url, "--model", client.model(), "--concurrency", str(concurrency),
               *settings.batch_arguments(), *(["--ca-cert", client.trust.ca] if client.trust.ca else [])]
    if quiet:
        command.append("--quiet")
    env = child_environment(**{ENV_API_KEY: client.api_key,
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(BUNDLE_ROOT),
                                                                           os.environ.get("PYTHONPATH")]))})
    process = subprocess.Popen(command, env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the converter too: let it write what it has and stop
        return process.wait()


def converted_pages(bench: Bench, run: Path, repeats: int,
                    drop: frozenset[str] = frozenset()) -> tuple[dict[tuple[str, int, int], str], int]:
    """{(pdf, page, repeat): Markdown} for every page done under the run's settings in every repeat, and
    how many page conversions of the benchmark's PDFs are not there (failed, left pending, never
    converted, or done in some repeats only). A grounded page's Markdown leaves out the blocks in `drop`."""
    names = set(bench.pdfs)  # each PDF's path relative to the folder the converter was given: its identity
    texts: dict[tuple[str, int, int], str] = {}
    expected = 0
    for repeat in range(1, repeats + 1):
        counts: dict[str, int] = {}
        for manifest_path in sorted(repeat_folder(run, repeat).rglob(MANIFEST)):
            output = DocumentOutput.load(manifest_path.parent)
            manifest = output.manifest if output else None
            name = relative_of(manifest) if manifest else None
            if name not in names:
                continue
            counts[name] = manifest.get("page_count") or 1
            for page in sorted(output.done_pages(DONE)):
                texts[(name, page, repeat)] = output.page_markdown(manifest["pages"][str(page)], drop)[0]
        expected += sum(counts.get(name, 1) for name in bench.pdfs)
    # A page is this profile's only with every repeat: one missing from a repeat is missing (the scorer's
    # majority over repeats would otherwise read an absent repeat as a pass or a fail).
    complete = {(name, page) for name, page, _ in texts
                if all((name, page, repeat) in texts for repeat in range(1, repeats + 1))}
    texts = {key: text for key, text in texts.items() if key[:2] in complete}
    return texts, expected - len(texts)

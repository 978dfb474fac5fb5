"""Render workers that fail on demand, for the render pool's crash handling.

`marked_work` is the pool's real job function (ocr_bundle.batch.render_pool.do_job), except for
files whose name asks for a fault:
- `crash-p3.pdf` (or `crash-p3_7.pdf`): the worker dies hard (SIGKILL, what a pdfium
  segfault looks like from outside) when it prepares page 3 (or 3 and 7);
- `crash-count.pdf`: it dies when the file's pages are counted;
- `stall-p2.pdf`: it never finishes page 2.
It must live in an importable module: the pool's workers are spawned, and import it by name.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from ocr_bundle.batch.render_pool import CountJob, Job, Outcome, do_job


def _marked_pages(name: str, fault: str) -> set[int]:
    found = re.search(rf"{fault}-p([\d_]+)", name)
    return {int(n) for n in found.group(1).split("_") if n} if found else set()


def marked_work(job: Job) -> Outcome:
    name = Path(job.path).name
    if isinstance(job, CountJob):
        if "crash-count" in name:
            os.kill(os.getpid(), signal.SIGKILL)
    elif job.page in _marked_pages(name, "crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif job.page in _marked_pages(name, "stall"):
        time.sleep(3600)
    return do_job(job)

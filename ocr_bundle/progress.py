"""The progress bar of the stress test's levels and the batch converter's pages, one style."""

from __future__ import annotations

import sys


def progress_bar(total: int, unit: str, desc: str, disable: bool = False, postfix: str | None = None):
    """A tqdm bar on stderr (stdout stays for results): count, rate, ETA. Redrawn every
    0.5 s on a terminal, every 10 s into a log file."""
    from tqdm import tqdm  # here: the page and the library users never need it

    return tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, smoothing=0.05, file=sys.stderr,
                disable=disable, postfix=postfix, mininterval=0.5 if sys.stderr.isatty() else 10)

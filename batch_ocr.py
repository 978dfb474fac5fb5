#!/usr/bin/env python3
"""Convert folders of PDFs and scans into Markdown through the vLLM server: resumable, loop-safe,
one corpus across many machines (--shard K/N), and --status OUT to prove it finished.

    python batch_ocr.py --help      # every flag, with examples

The converter itself is ocr_bundle/batch (cli: its command line; also `python -m ocr_bundle.batch`).
"""

import sys

from ocr_bundle.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m ocr_bundle.batch ...`: the batch converter, as batch_ocr.py runs it (the quality check calls it so)."""

import sys

from .cli import main

sys.exit(main())

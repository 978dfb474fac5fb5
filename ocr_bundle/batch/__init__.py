"""The batch converter (batch_ocr.py): the pipeline (pipeline), page-preparing worker
processes (render_pool), resumable output (manifest), loop detection (repetition) and the
run summary (summary)."""

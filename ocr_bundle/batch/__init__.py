"""The batch converter (batch_ocr.py): its command line (cli), the pipeline (pipeline),
page-preparing worker processes (render_pool), resumable output (manifest: pages journaled,
the manifest compacted), one writer per document folder (locking), loop detection
(repetition), the run summary (summary) and a corpus's state (status: --status)."""

"""Shared code of the LightOnOCR-2-1B serving bundle.

Small modules, one job each, used by the page (app_vllm.py), the stress test
(stress_test.py) and the launcher (start_vllm_server.py):

- images:   turn uploads (images, PDFs) into the page images the model expects
- client:   the OpenAI-compatible HTTP client for vLLM (status, streaming OCR, errors)
- samples:  the bundled sample pages and image-folder discovery
- sampling: background samplers: GPU memory (NVML, nvidia-smi, none) and vLLM's /metrics
- loadtest: the stress test's threaded replay and its metrics (a pure function of results)
- report:   table, JSON, Markdown, plot and before/after comparison
- vllm_patches, vllm_serve: the fixes the launcher applies to vLLM (packed vision-encoder
  attention) and the wrapper that starts vLLM with them in every process
"""

"""Shared code of the LightOnOCR-2-1B serving bundle.

Small modules, one job each, used by the page (app_vllm.py), the stress test
(stress_test.py) and the launcher (start_vllm_server.py):

- images:     turn uploads (images, PDFs) into the page images the model expects
- client:     the OpenAI-compatible HTTP client for vLLM (health, streaming OCR, errors)
- gpu_memory: background GPU memory sampler (NVML, nvidia-smi fallback, none)
- vllm_metrics: parse vLLM's Prometheus /metrics
- loadtest / report: the stress test's runner, metrics and reports
"""

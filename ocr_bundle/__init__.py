"""Shared code of the LightOnOCR-2-1B serving bundle.

Small modules, one job each, used by the page (app_vllm.py), the stress test
(stress_test.py), the batch converter (batch_ocr.py), the launcher (start_vllm_server.py)
and the start/stop scripts:

- settings:     the one registry: model id, token budgets, URLs, timeouts, env precedence
- images:       turn uploads (images, PDFs) into the page images the model expects
- client:       the OpenAI-compatible HTTP client for vLLM (status, streaming OCR, errors)
- inputs:       files, folders and globs → input files; PDF page ranges; output folder names
- samples:      the bundled sample pages
- pollers:      background pollers: GPU memory per device (NVML, nvidia-smi, none), vLLM's /metrics
- loadtest:     the stress test's threaded replay and its metrics (a pure function of results)
- report:       stress-test table, JSON, Markdown, plot and before/after comparison
- batch, render_pool, manifest, repetition, batch_report: the batch converter's pipeline,
                its page-rendering processes, its resumable output, loop detection, summary
- files:        atomic writes (never half a file, even after SIGKILL)
- processes:    PID files with start times, readiness waits, group stops (shell, tests, GPU driver)
- scaleout:     vLLM data parallelism: replicas per node, head and headless workers
- attention, tuning: the launcher's GPU choices beyond vLLM's defaults, each where it was
                measured to win (attention kernels; KV block size, compiled vision encoder)
- warmup:       one page per engine before the start script says the server is ready
- vllm_patches, vllm_serve: the fix the launcher applies to vLLM 0.26.0 (packed vision-encoder
                attention, optionally compiled) and the wrapper that starts vLLM with it in
                every process
"""

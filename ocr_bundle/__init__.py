"""Shared code of the LightOnOCR serving bundle, grouped by where it runs.

The entry scripts beside this folder only parse arguments and print; the logic is here.

Core, used everywhere (the first group is standard library only: the shell scripts and the
launcher import it with any python3, before vLLM's Python is known):
- settings:   the one registry: model id, token budgets, URLs, timeouts, env precedence
- families:   the LightOnOCR models served (2-1B, 2-1B-bbox, 3-1B): context, sampling, grounding
- exposure:   beyond loopback, the API needs a key and the page a login, both HTTPS; the gateway's
              pool an admin key; the one decision, and the address helpers (loopback, all interfaces)
- tls:        certificates and trust: which CA a client verifies with, the checks of a machine's
              certificate before it serves, and messages that say what did not match
- files:      atomic (and durable) writes: never half a file
- inputs:     files, folders and globs → input files; page ranges; output folder names
- interrupts: Ctrl-C for long runs (the first stops gracefully, the second at once)
- samples:    the bundled sample pages
- draining:   waiting for worker threads, with a deadline once a stop is asked for
- headroom:   could the client have limited what it measured? (one verdict)
- tables:     aligned and Markdown tables (the stress test's and the quality check's reports)
- prometheus: Prometheus text (vLLM's and the gateway's metrics), read once for every caller
- grounding:  LightOnOCR-3's grounding replies → layout blocks (never raises), their Markdown
and client side (requests, Pillow, pypdfium2, tqdm):
- client:     the OpenAI-compatible HTTP client for vLLM (status, server and model, OCR, errors)
- images:     uploads (images, PDFs, multi-page TIFFs) → the page images the model expects
- progress:   the progress bar
- page:       the page's handlers and layout (app_vllm.py runs it), grounding drawn on the page
- page_guard: the page's login hardened: its cookie Secure only over HTTPS, failed logins slowed

serve/    the server side: the launcher's decisions, scale-out, attention and tuning
          choices, process control, the warm-up page, the vLLM patch and the every-route
          key with their entry, the gateway, its door table (from SMG itself) and each
          server's membership in it
          (standard library only, but warmup, a client)
loadtest/ the stress test: threaded replay and metrics, GPU and /metrics pollers, reports
batch/    the batch converter: command line, options, scan, a document's identity, a page's
          attempts, the server watch, the run (pipeline), render processes, resumable output
          (page journal, manifest), document locks, loop detection, run summary, --status
api/      the document API (python -m ocr_bundle.api): Mistral-OCR-compatible POST /v1/ocr on the
          converter's parts; the request and its refusals, fair slots across requests, the routes and
          their key, and the page's client of it
quality/  the quality check: olmOCR-Bench folders, conversion through the batch converter, olmocr's
          scorer, the serving profile a run records, paired comparison, reports
"""

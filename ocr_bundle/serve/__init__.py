"""The server side: what runs before vLLM starts and inside its processes.

- launch:       start_vllm_server.py's decisions: flags, checkpoint check, known-bad version
                pairs, KV-cache sizing, the vLLM command
- scaleout:     vLLM data parallelism: replicas per node, head and headless workers
- attention, tuning: the GPU choices beyond vLLM's defaults, each where it was measured to win
- processes:    PID files with start times, readiness waits, group stops (shell scripts, tests)
- vllm_patches, vllm_serve: the fix applied to vLLM 0.26.0 and the entry that applies it in
                every vLLM process
- warmup:       one page per engine before the start script says ready (a client: requests)

Standard library only, except warmup: the start script and the launcher import these with
any python3, before they know which Python has vLLM (tests/test_layout.py checks it).
"""

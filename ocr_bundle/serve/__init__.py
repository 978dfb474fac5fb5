"""The server side: what runs before vLLM starts, inside its processes, and beside it.

- launch:       start_vllm_server.py's decisions: flags, checkpoint check, known-bad version
                pairs, the vLLM versions a key may be served on, KV-cache sizing, the vLLM command
- scaleout:     vLLM data parallelism: one engine replica per GPU of this machine
- attention, tuning: the GPU choices beyond vLLM's defaults, each where it was measured to win
- processes:    PID files with start times, readiness waits, group stops (shell scripts, tests)
- vllm_patches: the fix applied to vLLM 0.26.0 (packed Pixtral encoder attention)
- route_keys:   with VLLM_API_KEY, the key on every route of the server but /health, /metrics,
                /version, /ping (vLLM itself keys only /v1 paths)
- vllm_serve:   the entry every vLLM process starts through, which applies both
- gateway:      SMG, the head's one endpoint for several machines: it checks the client key,
                and its pool changes only with the admin key
- membership:   a server's place in the gateway's pool: checked before vLLM starts, joined
                once ready, kept, left on stop
- warmup:       one page per engine before the start script says ready (a client: requests)

Standard library only, except warmup: the start script and the launcher import these with
any python3, before they know which Python has vLLM (tests/test_layout.py checks it).
"""

"""Run a vLLM entry module with the bundle's vLLM fixes (ocr_bundle.serve.vllm_patches) applied
and, with VLLM_API_KEY set, the key required on every route (ocr_bundle.serve.route_keys).

    python -m ocr_bundle.serve.vllm_serve vllm.entrypoints.cli.main serve --model ... [vLLM flags]
    python -m ocr_bundle.serve.vllm_serve vllm.entrypoints.openai.api_server --model ...

start_vllm_server.py builds this command; run it by hand only to debug.
"""

import runpy
import sys

from ocr_bundle.serve import route_keys, vllm_patches

# At import time on purpose: vLLM starts its engine with multiprocessing, and a spawned
# child re-imports the parent's main module (this one, hence alter_sys=False below: it
# stays __main__) before running anything, so the patch reaches the engine process
# whether vLLM forks or spawns.
vllm_patches.apply()
route_keys.install_from_environment()

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: python -m ocr_bundle.serve.vllm_serve VLLM_ENTRY_MODULE [arguments]")
    entry = sys.argv[1]
    sys.argv = [entry, *sys.argv[2:]]
    runpy.run_module(entry, run_name="__main__", alter_sys=False)

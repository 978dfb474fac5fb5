"""What a serving profile is, as far as a client can tell, and the rule that keeps a resumed
quality run honest.

A profile = the server's side (model and weights, vLLM version, context length, KV-cache
dtype and block size: what vLLM's /v1/models, /version and `vllm:cache_config_info` on
/metrics say) + the client's side (max_tokens, DPI, temperature, attempts). The converter
resumes by its own settings only, which do not include the server: a server restarted with
`KV_CACHE_DTYPE=fp8` serves the same model name, and pages converted under bf16 would be
taken as done. So each run records its profile beside its pages, and a run into the same
folder with another profile is refused before anything is sent.
"""

from __future__ import annotations

import json
from pathlib import Path

import requests

from .. import prometheus
from ..client import OcrClient, ServerStatus
from ..files import atomic_write_json

PROFILE = "profile.json"
# Of vLLM's cache_config_info labels, those that change what the model computes (not how much
# memory it got: num_gpu_blocks varies from one start to the next).
CACHE_LABELS = ("cache_dtype", "block_size")


def server_profile(client: OcrClient, status: ServerStatus) -> dict:
    """The server's side of the profile. Never raises: what cannot be read is None."""
    model = client.model()
    weights = dict(zip(status.models, status.weights)).get(model)
    profile = {"model": model, "weights": weights, "vllm": status.version, "max_model_len": status.max_model_len,
               **{f"kv_{label}": None for label in CACHE_LABELS}}
    try:
        # No key: /metrics is open on every server, and a key goes only where requests go.
        text = requests.get(f"{client.base_url}/metrics", timeout=10, allow_redirects=False,
                            **client.tls_options).text
        for sample in prometheus.samples(text):
            if sample.name == "vllm:cache_config_info":
                profile.update({f"kv_{label}": sample.labels.get(label) for label in CACHE_LABELS})
    except (requests.RequestException, ValueError):
        pass
    return profile


def flat(profile: dict, prefix: str = "") -> dict:
    """{"server": {"kv_cache_dtype": "auto"}} → {"server.kv_cache_dtype": "auto"}."""
    out = {}
    for key, value in profile.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(earlier: dict, now: dict) -> list[str]:
    """What changed between two profiles, in words ("server.kv_cache_dtype auto → fp8")."""
    earlier, now = flat(earlier), flat(now)
    keys = sorted(set(earlier) | set(now))
    return [f"{key} {earlier.get(key)} → {now.get(key)}" for key in keys if earlier.get(key) != now.get(key)]


def check_and_record(folder: Path, profile: dict) -> list[str]:
    """Record the profile of the run in `folder`; when the folder already holds a run of another
    profile, return what differs (and record nothing)."""
    path = folder / PROFILE
    if path.exists():
        try:
            earlier = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            return [f"its {PROFILE} cannot be read"]
        changed = differences(earlier, profile)
        if changed:
            return changed
    atomic_write_json(path, profile, durable=True)
    return []

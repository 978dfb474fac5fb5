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
from ..loadtest.pollers import GATEWAY_SERVER_LABEL

PROFILE = "profile.json"
# Of vLLM's cache_config_info labels, those that change what the model computes (not how much
# memory it got: num_gpu_blocks varies from one start to the next).
CACHE_LABELS = ("cache_dtype", "block_size")


def server_profile(client: OcrClient, status: ServerStatus) -> dict:
    """The server's side of the profile. Never raises: what cannot be read is None. Behind a
    gateway, each server's cache settings (from the gateway's /engine_metrics) under "servers";
    when they differ, "mixed" says how (the caller refuses such a fleet)."""
    model = client.model()
    weights = dict(zip(status.models, status.weights)).get(model)
    profile = {"model": model, "weights": weights, "vllm": status.version, "max_model_len": status.max_model_len,
               **{f"kv_{label}": None for label in CACHE_LABELS}}
    # No key: /metrics (vLLM) and /engine_metrics (the gateway) are open, and a key goes only where requests go.
    if (own := _cache_settings(client, "/metrics")):
        profile.update(next(iter(own.values())))
    elif (fleet := _cache_settings(client, "/engine_metrics")):
        profile["servers"] = fleet
        kinds = {tuple(sorted(settings.items())) for settings in fleet.values()}
        if len(kinds) == 1:
            profile.update(next(iter(fleet.values())))
        else:
            profile["mixed"] = "; ".join(f"{server}: " + ", ".join(f"{k} {v}" for k, v in settings.items())
                                         for server, settings in sorted(fleet.items()))
    return profile


def _cache_settings(client: OcrClient, path: str) -> dict[str, dict]:
    """{server: {"kv_cache_dtype": ..., "kv_block_size": ...}} from vllm:cache_config_info at `path`
    (a server's own /metrics: one entry; a gateway's /engine_metrics: one per server); {} when absent."""
    try:
        answer = requests.get(f"{client.base_url}{path}", timeout=10, allow_redirects=False, **client.tls_options)
        if answer.status_code != 200:
            return {}
        found = {}
        for sample in prometheus.samples(answer.text):
            if sample.name == "vllm:cache_config_info":
                server = sample.labels.get(GATEWAY_SERVER_LABEL, client.base_url)
                found[server] = {f"kv_{label}": sample.labels.get(label) for label in CACHE_LABELS}
        return found
    except (requests.RequestException, ValueError):
        return {}


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
    # Which servers a gateway had is a fact of the run, not of the profile: a fleet grows and shrinks.
    keys = sorted(key for key in set(earlier) | set(now) if not key.startswith("server.servers."))
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

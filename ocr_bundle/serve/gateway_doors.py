"""The head's gateway, door by door: every route SMG has and which key opens it, in one table.

The table (smg_doors.json beside this file) is not typed by hand: scripts/smg_doors.py reads the
routes out of the installed SMG's binary and asks a real gateway started by the bundle about each
(method, path), without a key, with a wrong one, with the client key and with the admin key. Each
route's door is then one of:

    open    answers without a key
    client  VLLM_API_KEY (what clients hold): OCR and everything that reaches a server
    admin   ROUTER_ADMIN_KEY only: the pool (/workers), the profilers, caches, tokenizers, WASM

The open ones are a short list the bundle accepts, each with why (OPEN_WHY; the README names them):
none runs OCR or changes the pool. tests/test_gateway.py tries every route of the table on the
running cluster, and fails on an open route that OPEN_WHY does not explain (a newer SMG that opens
something), on a table made for another SMG version, and on a README that lists other open routes.

Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

DOORS_FILE = Path(__file__).with_name("smg_doors.json")
DOORS = ("open", "client", "admin", "closed")
REFUSED = (401, 403)

# Open on purpose, and why. SMG 1.13 has no setting that keys any of these.
OPEN_WHY = {
    "/liveness": "the process answers (the start script's readiness check, load balancers)",
    "/readiness": "a server is in the pool and healthy",
    "/health": "the same, for probes that expect /health",
    "/health_generate": "a server can generate (no model input is taken)",
    "/engine_metrics": "the servers' Prometheus metrics, as each server's own open /metrics",
    "/v1/models": "the served model's name, which every client needs before its first request",
    "/v1/models/x": "one served model's record, by its name",
    "/get_model_info": "the served model's name and settings",
    "/loads": "each server's URL and current load: SMG serves it to anyone and cannot key it; it opens no "
              "door, since every server requires the client key (and, with TLS, the gateway's client certificate)",
}


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # a parameter is written x (any value)
    door: str


@dataclass(frozen=True)
class DoorTable:
    smg_version: str
    routes: list[Route]

    def to_json(self) -> str:
        return json.dumps({"smg_version": self.smg_version, "made_by": "python scripts/smg_doors.py",
                           "routes": [asdict(route) for route in self.routes]}, indent=1) + "\n"

    @classmethod
    def load(cls, path: Path = DOORS_FILE) -> DoorTable:
        data = json.loads(path.read_text())
        return cls(data["smg_version"], [Route(**route) for route in data["routes"]])

    def open_paths(self) -> set[str]:
        return {route.path for route in self.routes if route.door == "open"}


def classify(answers: dict[str, int]) -> str:
    """A route's door from its answers without a key ("none"), with the client key and the admin key."""
    if answers["none"] not in REFUSED:
        return "open"
    if answers["client"] not in REFUSED:
        return "client"
    if answers["admin"] not in REFUSED:
        return "admin"
    return "closed"

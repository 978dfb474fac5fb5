"""The gateway's door table (ocr_bundle/serve/smg_doors.json, written by scripts/smg_doors.py from the
installed SMG): the pinned SMG's, its open routes the ones the bundle explains, docs/cluster.md saying the
same. The running gateway is tried against it route by route in tests/test_gateway.py."""

from __future__ import annotations

import re

from helpers import ROOT
from ocr_bundle.serve.gateway_doors import DOORS, OPEN_WHY, DoorTable, classify


def pinned_smg(requirements: str) -> str:
    return re.search(r"^smg==(\S+)", (ROOT / requirements).read_text(), re.M).group(1)


def test_the_table_is_the_pinned_smgs_and_every_open_route_has_a_reason():
    table = DoorTable.load()
    assert table.smg_version == pinned_smg("requirements.txt") == pinned_smg("requirements-cpu.txt")
    assert len(table.routes) > 50 and {route.door for route in table.routes} <= set(DOORS)
    assert len({(route.method, route.path) for route in table.routes}) == len(table.routes)
    assert table.open_paths() == set(OPEN_WHY)
    doors = {(route.method, route.path): route.door for route in table.routes}
    # What the bundle relies on: OCR needs the client key, the pool and the profilers the admin key.
    assert doors[("POST", "/v1/chat/completions")] == "client" and doors[("POST", "/generate")] == "client"
    assert {doors[(method, "/workers")] for method in ("GET", "POST")} == {"admin"}
    assert doors[("DELETE", "/workers/x")] == doors[("POST", "/start_profile")] == doors[("GET", "/get_loads")] \
        == "admin"


def test_the_cluster_page_names_exactly_the_gateways_open_routes():
    readme = (ROOT / "docs" / "cluster.md").read_text()  # where the README sends a reader for the doors
    bullet = readme[readme.index("- The doors: on the gateway"):]
    open_part = bullet[bullet.index("Open on the gateway"):bullet.index("On every server")]
    named = {path.replace("{name}", "x") for path in re.findall(r"`(/[a-z0-9_/{}.]+)`", open_part)}
    assert named == set(OPEN_WHY), named


def test_a_routes_door_is_the_first_key_that_opens_it():
    assert classify({"none": 200, "wrong": 200, "client": 200, "admin": 200}) == "open"
    assert classify({"none": 405, "wrong": 405, "client": 405, "admin": 405}) == "open"  # answered without a key
    assert classify({"none": 401, "wrong": 401, "client": 400, "admin": 401}) == "client"
    assert classify({"none": 401, "wrong": 401, "client": 401, "admin": 501}) == "admin"
    assert classify({"none": 401, "wrong": 401, "client": 403, "admin": 401}) == "closed"

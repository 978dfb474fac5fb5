"""Every number a person types into the bundle's programs, as a flag or as its environment variable, is
checked against its range by one set of types (ocr_bundle/settings.py) before anything starts: a typo
ends the program in one line that names the flag, instead of reaching vLLM's argv, a KV cache sized from
a negative page count, a busy loop or a timeout of -1 s. The start and stop scripts check their own
variables by the same ranges (tests/test_exposure.py runs them). No server here: parsing happens first."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import app_vllm
import stress_test
from ocr_bundle.api import __main__ as document_api
from ocr_bundle.batch import cli as converter
from ocr_bundle.serve import gateway, launch, membership, processes, warmup
from ocr_bundle.settings import (env_default, fraction, int_at_least_zero, number_at_least_zero, out_of_range,
                                 port_number, positive_fraction, positive_int, positive_number)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind, accepted, refused", [
    (positive_int, {"1": 1, "64": 64, " 7 ": 7}, ["0", "-3", "1.5", "1e3", "", "many"]),
    (int_at_least_zero, {"0": 0, "2": 2}, ["-1", "0.5", "nan"]),
    (positive_number, {"0.25": 0.25, "600": 600.0, "1e3": 1000.0}, ["0", "-1", "nan", "inf", "-inf", "1e400", "soon"]),
    (number_at_least_zero, {"0": 0.0, "30": 30.0}, ["-0.1", "nan", "inf"]),
    (fraction, {"0": 0.0, "0.05": 0.05, "1": 1.0}, ["1.01", "5", "-0.5", "nan"]),
    (positive_fraction, {"0.9": 0.9, "1": 1.0}, ["0", "90", "nan"]),
    (port_number, {"1": 1, "8000": 8000, "65535": 65535}, ["0", "65536", "99999", "-80", "80.5"]),
])
def test_each_range_takes_its_numbers_and_refuses_the_rest_by_name(kind, accepted, refused):
    assert {text: kind(text) for text in accepted} == accepted
    for text in refused:
        with pytest.raises(argparse.ArgumentTypeError, match=f"must be {kind.__name__}, not {text!r}"):
            kind(text)


def test_an_environment_variable_out_of_range_ends_the_program_in_one_line_that_names_it(monkeypatch):
    monkeypatch.setenv("MAX_PAGES_IN_FLIGHT", "-4")
    with pytest.raises(SystemExit) as exited:
        env_default("MAX_PAGES_IN_FLIGHT", None, positive_int)
    assert str(exited.value) == "error: environment variable MAX_PAGES_IN_FLIGHT: must be a whole number of at " \
                                "least 1, not '-4'"
    monkeypatch.setenv("MAX_PAGES_IN_FLIGHT", "")  # empty: unset, the default
    assert env_default("MAX_PAGES_IN_FLIGHT", None, positive_int) is None


def refused(parse, argv: list[str], capsys) -> str:
    """argparse's one line for a refused flag (exit status 2)."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def parsed_by(build):
    """The parse of a program whose parser is built on demand (it reads the environment when built)."""
    return lambda argv: build().parse_args(argv)


# One bad number per program the bundle ships, each caught where its parser is, before any work starts.
BAD_FLAGS = [
    ("launcher", parsed_by(launch.build_parser), ["--max-pages-in-flight", "-4"]),  # sized the CPU KV cache at -2 GiB
    ("launcher", parsed_by(launch.build_parser), ["--max-pages-in-flight", "0"]),   # was silently ignored
    ("launcher", parsed_by(launch.build_parser), ["--gpu-memory-utilization", "90"]),
    ("launcher", parsed_by(launch.build_parser), ["--port", "99999"]),             # reached vLLM's argv
    ("launcher", parsed_by(launch.build_parser), ["--cpu-kv-cache-gb", "-1"]),
    ("stress", parsed_by(stress_test.build_parser), ["--sample-interval", "0"]),  # a sampler in a busy loop
    ("stress", parsed_by(stress_test.build_parser), ["--timeout", "-1"]),
    ("stress", parsed_by(stress_test.build_parser), ["--requests", "0"]),
    ("stress", parsed_by(stress_test.build_parser), ["--max-error-rate", "5"]),
    ("stress", parsed_by(stress_test.build_parser), ["--top-p", "0"]),
    ("converter", parsed_by(converter.build_parser), ["in", "--timeout", "0"]),
    ("converter", parsed_by(converter.build_parser), ["in", "--max-failed-rate", "1.5"]),
    ("converter", parsed_by(converter.build_parser), ["in", "--temperature", "-0.2"]),
    ("document-api", parsed_by(document_api.build_parser), ["--concurrency", "0"]),
    ("document-api", parsed_by(document_api.build_parser), ["--port", "0"]),
    ("page", parsed_by(app_vllm.build_parser), ["--max-upload-mb", "nan"]),
    ("gateway", parsed_by(gateway.build_parser), ["--request-timeout", "-5"]),
    ("membership", membership.main, ["keep", "--gateway", "g", "--server", "s", "--pid-file", "p", "--interval", "0"]),
    ("processes", processes.main, ["wait-ready", "http://127.0.0.1:9/health", "--pid-file", "p", "--timeout", "-1"]),
    ("warmup", warmup.main, ["--timeout", "0"]),
]


@pytest.mark.parametrize("program, parse, argv", BAD_FLAGS,
                         ids=[f"{program} {' '.join(argv[-2:])}" for program, _, argv in BAD_FLAGS])
def test_every_program_refuses_a_number_out_of_range_before_it_starts(program, parse, argv, capsys,
                                                                      no_server_environment):
    message = refused(parse, argv, capsys)
    assert f"argument {argv[-2]}: must be " in message and f"not '{argv[-1]}'" in message


def test_a_variable_the_launcher_reads_is_checked_like_its_flag(monkeypatch):
    monkeypatch.setenv("GPU_MEMORY_UTILIZATION", "90")
    with pytest.raises(SystemExit, match="GPU_MEMORY_UTILIZATION: must be a fraction above 0, at most 1, not '90'"):
        launch.build_parser()


def programs() -> list[Path]:
    return [*ROOT.glob("*.py"), *(ROOT / "ocr_bundle").rglob("*.py")]


def unranged_numbers(path: Path) -> list[str]:
    """`add_argument(..., type=int|float)` and `env_default(..., int|float)` in a file: a number with no range."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name == "add_argument":
            converters = [k.value for k in node.keywords if k.arg == "type"]
        elif name == "env_default":  # env_default(NAME, fallback, cast)
            converters = node.args[2:3] + [k.value for k in node.keywords if k.arg == "cast"]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}(... {c.id})" for c in converters
                  if isinstance(c, ast.Name) and c.id in ("int", "float")]
    return found


def test_no_program_takes_a_number_without_its_range():
    """The rule lives in one place; a new flag typed `int` or `float` would leave it."""
    assert len(programs()) > 20
    assert [line for path in programs() for line in unranged_numbers(path)] == []


def test_the_scripts_variables_are_checked_by_the_same_ranges(monkeypatch):
    """start_optimized.sh and stop_optimized.sh check their own numbers (PORT, STARTUP_TIMEOUT, STOP_GRACE ...)
    through `python3 -m ocr_bundle.settings check`: unset or empty is the script's default, a bad one is said."""
    environ = {"PORT": "8000", "UI_PORT": "", "STARTUP_TIMEOUT": "-5", "STOP_GRACE": "2.5"}
    assert out_of_range(["PORT=port_number", "UI_PORT=port_number", "OCR_API_PORT=port_number",
                         "STARTUP_TIMEOUT=positive_number", "STOP_GRACE=int_at_least_zero"], environ) == [
        "STARTUP_TIMEOUT must be a number above 0, not '-5'", "STOP_GRACE must be a whole number, 0 or more, not '2.5'"]
    check = [sys.executable, "-m", "ocr_bundle.settings", "check"]
    said = subprocess.run([*check, "PORT=port_number"], cwd=ROOT, env={"PORT": "70000"}, capture_output=True, text=True)
    assert said.returncode == 2 and said.stderr == "PORT must be a port from 1 to 65535, not '70000'\n"
    typo = subprocess.run([*check, "PORT=port"], cwd=ROOT, env={}, capture_output=True, text=True)
    assert typo.returncode == 1 and "usage:" in typo.stderr and "port_number" in typo.stderr

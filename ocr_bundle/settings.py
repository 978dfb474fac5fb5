"""The bundle's shared settings: the one file to edit.

Every script reads its configuration the same way: command-line flag > environment
variable > the defaults below. Environment variables are read once, when a script builds
its argument parser; nothing reads them inside request code.

Standard library only: the launcher imports this before it knows which Python has vLLM.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

# ---------------------------------------------------------------- the model
MODEL_ID = "lightonai/LightOnOCR-2-1B"
# A 1540 px A4 page is ~2,150 image tokens in vLLM; rounded up for sizing.
PAGE_PROMPT_TOKENS = 2200
# LightOn's recommended max_tokens: what the densest pages need.
MAX_OUTPUT_TOKENS = 4096
# 2,200 + 4,096 = 6,296 > 4,096: the article's --max-model-len 4096 truncates dense pages.
DEFAULT_MAX_MODEL_LEN = 8192
# LightOn's recommended sampling for LightOnOCR-2 (ocr_bundle/families.py has each family's;
# clients take the served model's unless told otherwise).
TEMPERATURE = 0.2
TOP_P = 0.9

# ---------------------------------------------------------------- page images
# The vision encoder's native resolution: larger images are resized by the server anyway.
TARGET_LONGEST_EDGE = 1540
PDF_RENDER_DPI = 200

# ---------------------------------------------------------------- the services
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
# Separate connect/read timeouts: a dead server is known in seconds, while a dense page at
# 4,096 tokens on a busy GPU may legitimately take minutes.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0
STATUS_TIMEOUT_S = 3.0
# The head's gateway (several machines, one endpoint) keeps its Prometheus metrics on the head's loopback.
ROUTER_METRICS_PORT = 29000
DEFAULT_ROUTER_METRICS_URL = f"http://127.0.0.1:{ROUTER_METRICS_PORT}/metrics"

# Environment variables every client script understands.
ENV_URL, ENV_API_KEY, ENV_MODEL = "VLLM_URL", "VLLM_API_KEY", "VLLM_MODEL"

T = TypeVar("T")
N = TypeVar("N", int, float)


def env_default(name: str, fallback: T | None = None, cast: Callable[[str], T] = str) -> T | None:
    """The environment's value for a flag default; unset or empty means `fallback`.

    A value that does not parse ends the program with a one-line message (argparse-style),
    not a traceback.
    """
    value = os.environ.get(name)
    if value is None or value == "":
        return fallback
    try:
        return cast(value)
    except argparse.ArgumentTypeError as exc:  # a number_type's range, said as for its flag
        raise SystemExit(f"error: environment variable {name}: {exc}") from None
    except ValueError:
        raise SystemExit(f"error: environment variable {name}={value!r} is not a valid "
                         f"{getattr(cast, '__name__', 'value')}") from None


class SecretOnCommandLine(argparse.Action):
    """A flag that would carry a secret (--api-key, the page's --auth) is refused: a command line is
    visible to every user of the machine (`ps`, /proc/PID/cmdline) and stays in shell history. The
    secret comes from its environment variable (`env`), the one way secrets reach the bundle's programs."""

    def __init__(self, option_strings, dest, env: str = ENV_API_KEY, **kwargs):
        self.env = env
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs="?",
                         help=f"not accepted: a secret on a command line is visible to every user (ps). Export "
                              f"{env} instead")

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not accepted: a command line is visible to every user of this machine "
                     f"(ps) and stays in shell history. Export {self.env}=... instead (read -s {self.env} "
                     f"&& export {self.env} keeps it out of the history too)")


def refuse_secret_on_command_line(parser: argparse.ArgumentParser, flag: str = "--api-key",
                                  env: str = ENV_API_KEY) -> None:
    parser.add_argument(flag, action=SecretOnCommandLine, env=env)


def child_environment(base: Mapping[str, str] | None = None, **values: str | None) -> dict[str, str]:
    """The environment of a program this one starts, with `values` set (None or "": left out). The one
    way the bundle's Python hands a secret (the API key) to a child: through execve's environment, never
    its argument list, which every user of the machine can read while it runs (ps, /proc/PID/cmdline).
    The shell scripts' counterpart is with_env (scripts/lifecycle.sh)."""
    environment = dict(os.environ if base is None else base)
    for name, value in values.items():
        if value:
            environment[name] = value
        else:
            environment.pop(name, None)
    return environment


def api_key_from_env() -> str | None:
    """The API key, from the environment only (never a flag, never stored with the settings)."""
    return os.environ.get(ENV_API_KEY) or None


def add_server_arguments(parser: argparse.ArgumentParser, url_flag: str = "--url") -> None:
    """--url/--model with the same environment fallbacks in every client script; the key comes
    from VLLM_API_KEY only, so it is in no namespace a script writes to a summary or a report."""
    parser.add_argument(url_flag, dest="url", default=env_default(ENV_URL, DEFAULT_SERVER_URL),
                        help=f"vLLM server base URL (env {ENV_URL}; default {DEFAULT_SERVER_URL}). The API key "
                             f"comes from the environment: {ENV_API_KEY}")
    parser.add_argument("--model", default=env_default(ENV_MODEL),
                        help=f"served model name (env {ENV_MODEL}; default: the first one the server's /v1/models "
                             "lists)")
    parser.add_argument("--ca-cert", default=None, metavar="FILE",
                        help="the CA an https:// server's certificate must be signed by: the cluster's ca.pem from "
                             "scripts/make_certs.py (default: env VLLM_CA_CERT, then REQUESTS_CA_BUNDLE, then "
                             "SSL_CERT_FILE, then the public CAs)")
    refuse_secret_on_command_line(parser)


def flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a parser that raises ValueError with a message for people (page
    ranges, shards, block labels): argparse then prints that message, not "invalid value"."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    convert.__name__ = parse.__name__
    return convert


def number_type(convert: Callable[[str], N], accepts: Callable[[N], bool], wanted: str) -> Callable[[str], N]:
    """An argparse type (and env_default cast) for a number in a range: a value out of it, nan, inf or no
    number at all is refused with `wanted` ("a whole number of at least 1"), before anything starts: a
    typo in a flag or a variable ends the program in one line instead of reaching vLLM or a timeout."""
    def parse(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, not {text!r}")
        return value

    parse.__name__ = wanted
    return parse


# The ranges of every numeric flag and variable of the bundle's programs, in one place.
positive_int = number_type(int, lambda value: value >= 1, "a whole number of at least 1")
int_at_least_zero = number_type(int, lambda value: value >= 0, "a whole number, 0 or more")
positive_number = number_type(float, lambda value: value > 0, "a number above 0")
number_at_least_zero = number_type(float, lambda value: value >= 0, "a number, 0 or more")
fraction = number_type(float, lambda value: 0 <= value <= 1, "a fraction from 0 to 1")
positive_fraction = number_type(float, lambda value: 0 < value <= 1, "a fraction above 0, at most 1")
port_number = number_type(int, lambda value: 1 <= value <= 65535, "a port from 1 to 65535")
# By name, for the shell scripts' own variables: python3 -m ocr_bundle.settings check PORT=port_number ...
RANGES = {"positive_int": positive_int, "int_at_least_zero": int_at_least_zero, "positive_number": positive_number,
          "number_at_least_zero": number_at_least_zero, "fraction": fraction, "positive_fraction": positive_fraction,
          "port_number": port_number}


def out_of_range(checks: list[str], environ: Mapping[str, str]) -> list[str]:
    """For each NAME=RANGE, a line when the variable is set (not empty) and out of that range. The start and
    stop scripts check their variables this way before any arithmetic of bash's or any start: the ranges of
    their numbers are those of the programs' flags."""
    problems = []
    for check in checks:
        name, _, range_name = check.partition("=")
        value = environ.get(name, "")
        if not value:  # unset or empty: the script's default
            continue
        try:
            RANGES[range_name](value)
        except argparse.ArgumentTypeError as exc:
            problems.append(f"{name} {exc}")
    return problems


def add_conversion_arguments(parser: argparse.ArgumentParser) -> None:
    """What shapes each converted page, in batch_ocr.py and in quality_check.py (which hands them to it)."""
    parser.add_argument("--max-tokens", type=positive_int, default=MAX_OUTPUT_TOKENS,
                        help=f"output tokens per page (default {MAX_OUTPUT_TOKENS}, what the densest pages need)")
    parser.add_argument("--max-attempts", type=positive_int, default=4,
                        help="tries per page when a reply is cut at max_tokens or ends in a loop, each 0.2 "
                             "hotter (default 4)")
    parser.add_argument("--temperature", type=number_at_least_zero, default=None,
                        help="temperature of the first attempt (default: the served model family's, "
                             f"{TEMPERATURE} for LightOnOCR-2, 0.1 for LightOnOCR-3)")
    parser.add_argument("--dpi", type=positive_int, default=PDF_RENDER_DPI,
                        help=f"PDF rendering resolution (default {PDF_RENDER_DPI}; the longest edge is capped at "
                             f"{TARGET_LONGEST_EDGE} px either way)")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["check"] or not all(arg.partition("=")[2] in RANGES for arg in sys.argv[2:]):
        sys.exit(f"usage: python3 -m ocr_bundle.settings check NAME=RANGE... (RANGE: {', '.join(RANGES)})")
    found = out_of_range(sys.argv[2:], os.environ)
    for problem in found:
        print(problem, file=sys.stderr)
    sys.exit(2 if found else 0)

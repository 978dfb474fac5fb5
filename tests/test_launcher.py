"""start_vllm_server.py and its logic (ocr_bundle.serve.launch): the vLLM command it builds,
and the errors it gives before vLLM starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PYTHON, ROOT, made_certs
from ocr_bundle.serve import launch as launcher


def command_for(argv: list[str], device: str = "cuda", env: dict | None = None, monkeypatch=None):
    if monkeypatch is not None:
        for key in ("MODEL", "HOST", "PORT", "VLLM_API_KEY", "MAX_MODEL_LEN", "GPU_MEMORY_UTILIZATION",
                    "MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "MAX_PAGES_IN_FLIGHT", "KV_CACHE_DTYPE",
                    "DATA_PARALLEL_SIZE", "JOIN", "VLLM_USE_FLASHINFER_SAMPLER"):
            monkeypatch.delenv(key, raising=False)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
    own, passthrough = launcher.split_passthrough(argv)
    args = launcher.build_parser().parse_args(own)
    return launcher.build_command(args, passthrough, device)


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_defaults_on_gpu(monkeypatch):
    command, env = command_for([], monkeypatch=monkeypatch)
    # vLLM runs through the bundle's wrapper, which applies ocr_bundle.serve.vllm_patches first.
    assert command[1:6] == ["-m", "ocr_bundle.serve.vllm_serve", "vllm.entrypoints.cli.main", "serve", "--model"]
    assert flag(command, "--model") == "lightonai/LightOnOCR-2-1B"
    assert flag(command, "--served-model-name") == "lightonai/LightOnOCR-2-1B"
    assert flag(command, "--host") == "127.0.0.1" and flag(command, "--port") == "8000"
    assert flag(command, "--max-model-len") == "8192"
    assert json.loads(flag(command, "--limit-mm-per-prompt")) == {"image": 1}
    assert flag(command, "--mm-processor-cache-gb") == "0"
    assert "--no-enable-prefix-caching" in command
    assert flag(command, "--gpu-memory-utilization") == "0.9"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    # The sampler that measured faster on an H200 (docs/benchmarks.md, 2026-11-30 FlashInfer-sampler run).
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert set(env) == {"PYTHONPATH", "VLLM_USE_FLASHINFER_SAMPLER"}


def test_flashinfer_sampler_is_left_to_whoever_sets_it_and_off_the_cpu(monkeypatch):
    _, env = command_for([], env={"VLLM_USE_FLASHINFER_SAMPLER": "1"}, monkeypatch=monkeypatch)
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in env  # the user's 1 reaches vLLM through os.environ
    _, env = command_for([], device="cpu", monkeypatch=monkeypatch)
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in env


def test_cpu_backend_sets_its_environment(monkeypatch):
    command, env = command_for(["--cpu-kv-cache-gb", "3"], device="cpu", monkeypatch=monkeypatch)
    assert command[1:4] == ["-m", "ocr_bundle.serve.vllm_serve", "vllm.entrypoints.openai.api_server"]
    assert "--gpu-memory-utilization" not in command
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_scaling_flags_and_passthrough(monkeypatch):
    own = ["-tp", "2", "--data-parallel-size", "4", "--max-num-seqs", "512", "--max-num-batched-tokens", "4096",
           "--enable-prefix-caching"]
    args = launcher.build_parser().parse_args(own)
    command, _ = launcher.build_command(args, ["--api-server-count", "4", "--enforce-eager"], "cuda",
                                        launcher.plan_data_parallel(args, "cuda", gpus=8))
    assert flag(command, "--tensor-parallel-size") == "2" and flag(command, "--data-parallel-size") == "4"
    assert flag(command, "--max-num-seqs") == "512" and flag(command, "--max-num-batched-tokens") == "4096"
    assert "--enable-prefix-caching" in command and "--no-enable-prefix-caching" not in command
    assert command[-3:] == ["--api-server-count", "4", "--enforce-eager"]


def test_precedence_flag_over_env_over_default(monkeypatch):
    command, env = command_for([], env={"PORT": "9001", "HOST": "0.0.0.0", "VLLM_API_KEY": "k"},
                               monkeypatch=monkeypatch)
    assert flag(command, "--port") == "9001" and flag(command, "--host") == "0.0.0.0"
    # The key reaches vLLM in the environment it inherits (execve), never in its argv (ps) nor in
    # the environment the launcher prints.
    assert "k" not in command and "VLLM_API_KEY" not in env
    command, _ = command_for(["--port", "9002"], env={"PORT": "9001"}, monkeypatch=monkeypatch)
    assert flag(command, "--port") == "9002"


def test_local_folder_gets_its_name_as_served_model(tiny_checkpoint, monkeypatch):
    command, _ = command_for(["--model", str(tiny_checkpoint)], monkeypatch=monkeypatch)
    assert flag(command, "--served-model-name") == "lightonocr-tiny"


def run_launcher(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([PYTHON, str(ROOT / "start_vllm_server.py"), *argv], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_dry_run_prints_the_command_and_hides_the_key(tiny_checkpoint):
    done = run_launcher("--model", str(tiny_checkpoint), "--dry-run", env={"VLLM_API_KEY": "secret-key"})
    assert done.returncode == 0, done.stderr
    assert "cpu backend" in done.stdout and "VLLM_API_KEY='***'" in done.stdout
    assert "secret-key" not in done.stdout + done.stderr
    assert "--max-model-len 8192" in done.stdout


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "does not exist"),
    (lambda d: d.mkdir(), "has no config.json"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')),
     "not a LightOnOCR checkpoint"),
])
def test_bad_model_folder_fails_before_vllm_starts(tmp_path: Path, make, message):
    folder = tmp_path / "model"
    make(folder)
    done = run_launcher("--model", str(folder))
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_missing_vllm_is_explained():
    done = subprocess.run(["python3", str(ROOT / "start_vllm_server.py")], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"})
    assert done.returncode == 2
    assert "vLLM is not installed" in done.stderr and "Traceback" not in done.stderr


def test_help_documents_every_flag():
    done = run_launcher("--help")
    parser = launcher.build_parser()
    for action in parser._actions:
        assert action.help, action.dest
    assert "4096" in done.stdout and "env MODEL" in done.stdout


def test_kv_bytes_per_token_matches_what_vllm_allocates():
    # vLLM on the H200 (docs/benchmarks.md): 123.36 GiB of KV cache held 1,154,976 tokens of
    # the full checkpoint = 114,688 bytes per token; fp8 halves it (2,309,360 tokens).
    sys.path.insert(0, str(ROOT / "scripts"))
    import make_checkpoint

    full_text = make_checkpoint.build_config_dict(make_checkpoint.PRESETS["full"])["text_config"]
    assert launcher.kv_bytes_per_token(full_text, "auto") == 114_688
    assert launcher.kv_bytes_per_token(full_text, "fp8") == 57_344
    assert launcher.kv_bytes_per_token(launcher.LIGHTONOCR_TEXT_CONFIG, "auto") == 114_688


def test_max_pages_in_flight_sizes_the_kv_cache_instead_of_a_fraction(tiny_checkpoint, monkeypatch):
    command, _ = command_for(["--model", str(tiny_checkpoint), "--max-pages-in-flight", "64"], monkeypatch=monkeypatch)
    # tiny: 2 layers x 1 KV head x head_dim 64 x K,V x 2 bytes = 512 bytes per token;
    # a page is 2,200 prompt + 4,096 output tokens.
    assert flag(command, "--kv-cache-memory-bytes") == str(64 * (2200 + 4096) * 512)
    assert flag(command, "--max-num-seqs") == "64"
    assert "--gpu-memory-utilization" not in command
    # A shorter context caps the tokens per page; an explicit --max-num-seqs wins.
    command, _ = command_for(["--model", str(tiny_checkpoint), "--max-pages-in-flight", "8", "--max-model-len", "4096",
                              "--max-num-seqs", "4", "--kv-cache-dtype", "fp8"], monkeypatch=monkeypatch)
    assert flag(command, "--kv-cache-memory-bytes") == str(8 * 4096 * 256)
    assert flag(command, "--max-num-seqs") == "4" and flag(command, "--kv-cache-dtype") == "fp8"


def test_max_pages_in_flight_on_the_cpu_backend_sizes_its_ram_kv_cache(tiny_checkpoint, monkeypatch):
    command, env = command_for(["--model", str(tiny_checkpoint), "--max-pages-in-flight", "1000"], device="cpu",
                               monkeypatch=monkeypatch)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # 1000 x 6,296 x 512 bytes = 3.0 GiB, rounded up
    assert flag(command, "--max-num-seqs") == "1000" and "--kv-cache-memory-bytes" not in command


def test_default_keeps_the_kv_cache_dtype_and_utilization(monkeypatch):
    command, _ = command_for([], monkeypatch=monkeypatch)
    assert "--kv-cache-dtype" not in command and "--kv-cache-memory-bytes" not in command


VLLM_026_PIXTRAL_IMPORTS = """from transformers.models.pixtral.modeling_pixtral import (
    PixtralRotaryEmbedding,
    apply_rotary_pos_emb,
    position_ids_in_meshgrid,
)
"""
# vLLM 0.32 picks the name by the transformers version, and so names both.
VLLM_032_PIXTRAL_IMPORTS = """if TRANSFORMERS_WITH_AXIAL_ROPE:
    from transformers.models.pixtral.modeling_pixtral import (
        PixtralVisionRotaryEmbedding,
    )
else:
    from transformers.models.pixtral.modeling_pixtral import (
        PixtralRotaryEmbedding as PixtralVisionRotaryEmbedding,
    )
"""


@pytest.mark.parametrize("vllm, transformers, source, refused", [
    ("0.26.0", "5.16.1", VLLM_026_PIXTRAL_IMPORTS, None),  # the pinned pair
    ("0.26.0", "5.17.0", VLLM_026_PIXTRAL_IMPORTS, "pip install transformers==5.16.1"),
    ("0.26.0", "5.19.0.dev0", VLLM_026_PIXTRAL_IMPORTS, "pip install transformers==5.16.1"),
    ("0.32.0", "5.19.0", VLLM_032_PIXTRAL_IMPORTS, None),  # handles both names
    ("0.27.1", "5.16.1", VLLM_026_PIXTRAL_IMPORTS, "makes LightOnOCR loop"),
])
def test_known_bad_pairs_are_refused_with_the_fix(vllm, transformers, source, refused):
    problem = launcher.known_bad_pair(vllm, transformers, source)
    assert (problem is None) if refused is None else (refused in problem)


def test_preflight_reads_the_installed_pair_and_refuses_before_vllm_starts(tmp_path, tiny_checkpoint):
    """A stand-in vLLM 0.27.1 on the path (the real one cannot be installed beside the CPU
    build): the launcher refuses it, exit 2, with the fix."""
    package = tmp_path / "vllm"
    (package / "model_executor" / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.27.1'\n")
    (package / "model_executor" / "models" / "pixtral.py").write_text(VLLM_026_PIXTRAL_IMPORTS)
    (tmp_path / "vllm-0.27.1.dist-info").mkdir()
    (tmp_path / "vllm-0.27.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1\n")
    done = run_launcher("--model", str(tiny_checkpoint), "--dry-run", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "vLLM 0.27.1 makes LightOnOCR loop" in done.stderr and "Traceback" not in done.stderr
    # The real CPU environment's pair passes.
    assert run_launcher("--model", str(tiny_checkpoint), "--dry-run").returncode == 0


# ------------------------------------------------------------------ scale-out (vLLM data parallelism)


@pytest.fixture()
def two_gpus(tmp_path):
    """A stand-in `nvidia-smi` listing two H200 (the one test double here: no GPU on this machine)."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-aaaa)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-bbbb)'\n")
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "DATA_PARALLEL_SIZE", "JOIN")}
    return {**clean, "PATH": f"{fake.parent}:{os.environ['PATH']}"}


def dry_run_gpu(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(ROOT / "start_vllm_server.py"), "--device", "cuda", "--dry-run", *argv],
                          capture_output=True, text=True, timeout=120, env=env)


def vllm_args(done: subprocess.CompletedProcess) -> list[str]:
    import shlex

    line = next(text for text in done.stdout.splitlines() if "cuda backend:" in text)
    return shlex.split(line.split("cuda backend: ", 1)[1])


def test_every_visible_gpu_by_default(two_gpus):
    done = dry_run_gpu(two_gpus)
    assert done.returncode == 0, done.stderr
    assert "serving on 2 GPUs: data parallel 2" in done.stdout
    assert flag(vllm_args(done), "--data-parallel-size") == "2"
    one = dry_run_gpu({**two_gpus, "CUDA_VISIBLE_DEVICES": "1"})  # CUDA_VISIBLE_DEVICES respected
    assert "serving on 1 GPU: one engine" in one.stdout and "--data-parallel-size" not in vllm_args(one)
    kept = dry_run_gpu({**two_gpus, "DATA_PARALLEL_SIZE": "1"})
    assert "--data-parallel-size" not in vllm_args(kept)
    too_many = dry_run_gpu(two_gpus, "--data-parallel-size", "4")
    assert too_many.returncode == 2 and "needs 4 GPUs on this node; 2 are visible" in too_many.stderr


def test_a_joining_server_beyond_loopback_needs_the_key_with_no_opt_out(two_gpus):
    """A server that joins a head's gateway receives the gateway's key, and is reachable by other
    machines: no key, no start (the start script checks the admin key and the gateway itself)."""
    join = ("--join", "http://192.0.2.1:8000", "--host", "0.0.0.0")
    for extra in ((), ("--allow-open-api",)):
        refused = dry_run_gpu({**two_gpus, "VLLM_API_KEY": ""}, *join, *extra)
        assert refused.returncode == 2 and "no opt-out for a joining server" in refused.stderr, refused.stderr
    keyed = dry_run_gpu({**two_gpus, "VLLM_API_KEY": "s3cret", "ALLOW_PLAINTEXT": "1"}, *join)
    assert keyed.returncode == 0, keyed.stderr
    far_from_loopback = dry_run_gpu({**two_gpus, "VLLM_API_KEY": "s3cret"}, "--join", "http://192.0.2.1:8000")
    assert far_from_loopback.returncode == 2 and "cannot reach it" in far_from_loopback.stderr
    assert "s3cret" not in keyed.stdout + keyed.stderr
    local = dry_run_gpu({**two_gpus, "VLLM_API_KEY": ""}, "--join", "http://127.0.0.1:8000")
    assert local.returncode == 2  # on loopback too: a joining server always holds the key


def test_tls_serves_https_and_behind_a_gateway_requires_the_gateways_certificate(two_gpus, tmp_path):
    node = made_certs(tmp_path, "node=10.0.0.2") / "node"
    tls_env = {**two_gpus, "VLLM_API_KEY": "s3cret", "TLS_CERT": str(node / "cert.pem"),
               "TLS_KEY": str(node / "key.pem"), "TLS_CA": str(node / "ca.pem")}
    plain = dry_run_gpu({**two_gpus, "VLLM_API_KEY": "s3cret"}, "--host", "0.0.0.0")
    assert plain.returncode == 2 and "in plain HTTP" in plain.stderr and "TLS_CERT" in plain.stderr
    alone = dry_run_gpu(tls_env, "--host", "0.0.0.0")
    assert alone.returncode == 0, alone.stderr
    args = vllm_args(alone)
    assert flag(args, "--ssl-certfile") == str(node / "cert.pem") and flag(args, "--ssl-keyfile") == str(node / "key.pem")
    assert "--ssl-cert-reqs" not in args  # one machine: any client with the key (and the CA)
    for argv in (("--join", "https://192.0.2.1:8000", "--host", "0.0.0.0"), ("--behind-gateway",)):
        behind = dry_run_gpu(tls_env, *argv)
        assert behind.returncode == 0, behind.stderr
        args = vllm_args(behind)
        assert flag(args, "--ssl-ca-certs") == str(node / "ca.pem") and flag(args, "--ssl-cert-reqs") == "2"
    plain_join = dry_run_gpu(tls_env, "--join", "http://192.0.2.1:8000", "--host", "0.0.0.0")
    assert plain_join.returncode == 2 and "is plain HTTP but this machine serves TLS" in plain_join.stderr
    by_hand = dry_run_gpu(tls_env, "--", "--ssl-keyfile", "/elsewhere/key.pem")
    assert by_hand.returncode == 2 and "serve HTTPS with TLS_CERT, TLS_KEY and TLS_CA instead" in by_hand.stderr


def test_the_headless_data_parallel_flags_are_gone(two_gpus):
    done = dry_run_gpu(two_gpus, "--nodes", "2")
    assert done.returncode == 2 and "unrecognized arguments: --nodes" in done.stderr


@pytest.mark.parametrize("argv, message", [
    (["--data-parallel-size", "many"], "must be 'auto' or a number"),
])
def test_scale_out_mistakes_are_refused_before_vllm_starts(two_gpus, argv, message):
    done = dry_run_gpu(two_gpus, *argv)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_cpu_backend_keeps_one_engine(tiny_checkpoint, monkeypatch):
    args = launcher.build_parser().parse_args(["--model", str(tiny_checkpoint)])
    plan = launcher.plan_data_parallel(args, "cpu", gpus=0)
    assert plan.local == 1 and plan.flags() == []


# ------------------------------------------------------------------ attention kernels (ocr_bundle.serve.attention)


@pytest.fixture()
def h200_box(tmp_path, two_gpus):
    """Stand-ins for what an H200 box with the CUDA toolkit has and this machine lacks: an
    nvidia-smi that answers the compute-capability query, an nvcc, and an importable
    `flashinfer` (the launcher only looks for it; vLLM does the rest on a real GPU)."""
    bin_dir = tmp_path / "bin"
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\ncase \"$*\" in *compute_cap*) printf '9.0\\n9.0\\n';; "
        "*) echo 'GPU 0: NVIDIA H200 (UUID: GPU-aaaa)'; echo 'GPU 1: NVIDIA H200 (UUID: GPU-bbbb)';; esac\n")
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvcc").chmod(0o755)
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    # PATH: the stand-ins and the system's basics only, so no nvcc of this machine's own is found.
    return {**two_gpus, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(site), "DATA_PARALLEL_SIZE": "1"}


def test_fp8_on_h200_runs_flashinfer_attention_and_says_so(h200_box):
    done = dry_run_gpu(h200_box, "--kv-cache-dtype", "fp8")
    assert done.returncode == 0, done.stderr
    assert "attention: FlashInfer for the fp8 KV cache" in done.stdout
    line = next(text for text in done.stdout.splitlines() if "cuda backend:" in text)
    assert "VLLM_HAS_FLASHINFER_CUBIN=1" in line
    assert flag(vllm_args(done), "--attention-backend") == "FLASHINFER"
    # The fp8 profile: the compiled encoder (2026-12-02 fp8 run), vLLM's own block size.
    assert "--block-size" not in vllm_args(done) and "OCR_BUNDLE_COMPILE_ENCODER=1" in line
    bf16 = dry_run_gpu(h200_box)
    assert "--attention-backend" not in vllm_args(bf16) and "attention: vLLM's default" in bf16.stdout
    # The measured default (ocr_bundle.serve.tuning): 128-token blocks and the compiled encoder, said.
    assert flag(vllm_args(bf16), "--block-size") == "128" and "KV block size: 128 tokens" in bf16.stdout
    assert "OCR_BUNDLE_COMPILE_ENCODER=1" in next(text for text in bf16.stdout.splitlines() if "cuda backend:" in text)
    assert "vision encoder: compiled with torch.compile" in bf16.stdout
    kept = dry_run_gpu({**h200_box, "ATTENTION_BACKEND": "flash-attn"}, "--kv-cache-dtype", "fp8")
    assert flag(vllm_args(kept), "--attention-backend") == "FLASH_ATTN"
    assert "OCR_BUNDLE_COMPILE_ENCODER=0" in next(text for text in kept.stdout.splitlines() if "cuda backend:" in text)


def test_fp8_without_nvcc_keeps_flashattention_and_an_explicit_flashinfer_is_refused(h200_box, tmp_path):
    (tmp_path / "bin" / "nvcc").unlink()
    done = dry_run_gpu(h200_box, "--kv-cache-dtype", "fp8")
    assert done.returncode == 0, done.stderr
    assert "--attention-backend" not in vllm_args(done) and "no nvcc on PATH" in done.stdout
    refused = dry_run_gpu(h200_box, "--attention-backend", "flashinfer")
    assert refused.returncode == 2 and "no nvcc is on PATH" in refused.stderr


@pytest.mark.parametrize("version, has_key, refused", [
    ("0.26.0", True, False), ("0.32.0", True, False), ("0.32.0+cpu", True, False),
    ("0.33.0", True, True), ("0.33.0", False, False), (None, True, False),
])
def test_a_key_is_served_only_by_a_vllm_on_which_every_route_is_keyed(version, has_key, refused):
    problem = launcher.route_keys_problem(version, has_key)
    assert (problem is not None) is refused
    if refused:
        assert "/invocations" in problem and "0.26.0, 0.32.0" in problem

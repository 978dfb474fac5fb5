"""Which attention kernels the decoder runs: FlashInfer for an fp8 KV cache on Hopper, vLLM's default otherwise.

Measured on two H200 of one host, one server after the other on the same GPU
(docs/benchmarks.md, 2026-11-30 FlashInfer-attention run; A4 page, 1,000 tokens):
- fp8 KV cache: FlashInfer 9.10 and 9.19 pages/s at concurrency 512 against 8.17 with
  vLLM's default (FlashAttention 3). On an H100/H200 vLLM decodes there with FlashInfer's XQA
  kernel, which reads the fp8 cache with bf16 queries;
- bf16 KV cache: FlashInfer lost, 6.37 and 6.47 pages/s at 256 against 7.05, and a lone page
  took 2.53-2.59 s against 2.49 s. So the default keeps vLLM's choice.
This module's `auto` then ran on an H200 in the 2026-11-30 block-size run: it read compute capability 9.0
from nvidia-smi, found FlashInfer and nvcc, set the XQA gate, and vLLM decoded with XQA
(9.15 and 9.18 pages/s at 512).

FlashInfer builds its kernels with nvcc on the first start (about two minutes, then cached in
~/.cache/flashinfer), so `auto` picks it only where that build can run. (vLLM 0.26 itself
counts FlashInfer as usable only with nvcc on PATH or its downloaded cubins; kernels built in
advance by flashinfer-jit-cache were not tried.)
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ocr_bundle.serve.scaleout import nvidia_smi, visible_devices

CHOICES = ("auto", "flash-attn", "flashinfer")
# vLLM 0.26 decodes with XQA on SM90 only if NVIDIA's cubin server answers or flashinfer-cubin
# is installed (vllm/utils/flashinfer.py: has_nvidia_artifactory). On SM90, XQA is built from
# FlashInfer's own sources (flashinfer/jit/xqa.py) and downloads nothing, so a machine without
# internet loses it for no reason; this variable tells vLLM the cubins are there. Only on SM90:
# on Blackwell the same gate guards kernels that really are downloaded.
XQA_GATE = "VLLM_HAS_FLASHINFER_CUBIN"


class AttentionError(Exception):
    """An attention choice that cannot work here; the message says what to do."""


@dataclass(frozen=True)
class GpuFacts:
    """What the choice depends on, gathered once (see probe) so that choose() stays pure."""

    compute_capabilities: tuple[str, ...] = ()  # "9.0" per visible GPU; empty when unknown
    flashinfer_installed: bool = False
    nvcc: str | None = None  # FlashInfer's just-in-time builds need it on PATH

    @property
    def hopper(self) -> bool:
        return bool(self.compute_capabilities) and all(cap == "9.0" for cap in self.compute_capabilities)


@dataclass(frozen=True)
class AttentionChoice:
    vllm_backend: str | None  # the value of vLLM's --attention-backend; None leaves vLLM's own choice
    reason: str
    env: dict[str, str] = field(default_factory=dict)

    def flags(self) -> list[str]:
        return ["--attention-backend", self.vllm_backend] if self.vllm_backend else []


def passthrough_sets(passthrough: Sequence[str], *flags: str) -> bool:
    """Whether the vLLM flags after -- include one of `flags` (as `--flag value` or `--flag=value`)."""
    return any(arg.split("=", 1)[0] in flags for arg in passthrough)


def passthrough_names(passthrough: Sequence[str], flag: str) -> bool:
    """Whether the vLLM flags after -- set `flag` in any spelling vLLM's parser takes: underscores for
    dashes, a unique prefix (argparse abbreviations: --api-server 2), or one key of it (--flag.key value)."""
    # A prefix of at least the flag's first word (--compilation): a shorter one is shared with other flags. One
    # that is still ambiguous (--api: --api-key too) vLLM's parser refuses before the launcher gets here.
    shortest = len(flag.split("-")[2]) + 2
    names = (token.partition("=")[0].partition(".")[0].replace("_", "-") for token in passthrough
             if token.startswith("--"))
    return any(len(name) >= shortest and flag.startswith(name) for name in names)


def set_in_passthrough(passthrough: Sequence[str]) -> bool:
    """Whether the vLLM flags after -- already choose attention (then they decide)."""
    return (passthrough_sets(passthrough, "--attention-backend", "--attention-config")
            or any(arg.startswith("--attention-config.") for arg in passthrough))


def choose(requested: str, kv_cache_dtype: str, device: str, passthrough: Sequence[str],
           facts: GpuFacts, environ: Mapping[str, str]) -> AttentionChoice:
    if set_in_passthrough(passthrough):
        if requested != "auto":
            raise AttentionError("attention is set twice: --attention-backend before -- and a vLLM attention flag "
                                 "after it; keep one")
        return AttentionChoice(None, "as set after --")
    if device != "cuda":
        if requested != "auto":
            raise AttentionError(f"--attention-backend {requested} applies to GPUs; vLLM's CPU backend has its own")
        return AttentionChoice(None, "vLLM's CPU attention")
    if requested == "flash-attn":
        return AttentionChoice("FLASH_ATTN", "FlashAttention, as asked")
    if requested == "flashinfer":
        if not facts.flashinfer_installed:
            raise AttentionError("--attention-backend flashinfer: FlashInfer is not installed for this Python "
                                 "(pip install -r requirements.txt installs the version vLLM pins)")
        if not facts.nvcc:
            raise AttentionError("--attention-backend flashinfer: FlashInfer builds its kernels with nvcc on the "
                                 "first start and no nvcc is on PATH (install the CUDA toolkit, or add its bin/ to PATH)")
        return flashinfer(facts, environ, "FlashInfer, as asked")
    if kv_cache_dtype != "fp8":
        return AttentionChoice(None, "vLLM's default (FlashAttention; FlashInfer measured slower with a bf16 KV cache)")
    gpus = ("the GPUs are not all Hopper (compute capability 9.0)" if facts.compute_capabilities
            else "nvidia-smi did not give the GPUs' compute capability")
    missing = [why for ok, why in ((facts.hopper, gpus),
                                   (facts.flashinfer_installed, "FlashInfer is not installed"),
                                   (facts.nvcc, "no nvcc on PATH for its kernel build")) if not ok]
    if missing:
        return AttentionChoice(None, "vLLM's default (FlashAttention): FlashInfer measured ~12% faster with an fp8 "
                                     f"KV cache on H200, but {'; '.join(missing)}")
    return flashinfer(facts, environ, "FlashInfer for the fp8 KV cache (~12% more pages/s than FlashAttention on H200; "
                                      "the first start builds its kernels, ~2 min, cached in ~/.cache/flashinfer)")


def flashinfer(facts: GpuFacts, environ: Mapping[str, str], reason: str) -> AttentionChoice:
    env = {XQA_GATE: "1"} if facts.hopper and XQA_GATE not in environ else {}
    return AttentionChoice("FLASHINFER", reason, env)


def probe(environ: Mapping[str, str], run: Callable = subprocess.run) -> GpuFacts:
    """Compute capability of each visible GPU (nvidia-smi), and whether FlashInfer and nvcc are at hand."""
    return GpuFacts(compute_capabilities(environ, run), importlib.util.find_spec("flashinfer") is not None,
                    shutil.which("nvcc", path=environ.get("PATH")))


def compute_capabilities(environ: Mapping[str, str], run: Callable = subprocess.run) -> tuple[str, ...]:
    listed = nvidia_smi(["--query-gpu=compute_cap", "--format=csv,noheader"], run)
    caps = [line.strip() for line in (listed or "").splitlines()]
    if not caps or not all(re.fullmatch(r"\d+\.\d+", cap) for cap in caps):
        return ()
    visible = visible_devices(environ)
    if visible is None or not all(index.isdigit() for index in visible):
        return tuple(caps)  # all GPUs, or UUIDs / MIG names: judge by every GPU of the machine
    return tuple(caps[int(index)] for index in visible if int(index) < len(caps))

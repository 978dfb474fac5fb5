"""Scale-up on one machine: vLLM's own data parallelism, one engine replica per GPU.

A 1B model fits one GPU many times over, so more GPUs mean more replicas of the whole
engine (`--data-parallel-size`), not a split model. vLLM balances requests across the
replicas behind its one OpenAI endpoint; nothing home-made sits between client and vLLM.

Across machines each node runs its own complete server (this, on its GPUs) and the head's
gateway, SMG, is the one endpoint (ocr_bundle/serve/gateway.py, membership.py): vLLM itself
recommends independent instances behind a load balancer for dense models, and a lost node
then costs only its in-flight requests, which the gateway retries elsewhere.

    one node, all its GPUs:   --data-parallel-size auto

Standard library only (the launcher imports it before it knows which Python has vLLM).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class ScaleOutError(ValueError):
    """A scale-out request that cannot work; the message says how to fix it."""


def nvidia_smi(args: list[str], run: Callable = subprocess.run) -> str | None:
    """What `nvidia-smi ARGS` prints, or None where it is missing, fails or hangs."""
    try:
        done = run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG names); None when it is unset."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return [device.strip() for device in visible.split(",") if device.strip() and device.strip() != "-1"]


def visible_gpu_count(environ: Mapping[str, str], run: Callable = subprocess.run) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what `nvidia-smi -L` lists."""
    visible = visible_devices(environ)
    if visible is not None:
        return len(visible)
    listed = nvidia_smi(["-L"], run)
    return 0 if listed is None else sum(line.startswith("GPU ") for line in listed.splitlines())


def replicas_per_node(requested: str, gpus: int, tensor_parallel: int = 1) -> int:
    """'auto' → one replica per visible GPU (per tensor-parallel group); a number → that number."""
    if requested == "auto":
        if gpus < 1:
            raise ScaleOutError("data parallel 'auto' found no visible GPU (CUDA_VISIBLE_DEVICES or nvidia-smi -L)")
        return max(1, gpus // tensor_parallel)
    try:
        replicas = int(requested)
    except ValueError:
        raise ScaleOutError(f"--data-parallel-size must be 'auto' or a number, not {requested!r}") from None
    if replicas < 1:
        raise ScaleOutError("--data-parallel-size must be at least 1")
    if gpus and replicas * tensor_parallel > gpus:
        raise ScaleOutError(f"--data-parallel-size {replicas} needs {replicas * tensor_parallel} GPUs on this node; "
                            f"{gpus} are visible")
    return replicas


@dataclass(frozen=True)
class DataParallelPlan:
    local: int  # engine replicas on this machine

    def flags(self) -> list[str]:
        """vLLM's own data-parallel flags."""
        return ["--data-parallel-size", str(self.local)] if self.local > 1 else []

    def describe(self) -> str:
        replicas = f"data parallel {self.local}" if self.local > 1 else "one engine"
        return f"serving on {self.local} GPU{'s' if self.local > 1 else ''}: {replicas}"

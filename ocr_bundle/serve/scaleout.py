"""Scale-out on vLLM's own data parallelism: one engine replica per GPU, on one or many nodes.

A 1B model fits one GPU many times over, so more GPUs mean more replicas of the whole
engine (`--data-parallel-size`), not a split model. vLLM balances requests across the
replicas behind its one OpenAI endpoint; nothing home-made sits between client and vLLM.

Several machines join as *headless* data-parallel workers of a head node: the head runs
the API server (and the page) and the replicas of its own GPUs; each other node runs
only its replicas, which connect to the head's data-parallel RPC port. That port has no
authentication: keep it on a private network.

    one node, all its GPUs:   --data-parallel-size auto
    head of 2 nodes:          --nodes 2 --node-rank 0 --head-address 10.0.0.1
    the other node:           --nodes 2 --node-rank 1 --head-address 10.0.0.1   (headless)

Standard library only (the launcher imports it before it knows which Python has vLLM).
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

DEFAULT_RPC_PORT = 13345


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
    local: int  # replicas on this node
    nodes: int = 1
    node_rank: int = 0
    head_address: str | None = None
    rpc_port: int = DEFAULT_RPC_PORT

    def __post_init__(self) -> None:
        if self.nodes < 1 or not 0 <= self.node_rank < self.nodes:
            raise ScaleOutError(f"--node-rank must be between 0 and {self.nodes - 1} (--nodes {self.nodes})")
        if self.nodes > 1 and not self.head_address:
            raise ScaleOutError("--nodes > 1 needs --head-address (env HEAD_ADDRESS): the head node's address on the "
                                "private network the nodes share")

    @property
    def total(self) -> int:
        return self.local * self.nodes

    @property
    def headless(self) -> bool:
        return self.node_rank > 0

    def flags(self) -> list[str]:
        """vLLM's own data-parallel flags for this node (every node has the same GPU count)."""
        if self.nodes == 1:
            return ["--data-parallel-size", str(self.local)] if self.local > 1 else []
        flags = ["--data-parallel-size", str(self.total), "--data-parallel-size-local", str(self.local),
                 "--data-parallel-address", self.head_address, "--data-parallel-rpc-port", str(self.rpc_port)]
        if self.headless:
            flags += ["--headless", "--data-parallel-start-rank", str(self.node_rank * self.local)]
        return flags

    def describe(self) -> str:
        replicas = f"data parallel {self.local}" if self.local > 1 else "one engine"
        if self.nodes == 1:
            return f"serving on {self.local} GPU{'s' if self.local > 1 else ''}: {replicas}"
        role = "head (API server + page)" if not self.headless else "headless worker (engines only, no API server)"
        return (f"node {self.node_rank} of {self.nodes}, {role}: {self.local} replica(s) here, data parallel "
                f"{self.total} in all, joined through {self.head_address}:{self.rpc_port}")


def rpc_port_warning(plan: DataParallelPlan) -> str | None:
    """The data-parallel RPC port has no authentication: say so whenever it is in use."""
    if plan.nodes == 1:
        return None
    try:
        address = ipaddress.ip_address(plan.head_address)
        public = not (address.is_private or address.is_loopback or address.is_link_local)
    except ValueError:  # a host name: cannot tell
        public = None
    where = ("a PUBLIC address: anyone who reaches it can join or disrupt the engines" if public
             else "not authenticated: keep it on a private network the nodes share, closed to others")
    return f"the data-parallel RPC port {plan.head_address}:{plan.rpc_port} is {where} (docs: README, Scale)"

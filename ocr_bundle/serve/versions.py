"""The release a version string names: one rule for every check the bundle makes of vLLM's version.

A build from vLLM's own wheel index carries a local label (0.26.0+cu129): it is the release PyPI calls
0.26.0, and `pip install vllm==0.26.0` may install either. The versions the bundle verified, measured or
knows to be bad are named as releases, so each check compares releases; messages keep the full string.
Where builds of one release could differ, the check that matters still reads the code itself (the encoder
patch's source fingerprint, vllm_patches.VERIFIED).
"""

from __future__ import annotations


def release(version: str) -> str:
    """'0.26.0+cu129' -> '0.26.0'; a version without a local label is its own release."""
    return version.partition("+")[0]

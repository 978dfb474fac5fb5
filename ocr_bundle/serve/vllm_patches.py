"""Fixes the bundle applies to vLLM at start-up, in every vLLM process.

One fix today: **packed per-image attention in LightOnOCR's vision encoder** (Pixtral).

vLLM up to 0.26 runs the Pixtral encoder over all images of an engine step as one
concatenated sequence. Without xFormers (vLLM does not install it) it keeps the images
apart with a dense block-diagonal mask and `scaled_dot_product_attention`: the mask is
(patches of all images)² elements, a 1540 px page has ~8,500 patches, and masked SDPA
cannot use the FlashAttention kernel. So the encoder's cost grows with the *square* of
the images batched together, and it dominated LightOnOCR's throughput on an H200
(docs/benchmarks.md). vLLM fixed this upstream by routing Pixtral through its
`MMEncoderAttention` with per-image sequence lengths (vllm-project/vllm PR #52185,
after 0.26); the GPU build pinned here (0.26.0, the newest for torch 2.11) predates it.

`apply()` backports that fix: each encoder attention layer gets an `MMEncoderAttention`
(FlashAttention varlen on CUDA, per-image SDPA on CPU, whatever vLLM selects), and the
vision model passes cumulative sequence lengths instead of building the mask. Same
math, no checkpoint or output-shape change.

It replaces vLLM code, so it only touches the code it was proven on: the vLLM releases in
VERIFIED (0.26.0, on an H200: docs/benchmarks.md; a build's local label such as +cu129 aside,
ocr_bundle.serve.versions), and only while the source
of the three methods it replaces hashes to the fingerprint recorded for that version.
Anything else (a newer vLLM that packs by itself, a patched 0.26 build) runs as shipped,
and one log line says why. `OCR_BUNDLE_VLLM_PATCHES=off` switches it off; an error raised
inside the patched code says so.

With the patch, `OCR_BUNDLE_COMPILE_ENCODER=1` runs the encoder's 24-layer transformer
stack under torch.compile (Inductor), which vLLM 0.26 does not do for Pixtral (its encoder
does not opt in to `compile_mm_encoder`). The launcher sets it where it was measured to win
(ocr_bundle.serve.tuning). It compiles once, on the first image the engine encodes, with the patch
count dynamic so pages of other sizes reuse the code; if compiling fails, one log line says
so and the encoder runs eagerly. Without the patch the variable has no effect, and the
patch's log line says so.

How it reaches every process: start_vllm_server.py runs vLLM through
`python -m ocr_bundle.serve.vllm_serve`, which calls `apply()` at import time. Forked vLLM
processes inherit the patched classes; spawned ones re-import that main module first.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import time
from dataclasses import dataclass

from ocr_bundle.serve.versions import release

UPSTREAM_FIX = "vllm-project/vllm#52185"
# Set to "off" to run vLLM unpatched (the benchmarks' before/after comparison).
DISABLE_ENV = "OCR_BUNDLE_VLLM_PATCHES"
# "1" compiles the patched encoder's transformer stack (set by the launcher: ocr_bundle.serve.tuning).
COMPILE_ENV = "OCR_BUNDLE_COMPILE_ENCODER"
# vLLM version -> fingerprint of the Pixtral methods the patch replaces, as proven there.
VERIFIED = {"0.26.0": "38e27c21636a6f22"}
REPLACED_METHODS = (("PixtralHFAttention", "__init__"), ("PixtralHFAttention", "forward"),
                    ("PixtralHFVisionModel", "forward"))
_applied: str | None = None


@dataclass(frozen=True)
class PackedImages:
    """Per-image sequence boundaries, passed where vLLM 0.26 passes the dense mask."""

    cu_seqlens: object  # torch.Tensor on the device (int32), [0, n1, n1+n2, ...]
    max_seqlen: object  # torch.Tensor (int32 scalar), what FlashAttention needs
    sequence_lengths: object  # torch.Tensor or None (FlashInfer's cuDNN path only)


def cumulative_lengths(lengths: list[int]):
    """[n1, n2, ...] -> int32 array [0, n1, n1+n2, ...] (the varlen attention layout)."""
    import numpy as np

    return np.concatenate([np.zeros(1, dtype=np.int32), np.cumsum(lengths, dtype=np.int32)])


def source_fingerprint(module_source: str, methods=REPLACED_METHODS) -> str:
    """A short hash of the named methods' source text in a module's source (the ast, so
    the same on any machine whatever the line numbers around them)."""
    tree = ast.parse(module_source)
    wanted, parts = set(methods), []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and (node.name, item.name) in wanted:
                    parts.append(f"{node.name}.{item.name}\n{ast.get_source_segment(module_source, item)}")
    if len(parts) != len(wanted):
        return "missing"
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]


def compile_encoder_requested(environ=os.environ) -> bool:
    return environ.get(COMPILE_ENV, "").strip().lower() in ("1", "on", "true", "yes")


class CompiledOrEager:
    """Calls a module through torch.compile, or eagerly once compiling it has failed.

    torch.compile builds on the first call (the Pixtral encoder's stack: 15-45 s in an H200
    server's engine, docs/benchmarks.md). Shapes are dynamic from the start: a page of another
    size, or several images packed into one call, changes the patch count, and a static
    compile would build again, in the middle of serving, for each new count. If Dynamo or Inductor raises, the
    failure is logged once and the module runs eagerly from then on: a slower encoder beats an
    engine that cannot encode.
    """

    def __init__(self, module, name: str, backend="inductor"):
        import torch

        self.module = module
        self.name = name
        self._compiled = torch.compile(module, dynamic=True, backend=backend)
        self.state = "not called yet"

    def __call__(self, *args, **kwargs):
        if self._compiled is None:
            return self.module(*args, **kwargs)
        started = time.perf_counter()
        try:
            result = self._compiled(*args, **kwargs)
        except Exception as exc:  # Dynamo's and Inductor's errors have no common base class
            # If the eager module fails as well, the input is at fault: its error propagates
            # and compiling stays on. Only a call that eager code completes blames the compiler.
            result = self.module(*args, **kwargs)
            self._compiled = None
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            self.state = f"eager: torch.compile failed ({type(exc).__name__}: {first_line})"
            _log(f"{self.name}: {self.state}; it runs eagerly from now on")
            return result
        if self.state == "not called yet":
            self.state = f"compiled in {time.perf_counter() - started:.1f} s on its first call"
            _log(f"{self.name}: {self.state}")
        return result


def give_flash_attn_fake_the_kernels_layout() -> str:
    """vLLM 0.26's fake (meta) kernel of `vllm::flash_attn_maxseqlen_wrapper` returns
    `empty_like(q)`, with q's strides, but the real kernel returns a contiguous tensor.
    Inductor asserts the fake's layout at run time ("expected size 8580==8580, stride
    1024==64 at dim=1", docs/benchmarks.md, 2026-11-30 FlashInfer-attention run), so nothing that calls it compiles.
    This registers the real kernel's layout, in this process (vLLM fixed its fake later:
    0.32 returns `empty_like(q, memory_format=torch.contiguous_format)`)."""
    import torch

    def contiguous_like_the_kernel(q, k, v, batch_size, is_rocm_aiter, fa_version, scale=None,
                                   cu_seqlens=None, max_seqlen=None):
        return q.new_empty(q.shape)

    try:
        torch.library.register_fake("vllm::flash_attn_maxseqlen_wrapper", contiguous_like_the_kernel,
                                    allow_override=True)
    except (TypeError, RuntimeError) as exc:  # a torch without allow_override, or no such op
        return f"not replaced: {exc}"
    return "replaced"


def switched_off(environ=os.environ) -> bool:
    return environ.get(DISABLE_ENV, "").lower() in ("0", "off", "false", "no")


def encoder_compile_unavailable(vllm_version: str | None, environ=os.environ) -> str | None:
    """Why the bundle's compiled encoder cannot run, as far as is known before vLLM starts (the launcher's
    note), or None. It compiles only inside the patch, which applies on the VERIFIED versions alone
    (decide, below, checks their source again at start). None for an unknown version."""
    if switched_off(environ):
        return f"the bundle's encoder patch is off ({DISABLE_ENV}={environ[DISABLE_ENV]})"
    if vllm_version is not None and release(vllm_version) not in VERIFIED:
        return (f"the bundle compiles it inside its encoder patch, verified on vLLM {', '.join(sorted(VERIFIED))}, "
                f"not {vllm_version}")
    return None


def decide(vllm_version: str, fingerprint: str, packs_natively: bool) -> str | None:
    """Why the patch must not be applied, or None when it should be. Pure: tested as such."""
    if release(vllm_version) not in VERIFIED:
        verified = ", ".join(sorted(VERIFIED))
        why = (f"it packs Pixtral encoder attention itself ({UPSTREAM_FIX})" if packs_natively
               else "it runs as shipped")
        return f"not applied: vLLM {vllm_version} (the patch is verified on vLLM {verified} only; {why})"
    if fingerprint != (expected := VERIFIED[release(vllm_version)]):
        return (f"not applied: this vLLM {vllm_version}'s Pixtral encoder code is not the code the patch was "
                f"written against (fingerprint {fingerprint}, expected {expected}); it runs as shipped")
    return None


def apply() -> str:
    """Patch vLLM's Pixtral encoder where proven; returns what was done (also logged)."""
    global _applied
    if _applied is not None:
        return _applied
    if switched_off():
        _applied = f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
        _log(_applied)
        return _applied
    try:
        import vllm
        from vllm.model_executor.models import pixtral
    except ImportError as exc:  # vLLM missing or broken: let vLLM itself report it
        _applied = f"not applied: cannot import vLLM's Pixtral module ({exc})"
        _log(_applied)
        return _applied
    with open(pixtral.__file__, encoding="utf-8") as source:
        fingerprint = source_fingerprint(source.read())
    reason = decide(vllm.__version__, fingerprint, hasattr(pixtral, "MMEncoderAttention"))
    if reason is not None:
        _applied = reason + (f"; {COMPILE_ENV}=1 has no effect without it" if compile_encoder_requested() else "")
    else:
        try:
            compile_encoder = compile_encoder_requested()
            _patch_pixtral(pixtral, compile_encoder)
            _applied = (f"applied: packed per-image Pixtral encoder attention on vLLM {vllm.__version__} "
                        f"(backport of {UPSTREAM_FIX}; {DISABLE_ENV}=off turns it off)"
                        + (f"; the encoder's transformer stack compiles on first use ({COMPILE_ENV}=1)"
                           if compile_encoder else ""))
        except Exception as exc:  # nothing was replaced yet (assignments come last): vLLM as shipped
            _applied = (f"not applied: it failed while patching ({type(exc).__name__}: {exc}); vLLM runs as "
                        f"shipped. Report it, and set {DISABLE_ENV}=off to skip the attempt")
    _log(_applied)
    return _applied


def blame_patch(function):
    """Errors raised inside patched code name the switch that takes the patch out."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            exc.add_note(f"Raised inside the LightOnOCR bundle's patch of vLLM's Pixtral encoder "
                         f"(ocr_bundle/serve/vllm_patches.py): {DISABLE_ENV}=off runs vLLM as shipped.")
            raise

    return wrapper


def _log(what: str) -> None:
    # Plain stderr, not vLLM's logger: this runs at import time, before vLLM has set up
    # its logging (newer versions do that lazily and would drop the line).
    print(f"[ocr_bundle] LightOnOCR bundle patch {what}", file=sys.stderr, flush=True)


def _patch_pixtral(pixtral, compile_encoder: bool = False) -> None:
    import torch
    from vllm.model_executor.layers.attention import MMEncoderAttention
    from vllm.model_executor.models.vision import resolve_visual_encoder_outputs
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    # FlashInfer's cuDNN path wants Q/K/V as views into one packed buffer; the others
    # take the tensors as they are. Other backends keep vLLM's own (masked) code.
    packed_backends = {
        AttentionBackendEnum.FLASH_ATTN,
        AttentionBackendEnum.TORCH_SDPA,
        AttentionBackendEnum.TRITON_ATTN,
        AttentionBackendEnum.ROCM_AITER_FA,
    }
    attention_cls = pixtral.PixtralHFAttention
    vision_cls = pixtral.PixtralHFVisionModel
    original_attention_init = attention_cls.__init__
    original_attention_forward = attention_cls.forward
    original_vision_forward = vision_cls.forward

    def attention_init(self, config, quant_config=None, *, prefix: str = "") -> None:
        original_attention_init(self, config, quant_config, prefix=prefix)
        # No weights: the checkpoint loads exactly as before.
        self.packed_attn = MMEncoderAttention(self.n_heads, self.head_dim, prefix=f"{prefix}.packed_attn")
        if prefix.endswith("layers.0.attention"):  # once per model, in the engine process
            backend = self.packed_attn.attn_backend
            _log(f"in use: Pixtral encoder attention runs packed per image with {backend.name}"
                 if backend in packed_backends else
                 f"inactive: {backend.name} is not a packed backend here; vLLM's masked attention runs")

    def attention_forward(self, hidden_states, attention_mask, position_embeddings):
        if not isinstance(attention_mask, PackedImages):
            return original_attention_forward(self, hidden_states, attention_mask, position_embeddings)
        batch, patches, _ = hidden_states.size()
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.chunk(3, dim=-1)
        # HF's rotary embedding wants (batch, heads, patches, head_dim); attention wants
        # (batch, patches, heads, head_dim).
        q = q.view(batch, patches, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, patches, self.n_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = pixtral.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
        out = self.packed_attn(
            q.transpose(1, 2), k.transpose(1, 2), v.reshape(batch, patches, self.n_heads, self.head_dim),
            cu_seqlens=attention_mask.cu_seqlens, max_seqlen=attention_mask.max_seqlen,
            sequence_lengths=attention_mask.sequence_lengths,
        )
        attn_output, _ = self.o_proj(out.reshape(batch, patches, self.n_heads * self.head_dim))
        return attn_output, None

    def vision_forward(self, pixel_values, *, select_layers=None, feature_select_strategy=None):
        attn = self.transformer.layers[0].attention.packed_attn
        if attn.attn_backend not in packed_backends:
            return original_vision_forward(self, pixel_values, select_layers=select_layers,
                                           feature_select_strategy=feature_select_strategy)
        # vLLM 0.26's PixtralHFVisionModel.forward, except the mask: sequence lengths instead.
        patch_embeds_list = [self.patch_conv(img.unsqueeze(0).to(self.dtype)) for img in pixel_values]
        patch_embeds = [p.flatten(2).permute(0, 2, 1) for p in patch_embeds_list]
        embed_sizes = [p.shape[1] for p in patch_embeds]
        patch_embeds = self.ln_pre(torch.cat(patch_embeds, dim=1))
        position_ids = pixtral.position_ids_in_meshgrid(
            patch_embeds_list, max_width=self.config.image_size // self.config.patch_size,
        ).to(self.device)
        position_embedding = self.patch_positional_embedding(patch_embeds, position_ids)
        out = encoder_stack(self)(
            patch_embeds, packed_images(attn, embed_sizes, self.device), position_embedding,
            return_all_hidden_states=select_layers is not None,
        )
        out = resolve_visual_encoder_outputs(
            out, None, select_layers=select_layers,
            max_possible_layers=self.config.num_hidden_layers,
            feature_select_strategy=feature_select_strategy,
        )
        return torch.split(out.squeeze(0), embed_sizes)

    def encoder_stack(tower):
        """The transformer stack to run: the module itself, or its compiled form (made once
        per tower, kept out of the module tree so that weights and state dicts do not see it)."""
        if not compile_encoder:
            return tower.transformer
        compiled = tower.__dict__.get("_bundle_compiled_stack")
        if compiled is None:
            _log(f"encoder: the fake kernel of vllm::flash_attn_maxseqlen_wrapper "
                 f"{give_flash_attn_fake_the_kernels_layout()} before compiling")
            compiled = CompiledOrEager(tower.transformer, "encoder transformer stack")
            object.__setattr__(tower, "_bundle_compiled_stack", compiled)
        return compiled

    def packed_images(attn, lengths: list[int], device) -> PackedImages:
        cu_seqlens = cumulative_lengths(lengths)
        backend = attn.attn_backend
        return PackedImages(
            # hidden size and TP degree only matter for FlashInfer, which is not packed here.
            cu_seqlens=MMEncoderAttention.maybe_recompute_cu_seqlens(
                backend, cu_seqlens, attn.num_heads * attn.head_size, 1, device),
            max_seqlen=torch.tensor(MMEncoderAttention.compute_max_seqlen(backend, cu_seqlens), dtype=torch.int32),
            sequence_lengths=MMEncoderAttention.maybe_compute_seq_lens(backend, cu_seqlens, device),
        )

    attention_cls.__init__ = blame_patch(attention_init)
    attention_cls.forward = blame_patch(attention_forward)
    vision_cls.forward = blame_patch(vision_forward)
    # Kept for benchmarks/encoder_check.py, which compares both paths on the GPU.
    vision_cls.dense_mask_forward = original_vision_forward

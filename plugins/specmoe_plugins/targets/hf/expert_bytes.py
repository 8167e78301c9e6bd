# SPDX-License-Identifier: Apache-2.0
"""Bytes of one routed expert, as the checkpoint stores it and as the loaded model holds it.

The two differ: GPT-OSS checkpoints store their experts in MXFP4 and are dequantized to bfloat16 on load (about
3.8x more bytes), DeepSeek-V3 checkpoints store FP8 with block scales, a checkpoint saved in float32 may be
loaded in bfloat16. The paper's per-expert sizes (Fig. 1c: 12.45 MB MXFP4, 37.75 MB bf16, 44.04 MB FP8) and
therefore its Table 2 traffic estimates are at the *stored* precision; the loaded figure is what a
dequantized verification pass here really reads.

Counting rules for the stored format, read from the checkpoint's ``config.json`` (``quantization_config``,
``dtype`` / ``torch_dtype``), applied to an unquantized experts module of the architecture whose parameters
are ``[E, ...]``: 3-D parameters are weight matrices, 2-D ones per-expert vectors (biases).

* no quantization: every parameter at the checkpoint dtype.
* ``mxfp4`` (OCP microscaling): matrices as 4-bit e2m1 values plus one 8-bit e8m0 scale per 32 consecutive
  weights along the input dimension (4.25 bits per weight); vectors at the checkpoint dtype.
* ``fp8`` (``weight_block_size`` [bo, bi], DeepSeek-V3): matrices as one byte per weight plus one float32
  ``weight_scale_inv`` per bo x bi block (a fused gate/up matrix counts as one matrix: exact when the
  intermediate size is a multiple of bo, as in every released checkpoint); vectors at the checkpoint dtype.
* experts listed in ``modules_to_not_convert``: as without quantization. Other methods are reported as
  unknown and counted at the loaded size (said so in the description).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ExpertBytes", "expert_bytes", "loaded_bytes_per_expert", "stored_bytes_per_expert"]


@dataclass(frozen=True)
class ExpertBytes:
    """Size of one routed expert (weights and biases of its gate/up and down projections).

    Attributes:
        loaded: bytes in memory after loading (the experts module's parameters / ``E``).
        stored: bytes in the checkpoint (see the module docstring for the counting rules).
        storage: a short description of the stored format.
    """

    loaded: int
    stored: int
    storage: str


def loaded_bytes_per_expert(experts: torch.nn.Module, num_experts: int) -> int:
    """Bytes of the parameters of an experts module (any dtypes, quantized or not; meta tensors work) / E."""
    total = sum(p.numel() * p.element_size() for p in experts.parameters())
    return int(total // num_experts)


def _plain(config: Any) -> dict[str, Any]:
    q = getattr(config, "quantization_config", None)
    if q is None:
        return {}
    return dict(q.to_dict() if hasattr(q, "to_dict") else q)


def _checkpoint_dtype(config: Any) -> torch.dtype | None:
    for key in ("dtype", "torch_dtype"):
        d = getattr(config, key, None)
        if isinstance(d, torch.dtype):
            return d
        if isinstance(d, str) and isinstance(getattr(torch, d, None), torch.dtype):
            return getattr(torch, d)
    return None


def _not_converted(module_path: str, patterns: list[str]) -> bool:
    for pat in patterns:
        if fnmatch.fnmatchcase(module_path, pat) or fnmatch.fnmatchcase(module_path, pat + ".*"):
            return True
        if "*" not in pat and (module_path == pat or module_path.startswith(pat + ".")):
            return True
    return False


def stored_bytes_per_expert(experts: torch.nn.Module, num_experts: int, config: Any, module_path: str = "",
                            default_dtype: torch.dtype | None = None) -> tuple[int, str]:
    """``(bytes, description)`` of one routed expert as the checkpoint described by ``config`` stores it.

    Args:
        experts: an *unquantized* experts module of the architecture (e.g. built on the meta device from the
            config); only parameter shapes are read. ``is_transposed`` marks ``[E, in, out]`` matrices.
        num_experts: ``E``.
        config: the checkpoint's configuration (``quantization_config``, ``dtype``).
        module_path: the module's name in the model (``model.layers.3.mlp.experts``), matched against
            ``modules_to_not_convert``.
        default_dtype: the dtype of unquantized tensors when ``config`` records none (e.g. the loaded dtype);
            else that of ``experts``' parameters.
    """
    q = _plain(config)
    method = str(q.get("quant_method", "")).lower()
    dtype = _checkpoint_dtype(config)
    params = [p for p in experts.parameters() if p.dim() >= 2 and int(p.shape[0]) == num_experts]
    recorded = dtype is not None
    if dtype is None:
        dtype = default_dtype or (params[0].dtype if params else torch.float32)
    dt_name = str(dtype).replace("torch.", "") + ("" if recorded else " (no dtype in config.json: as loaded)")
    vec_size = torch.empty((), dtype=dtype).element_size()
    transposed = bool(getattr(experts, "is_transposed", False))  # [E, in, out]; else [E, out, in]
    mats = [(int(p.shape[2]), int(p.shape[1])) if transposed else (int(p.shape[1]), int(p.shape[2]))
            for p in params if p.dim() == 3]  # (out, in) of each weight matrix
    vec_bytes = sum(math.prod(p.shape[1:]) for p in params if p.dim() == 2) * vec_size
    weights = sum(o * i for o, i in mats)
    if method and _not_converted(module_path, list(q.get("modules_to_not_convert") or [])):
        method = ""
    if not method:
        return weights * vec_size + vec_bytes, f"{dt_name} ({vec_size} bytes per weight)"
    if method == "mxfp4":
        scales = sum(o * math.ceil(i / 32) for o, i in mats)
        return (weights // 2 + weights % 2 + scales + vec_bytes,
                f"mxfp4: 4-bit e2m1 weights + one e8m0 byte scale per 32 weights (4.25 bits per weight); "
                f"biases {dt_name}")
    if method == "fp8":
        bo, bi = (int(b) for b in (q.get("weight_block_size") or (128, 128)))
        blocks = sum(math.ceil(o / bo) * math.ceil(i / bi) for o, i in mats)
        fmt = q.get("fmt", "e4m3")
        return (weights + 4 * blocks + vec_bytes,
                f"fp8 {fmt}: 1 byte per weight + one float32 scale per {bo}x{bi} block"
                + (f" ({q['scale_fmt']} values)" if q.get("scale_fmt") else ""))
    loaded = loaded_bytes_per_expert(experts, num_experts)
    return loaded, f"unknown quantization '{method}': counted at the loaded size"


def expert_bytes(plain_experts: torch.nn.Module, loaded_experts: torch.nn.Module, num_experts: int,
                 config: Any, module_path: str = "") -> ExpertBytes:
    """Both sizes of one routed expert (see :func:`stored_bytes_per_expert`, :func:`loaded_bytes_per_expert`).

    Args:
        plain_experts: an unquantized experts module of the architecture (shapes only; meta is fine).
        loaded_experts: the experts module as loaded (its parameters' dtypes give the loaded size).
    """
    loaded_dtype = next((p.dtype for p in loaded_experts.parameters()
                         if p.is_floating_point() and p.element_size() >= 2), None)  # not fp8 codes
    stored, storage = stored_bytes_per_expert(plain_experts, num_experts, config, module_path, loaded_dtype)
    return ExpertBytes(loaded=loaded_bytes_per_expert(loaded_experts, num_experts), stored=stored,
                       storage=storage)

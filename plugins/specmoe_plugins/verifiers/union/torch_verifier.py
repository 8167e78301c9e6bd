# SPDX-License-Identifier: Apache-2.0
"""``torch_union``: expert-union-grouped MoE experts in plain PyTorch
(:func:`specmoe_plugins.verifiers.union.reference.union_experts_forward`, the specification of the Triton kernels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch

from specmoe.interfaces.verifier import GraphExperts, Verifier
from specmoe_plugins.verifiers.union.reference import graph_experts, prepare, union_experts_forward

__all__ = ["TorchUnionVerifier"]


class TorchUnionVerifier(Verifier):
    """Reads each union expert once and multiplies it by all tokens routed to it (PyTorch)."""

    description = "union-grouped experts in PyTorch: each union expert's weights read once, fp32 accumulation"

    @dataclass
    class Config:
        strategy: Optional[Literal["grouped", "loop"]] = None
        """``grouped`` (``grouped_mm`` over the slots sorted by expert: a fixed number of operations, no host
        sync), ``loop`` (one matmul per union expert); default: ``loop`` on CPUs, ``grouped`` on GPUs where
        torch runs it for the weights' dtype (see :mod:`specmoe_plugins.verifiers.union.reference`)."""
        compile: bool = True
        """on a CPU, the target's decoding passes as one compiled graph with this verifier's graph form of the
        experts inside (``specmoe_plugins.targets.hf.graph``; the eager passes where the machine cannot compile it or
        gives a row a different result beside others); ``false``: every pass eager."""

    def implementation_name(self) -> str:
        return "specmoe_torch_union"

    def experts_forward(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        return union_experts_forward(module, hidden, top_k_index, top_k_weights, self.config.strategy)

    def compiled_passes(self) -> bool:
        return self.config.compile

    def graph_experts(self, module: Any) -> GraphExperts | None:
        return graph_experts(module)

    def install(self, target: Any) -> None:
        """Switch ``target`` to this implementation; on a CPU in bf16 / fp16 the GPT-OSS experts' weights are
        re-stored output-major first (:func:`~specmoe_plugins.verifiers.union.reference.prepare`: same values)."""
        for module in target.experts_modules():
            prepare(module)
        super().install(target)

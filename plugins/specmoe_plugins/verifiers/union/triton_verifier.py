# SPDX-License-Identifier: Apache-2.0
"""``triton_union``: expert-major, read-once Triton kernels for the verification pass.

For ``T <= max_tokens`` tokens per MoE layer call (``T = gamma * batch`` in a verify step), each union
expert's weights are streamed once by the kernels of :mod:`.kernels` (in this folder). Above ``max_tokens`` (e.g. a
long prefill) the call falls back to the PyTorch union path (``torch_union``): the kernels use one M tile of
``next_pow2(T)`` rows per expert, which stops paying off once experts hold many rows.

Needs the ``triton`` extra (``pip install 'specmoe[triton]'``). On a CPU tensor it runs only under the Triton
interpreter (``TRITON_INTERPRET=1`` set before triton is imported) and only in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specmoe.errors import UserError, require
from specmoe.interfaces.verifier import Verifier
from specmoe_plugins.verifiers.union.layout import experts_layout
from specmoe_plugins.verifiers.union.reference import union_experts_forward

__all__ = ["TritonUnionVerifier"]


class TritonUnionVerifier(Verifier):
    """Union-aware Triton experts: gate_up + activation, down + routing weight, fixed-order sum."""

    description = "union-aware Triton MoE kernels (each union expert read once); large T -> torch_union"

    @dataclass
    class Config:
        max_tokens: int = 64
        """largest token count per layer call sent to the kernels; larger calls use the torch_union path."""
        block_n: int = 64
        """gate_up kernel: intermediate columns per program (GPT-OSS loads twice as many interleaved)."""
        block_k: int = 128
        """gate_up kernel: hidden-dimension step."""
        down_block_n: int = 64
        """down kernel: output columns per program."""
        down_block_k: int = 128
        """down kernel: intermediate-dimension step."""
        num_warps: int = 4
        num_stages: int = 3

    def __init__(self, config: Any = None, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        c = self.config
        if c.max_tokens < 1:
            raise UserError(f"verifier triton_union: max_tokens must be >= 1 (got {c.max_tokens})")
        for name in ("block_n", "block_k", "down_block_n", "down_block_k"):
            v = getattr(c, name)
            if v < 16 or v & (v - 1):
                raise UserError(f"verifier triton_union: {name} must be a power of two >= 16 (got {v})")
        self._kernels: Any = None

    def implementation_name(self) -> str:
        return "specmoe_triton_union"

    def kernels(self) -> Any:
        """The kernel module (imports triton on first use)."""
        if self._kernels is None:
            require("triton", "triton")
            from specmoe_plugins.verifiers.union import kernels

            c = self.config
            self._blocks = kernels.UnionBlocks(block_n=c.block_n, block_k=c.block_k,
                                               down_block_n=c.down_block_n, down_block_k=c.down_block_k,
                                               num_warps=c.num_warps, num_stages=c.num_stages)
            self._kernels = kernels
        return self._kernels

    def experts_forward(self, module: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
        if hidden.shape[0] == 0:
            return torch.zeros_like(hidden)
        if hidden.shape[0] > self.config.max_tokens:
            return union_experts_forward(module, hidden, top_k_index, top_k_weights)
        kernels = self.kernels()
        return kernels.union_moe(module, experts_layout(module), hidden, top_k_index, top_k_weights,
                                 self._blocks)

    def install(self, target: Any) -> None:
        self.kernels()  # fail early (missing extra) rather than inside the first forward
        super().install(target)

# SPDX-License-Identifier: Apache-2.0
"""Kernels for union-aware MoE verification.

``layout`` and ``union_torch`` (the PyTorch specification of the kernels) are plain PyTorch; the Triton kernels
(``triton``, an optional extra) and their routing metadata are the ``triton_union`` verifier's, in its folder
(``union_moe`` and ``routing_meta`` here are deprecated aliases of them).
"""

__all__: list[str] = []

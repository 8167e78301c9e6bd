# SPDX-License-Identifier: Apache-2.0
"""Kernels for union-aware MoE verification.

``layout``, ``routing_meta`` and ``union_torch`` (the PyTorch specification of the kernels) are plain
PyTorch; ``union_moe`` holds the Triton kernels and imports ``triton`` (an optional extra), so nothing here
imports it eagerly.
"""

__all__: list[str] = []

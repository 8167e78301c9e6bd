# SPDX-License-Identifier: Apache-2.0
"""Row kernels shared by the compiled decoding passes (``row_kernels``).

The union-of-experts kernels (the PyTorch specification, the experts layout and the Triton kernels) are the union
verifiers', in their folder ``specmoe_plugins.verifiers.union``; ``union_torch``, ``layout``, ``union_moe`` and
``routing_meta`` here are deprecated aliases of them.
"""

__all__: list[str] = []

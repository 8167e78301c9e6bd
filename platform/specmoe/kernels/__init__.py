# SPDX-License-Identifier: Apache-2.0
"""Row kernels shared by the compiled decoding passes (``row_kernels``); the union-of-experts kernels live in
``specmoe_plugins.verifiers.union``."""

__all__: list[str] = []

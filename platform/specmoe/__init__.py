# SPDX-License-Identifier: Apache-2.0
"""specmoe: cost-aware speculative decoding (EcoSpec) for Mixture-of-Experts LLMs.

The core package imports nothing heavy: torch, transformers and plugins load on first use.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]

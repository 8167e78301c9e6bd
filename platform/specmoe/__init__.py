# SPDX-License-Identifier: Apache-2.0
"""specmoe: cost-aware speculative decoding (EcoSpec) for Mixture-of-Experts LLMs (imports nothing heavy)."""

from specmoe.utils.deprecation import install_aliases as _install_aliases

__version__ = "0.1.0"
__all__ = ["__version__"]

_install_aliases()  # the deprecated paths of moved modules (specmoe.utils.deprecation.MOVED); imports nothing

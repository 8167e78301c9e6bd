# SPDX-License-Identifier: Apache-2.0
"""The decoding engine (``engine``), the autoregressive reference (``ar``), lossless acceptance, stop rules,
selection building blocks and per-step records. Depends on :mod:`specmoe.interfaces` only.
"""

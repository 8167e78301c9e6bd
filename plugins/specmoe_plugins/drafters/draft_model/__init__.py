# SPDX-License-Identifier: Apache-2.0
"""``draft_model``: classic speculative decoding with a small causal LM (no training stage)."""

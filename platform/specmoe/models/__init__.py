# SPDX-License-Identifier: Apache-2.0
"""Helpers around Hugging Face MoE models (tiny configs for tests and demos)."""

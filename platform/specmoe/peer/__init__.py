# SPDX-License-Identifier: Apache-2.0
"""The peer engine (vLLM): scripts run by path in its own environment, and the files its plugin reads."""

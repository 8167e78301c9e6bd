# SPDX-License-Identifier: Apache-2.0
"""Evaluation grid: methods x datasets x temperatures x budgets x batch sizes, measured in interleaved groups."""

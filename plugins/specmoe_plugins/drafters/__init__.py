# SPDX-License-Identifier: Apache-2.0
"""Drafters, one folder each (plugin, network, checkpoints, tree building, training module and stage)."""

# SPDX-License-Identifier: Apache-2.0
"""Benchmark data: locating files (local or hub), the dataset plugin base class, prompt rendering."""

from __future__ import annotations

from specmoe.data.base import BenchmarkDataset, select_indices
from specmoe.data.render import has_chat_template, messages_for_turn, plain_chat_text, render_prompt, render_turn
from specmoe.data.sources import DATA_DIR_ENV, DataRequest, hub_offline, locate, read_records

__all__ = ["DATA_DIR_ENV", "BenchmarkDataset", "DataRequest", "has_chat_template", "hub_offline", "locate",
           "messages_for_turn", "plain_chat_text", "read_records", "render_prompt", "render_turn",
           "select_indices"]

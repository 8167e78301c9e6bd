# SPDX-License-Identifier: Apache-2.0
"""Peer engines: another serving engine run on specmoe's checkpoints and prompts, for comparison."""

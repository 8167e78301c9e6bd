# SPDX-License-Identifier: Apache-2.0
"""Evaluation grid: methods x datasets x temperatures x budgets x batch sizes, measured in interleaved groups
(:mod:`~specmoe.evaluation.group`) and cached per group; results are
:class:`~specmoe.evaluation.results.CellResult` s."""

# SPDX-License-Identifier: Apache-2.0
"""Prompt templates shared by several benchmark datasets (paper Appendix E)."""

from __future__ import annotations

__all__ = ["problem_solution_prompt"]


def problem_solution_prompt(problem: str) -> str:
    """``"Problem:\\n{problem}\\n\\nSolution:"``: the zero-shot prompt of MATH500 and AMC."""
    return f"Problem:\n{problem}\n\nSolution:"

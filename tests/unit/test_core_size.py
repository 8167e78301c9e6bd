# SPDX-License-Identifier: Apache-2.0
"""The core stays small enough to read: ``platform/specmoe`` under 13,500 lines (issue 24's budget).

What a plugin alone uses belongs in its folder; what several share is core. When this fails, move the plugin-only
part out (or make the case for a larger budget in the issue), rather than packing lines.
"""

from __future__ import annotations

import pathlib

CORE = pathlib.Path(__file__).resolve().parents[2] / "platform" / "specmoe"
BUDGET = 13_500


def test_core_is_under_its_line_budget():
    sizes = {p.relative_to(CORE).as_posix(): len(p.read_text().splitlines()) for p in CORE.rglob("*.py")}
    total = sum(sizes.values())
    largest = ", ".join(f"{f} {n}" for f, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert len(sizes) > 50 and total < BUDGET, f"core is {total} lines (budget {BUDGET}); largest: {largest}"

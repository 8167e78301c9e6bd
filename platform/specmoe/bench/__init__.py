# SPDX-License-Identifier: Apache-2.0
"""Benchmarks (``platform bench <name>``): each module defines ``add_arguments(parser)`` and ``run(args)``.

The core's benchmarks are listed in :data:`BENCHES`; a plugin ships its own through the entry-point group
``specmoe.benches`` (``name = "pkg.module"``), found by :data:`specmoe.registry.benches` as stages are.
Benchmarks report ratios measured in one run; tests never assert wall-clock limits.
"""

#: core bench name -> module (plugin benchmarks come from the entry-point group ``specmoe.benches``)
BENCHES = {
    "engine": "specmoe.bench.engine",
    "selector": "specmoe.bench.selector",
    "tree": "specmoe.bench.tree",
}

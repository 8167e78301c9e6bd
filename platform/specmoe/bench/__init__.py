# SPDX-License-Identifier: Apache-2.0
"""Benchmarks (``platform bench <name>``): each module defines ``add_arguments(parser)`` and ``run(args)``.

Benchmarks report ratios measured in one run; tests never assert wall-clock limits.
"""

#: bench name -> module
BENCHES = {
    "engine": "specmoe.bench.engine",
    "verifier": "specmoe.bench.verifier",
    "expert_latency": "specmoe.bench.expert_latency",
    "selector": "specmoe.bench.selector",
    "goodput": "specmoe.bench.goodput",
    "predictor": "specmoe.bench.predictor",
    "tree": "specmoe.bench.tree",
    "peer": "specmoe.bench.peer",
}

# SPDX-License-Identifier: Apache-2.0
"""What the benchmarks share (``platform bench <name>``): the target and prompts they run on (:mod:`.target`),
the drafter (:mod:`.drafters`), aten operation counts (:mod:`.opcount`).

Every benchmark, the built-in ones included (``engine``, ``tree``, ``selector``: ``specmoe_plugins/benches/``), is a
module with ``add_arguments(parser)`` and ``run(args)`` declared in the entry-point group ``specmoe.benches`` and
found through :data:`specmoe.registry.benches`. Benchmarks report ratios measured in one run; tests never assert
wall-clock limits.
"""

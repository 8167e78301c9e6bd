# SPDX-License-Identifier: Apache-2.0
"""The built-in benchmarks of the engine (``platform bench engine | tree | selector``), declared in the entry-point
group ``specmoe.benches`` like any plugin's; what they share with other benches is core (:mod:`specmoe.bench`)."""

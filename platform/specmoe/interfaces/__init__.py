# SPDX-License-Identifier: Apache-2.0
"""One interface (abstract base class) per component kind, with tensor shapes on every method, and the value
types the components exchange: :class:`~specmoe.interfaces.tree.DraftTree` (``tree.py``),
:class:`~specmoe.interfaces.kv.KVState` (``kv.py``), :class:`~specmoe.interfaces.drafter.Committed` and
:class:`~specmoe.interfaces.target.TargetOutput`.

This package is a leaf: it imports nothing else from ``specmoe`` (checked by the import contracts in
``pyproject.toml``), so every other part may depend on it.
"""

# SPDX-License-Identifier: Apache-2.0
"""Cached, resumable stages (:mod:`.runner`) and the cache's view of each (:mod:`.state`, ``platform cache``)."""

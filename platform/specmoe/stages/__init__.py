# SPDX-License-Identifier: Apache-2.0
"""Cached, resumable stages (:mod:`specmoe.stages.runner`) and what the cache knows about each one
(:mod:`specmoe.stages.state`, behind ``platform cache ls / clean``)."""

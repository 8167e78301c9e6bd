# SPDX-License-Identifier: Apache-2.0
"""Routing traces: per-token router decisions of a target on a dataset (format, collection, evaluation).

Importing this package imports no torch-heavy module beyond the format's dataclasses; collection and
evaluation live in :mod:`specmoe.traces.collect` and :mod:`specmoe.traces.evaluate`.
"""

from specmoe.traces.format import (
                                   COLUMNS,
                                   TRACE_FORMAT,
                                   SampleRecord,
                                   SampleTrace,
                                   ShardInfo,
                                   TraceMeta,
                                   TraceReader,
                                   TraceWriter,
)

__all__ = ["COLUMNS", "TRACE_FORMAT", "SampleRecord", "SampleTrace", "ShardInfo", "TraceMeta", "TraceReader",
           "TraceWriter"]

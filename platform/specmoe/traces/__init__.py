# SPDX-License-Identifier: Apache-2.0
"""Routing traces: per-token router decisions of a target on a dataset (format, evaluation).

Importing this package imports no torch-heavy module beyond the format's dataclasses; evaluation lives in
:mod:`specmoe.traces.evaluate`, collection in the ``collect_traces`` stage's folder.
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

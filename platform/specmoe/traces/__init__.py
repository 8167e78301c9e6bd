# SPDX-License-Identifier: Apache-2.0
"""Routing traces: per-token router decisions of a target on a dataset (the on-disk format).

Evaluation on traces lives in :mod:`specmoe.training.trace_eval`, collection in the ``collect_traces`` stage.
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

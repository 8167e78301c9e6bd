# SPDX-License-Identifier: Apache-2.0
"""Routing traces: per-token router decisions of a target on a dataset (format, evaluation).

Importing this package imports no torch-heavy module beyond the format's dataclasses; a predictor's evaluation on
traces lives in :mod:`specmoe.training.trace_eval` (beside the routing metrics and the teacher forward it uses, so
that ``training`` reads ``traces`` and not the other way round), collection in the ``collect_traces`` stage's
folder.
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

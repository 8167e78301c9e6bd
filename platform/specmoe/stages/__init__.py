# SPDX-License-Identifier: Apache-2.0
"""Cached, resumable stages (see :mod:`specmoe.stages.runner`)."""

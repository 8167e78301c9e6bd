# SPDX-License-Identifier: Apache-2.0
"""Small shared utilities, each in one place: a stable hash, atomic writes and file locks, process ranks."""

# SPDX-License-Identifier: Apache-2.0
"""One abstract interface per component kind and the values they exchange; a leaf (no other specmoe imports)."""

# SPDX-License-Identifier: Apache-2.0
"""Built-in specmoe plugins, declared as entry points in pyproject.toml exactly like third-party ones."""

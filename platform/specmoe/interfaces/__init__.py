# SPDX-License-Identifier: Apache-2.0
"""One interface (abstract base class) per component kind; tensor shapes are documented on each method."""

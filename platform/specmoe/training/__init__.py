# SPDX-License-Identifier: Apache-2.0
"""Lightning training (targets, predictors, drafters) with shared Trainer options."""

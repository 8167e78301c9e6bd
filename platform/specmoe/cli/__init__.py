# SPDX-License-Identifier: Apache-2.0
"""The ``platform`` command line (stdlib argparse; one subcommand per module)."""

# SPDX-License-Identifier: Apache-2.0
"""``python -m specmoe`` is the same as the ``platform`` command."""

from specmoe.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())

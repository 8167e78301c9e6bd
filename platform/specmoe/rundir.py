# SPDX-License-Identifier: Apache-2.0
"""Run directories: ``<output_dir>/<recipe name>/<YYYYmmdd-HHMMSS>-<id>/`` (recipe, overrides, env, results)."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

__all__ = ["make_run_dir"]


def make_run_dir(output_dir: str | Path, name: str, resolved: dict[str, Any], overrides: list[str]) -> Path:
    """Create the run directory and write ``config.yaml``, ``overrides.txt`` and ``env.json``."""
    import yaml

    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = Path(output_dir) / name / f"{stamp}-{secrets.token_hex(3)}"
    run.mkdir(parents=True, exist_ok=False)
    (run / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    (run / "overrides.txt").write_text("\n".join(overrides) + ("\n" if overrides else ""))
    from specmoe.tracking.environment import env_params

    (run / "env.json").write_text(json.dumps(env_params(), indent=2))
    return run

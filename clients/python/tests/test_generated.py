"""The sync modules are generated from their asyncio originals (tools/async_to_sync.py), so that the
two APIs cannot drift apart: each must be what the script makes of its original today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "async_to_sync.py"


def test_the_sync_modules_are_generated_from_the_asyncio_ones():
    checked = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

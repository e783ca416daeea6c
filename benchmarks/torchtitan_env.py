"""torchtitan's own environment for ``benchmarks/vs_torchtitan.py``: a virtual environment outside the project's
(``~/.cache/meshtrain/torchtitan-0.3.0-env`` by default), without the system's or the project's site-packages,
holding ``torch==2.13.0`` (CPU) and ``torchtitan==0.3.0`` from the package index, patched for CPU and torch 2.13
by ``benchmarks/torchtitan-0.3.0-cpu.diff`` (each hunk says why). Built once; rebuilt when the diff changes.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIFF = HERE / "torchtitan-0.3.0-cpu.diff"
PACKAGES = ("torch==2.13.0", "torchtitan==0.3.0")
DEFAULT_ENV = Path("~/.cache/meshtrain/torchtitan-0.3.0-env").expanduser()


def site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def ensure_env(env: Path = DEFAULT_ENV) -> Path:
    """The environment's python, built and patched if it is missing or its patch is not this diff's."""
    marker = env / "meshtrain-patch.sha256"
    digest = hashlib.sha256(DIFF.read_bytes()).hexdigest()
    python = env / "bin" / "python"
    if python.exists() and marker.exists() and marker.read_text() == digest:
        return python
    if env.exists():
        shutil.rmtree(env)
    print(f"building torchtitan's environment in {env} ({', '.join(PACKAGES)}; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
    subprocess.run(["patch", "--quiet", "-p1", "-d", str(site_packages(env)), "-i", str(DIFF)], check=True)
    marker.write_text(digest)
    return python

"""A second venv for the tests of cells in other Python environments (``python=NAME``, tests/test_cell_envs.py):
made once a session by the ``alt_venv`` fixture (tests/conftest.py, so that a job started ahead can ask for it
from any test's session, tests/ahead.py)."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# One other release of a package every hf cell imports and records (cells.versions): the one before this
# venv's, or the one after when this venv has that one.
ALT_TRANSFORMERS = "5.18.0" if md.version("transformers") != "5.18.0" else "5.19.0"
OFFLINE_SIGNS = ("from versions: none", "NewConnectionError", "Max retries exceeded", "Temporary failure in name")


def venv_python(root: Path) -> Path:
    return root / "bin" / "python"


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def make_alt_venv(tmp_path_factory) -> Path:
    """(The interpreter of) a second venv: this venv's packages, but transformers ``ALT_TRANSFORMERS``.
    About 10 s, once a session; skipped when the package index is unreachable and pip has no copy."""
    root = tmp_path_factory.mktemp("alt-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = venv_python(root)
    own = _site_packages(python)
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    # A .pth line that starts with "import" is run: addsitedir appends this venv's site-packages after the
    # new venv's own (so its transformers wins) and runs that folder's .pth files (the editable evalparity).
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in sorted(ours))
    (own / "zz_base_venv.pth").write_text(lines)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
                          "--retries", "1", "--timeout", "20", "--target", str(own),
                          f"transformers=={ALT_TRANSFORMERS}"], capture_output=True, text=True)
    if pip.returncode != 0:
        said = pip.stdout + pip.stderr
        if any(sign in said for sign in OFFLINE_SIGNS):
            pytest.skip(f"the package index is unreachable: cannot install transformers=={ALT_TRANSFORMERS} "
                        "into the second venv")
        raise AssertionError(said[-2000:])
    return python



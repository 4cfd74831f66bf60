"""The wheel: its import names and files, and an install that lives beside other packages.

The wheel is built once per run from a copy of the sources (so that no ``build/``
folder of the checkout, stale or not, enters it). The install test puts it into a
fresh virtual environment next to two stub distributions named ``datasets`` and
``apps`` (the import names of Hugging Face's package and of many projects' own
folders) and checks that neither is touched, by the install or by the uninstall.

Nothing large is downloaded: the virtual environment is made without pip (the
outer pip installs into it with ``--python``), the stubs are written as wheels
here, and the only third-party package ``import tsm_core`` needs, numpy, is the
outer environment's, seen through a folder that holds nothing else.
"""

from __future__ import annotations

import ast
import base64
import csv
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST = "tsm-toolkit"
IMPORT_NAMES = {"tsm_core", "tsm_apps", "tsm_datasets"}
# checkout folder -> installed import name
FOLDERS = {"tsm_core": "tsm_core", "apps": "tsm_apps", "datasets": "tsm_datasets"}
SCRIPTS = {"tsm-bench", "tsm-kmeans", "tsm-inception", "tsm-abft-demo"}
KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".h")
# Output of a pip that could not get the build backend (no index reachable).
_OFFLINE = re.compile(r"No matching distribution found for setuptools|Could not find a version that "
                      r"satisfies the requirement setuptools|Failed to establish a new connection|"
                      r"Temporary failure in name resolution|Network is unreachable")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_USER")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(cmd, *, cwd, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _check(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _version() -> str:
    tree = ast.parse((ROOT / "tsm_core" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("tsm_core/__init__.py sets no __version__")


def _source_files(folder: str):
    """The files of a package folder of the checkout (no caches, no compiled objects)."""
    for p in sorted((ROOT / folder).rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so", ".o"):
            yield p


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Our wheel, built by pip from a copy of the sources."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for p in ROOT.iterdir():  # pyproject.toml, setup.py, README.md, LICENSE, ...
        if p.is_file() and not p.name.startswith("."):
            shutil.copy2(p, src / p.name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o"))
    out = tmp / "dist"
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, src], cwd=tmp)
    if proc.returncode != 0 and _OFFLINE.search(proc.stdout + proc.stderr):
        pytest.skip("cannot build the wheel: pip could not get the build backend (setuptools>=77) "
                    "from any index or local wheel")
    _check(proc)
    (whl,) = out.glob("tsm_toolkit-*.whl")
    return whl


def _dist_info(names) -> str:
    (d,) = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    return d


# ---------------------------------------------------------------- the wheel itself


def test_wheel_top_level_names(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = _dist_info(names)
        tops = {n.split("/", 1)[0] for n in names} - {info}
        assert tops == IMPORT_NAMES, f"top-level names of the wheel: {sorted(tops)}"
        assert not any(n.startswith(("apps/", "datasets/")) for n in names)
        top_level = set(z.read(f"{info}/top_level.txt").decode().split())
        assert top_level == IMPORT_NAMES
        # RECORD names every file of the wheel, and nothing else.
        rows = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode())))
        assert {r[0] for r in rows} == set(names)


def test_wheel_holds_every_package_and_kernel(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    missing = []
    for folder, name in FOLDERS.items():
        for p in _source_files(folder):
            rel = p.relative_to(ROOT / folder).as_posix()
            wanted = p.suffix == ".py" or p.suffix in KERNEL_SUFFIXES or p.name == "py.typed"
            if wanted and f"{name}/{rel}" not in names:
                missing.append(f"{folder}/{rel}")
    assert not missing, f"files of the checkout missing from the wheel: {missing}"
    kernels = [n for n in names if n.endswith(KERNEL_SUFFIXES)]
    assert "tsm_core/py.typed" in names
    assert "tsm_core/include/common.cuh" in names
    assert any(n.endswith(".cu") for n in kernels) and any(n.endswith(".cpp") for n in kernels)


def test_wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        info = _dist_info(z.namelist())
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
        entry_points = z.read(f"{info}/entry_points.txt").decode()
        names = set(z.namelist())
        license_text = z.read(f"{info}/licenses/LICENSE").decode()
    assert meta["Name"] == DIST
    assert meta["Version"] == _version()
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Apache License" in license_text and "Version 2.0" in license_text
    assert meta["Author"] or meta["Author-email"]
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist")
    for floor in ("numpy>=1.25", "scikit-learn>=1.6"):
        assert floor in requires
    for extra in ('torch>=2.1; extra == "torch"', 'cupy-cuda12x[ctk]>=14; extra == "cuda12"',
                  'matplotlib>=3.5; extra == "bench"'):
        assert extra in requires
    # The console scripts, each pointing at a function of a module in the wheel.
    section = entry_points.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(line.split(" = ") for line in section.strip().splitlines())
    assert set(scripts) == SCRIPTS
    for target in scripts.values():
        module, func = target.split(":")
        path = module.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, target
        folder = {v: k for k, v in FOLDERS.items()}[module.split(".")[0]]
        src = ROOT / folder / Path(*module.split(".")[1:])
        src = src / "__init__.py" if src.is_dir() else src.with_suffix(".py")
        defs = {n.name for n in ast.parse(src.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert func in defs, target


# ---------------------------------------------------------------- an install beside others


def _stub_wheel(folder: Path, name: str) -> Path:
    """A minimal wheel of the distribution ``name`` holding the package ``name``
    whose ``MARKER`` is ``"stub-<name>"``."""
    files = {
        f"{name}/__init__.py": f'MARKER = "stub-{name}"\n',
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tsm-tests\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n",
        f"{name}-1.0.dist-info/top_level.txt": f"{name}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-1.0.dist-info/RECORD,,")
    files[f"{name}-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    whl = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


def _pip_into(venv_python: Path, *args, cwd) -> str:
    return _check(_run([sys.executable, "-m", "pip", "--python", venv_python, *args], cwd=cwd))


PROBE = """
import importlib, importlib.metadata, json, sys
out = {}
for name in ("datasets", "apps"):
    m = importlib.import_module(name)
    out[name] = [m.MARKER, m.__file__]
try:
    import tsm_core, tsm_apps, tsm_datasets
    out["tsm"] = [tsm_core.__version__, tsm_core.__file__, tsm_apps.__file__, tsm_datasets.__file__,
                  importlib.metadata.version("tsm-toolkit")]
except ImportError as e:
    out["tsm"] = repr(e)
print(json.dumps(out))
"""


def _probe(venv_python: Path, cwd: Path) -> dict:
    # -I: no current folder on sys.path (the checkout's apps/ and datasets/ must not
    # be what is found), no PYTHON* variables, no user site.
    return json.loads(_check(_run([venv_python, "-I", "-c", PROBE], cwd=cwd)).strip().splitlines()[-1])


def test_install_beside_datasets_and_apps(wheel, tmp_path):
    import numpy

    pip_version = tuple(int(x) for x in re.findall(r"\d+", _check(
        _run([sys.executable, "-m", "pip", "--version"], cwd=tmp_path)).split()[1])[:2])
    if pip_version < (22, 3):
        pytest.skip(f"pip {pip_version} has no --python option (22.3 or newer needed)")

    venv = tmp_path / "venv"
    _check(_run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path))
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = Path(_check(_run([py, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               cwd=tmp_path)).strip())
    bindir = py.parent
    assert not (purelib / "numpy").exists()

    # numpy, and nothing else of the outer environment (whose editable install of
    # this checkout must stay out of sight).
    only_numpy = tmp_path / "only-numpy"
    only_numpy.mkdir()
    np_dir = Path(numpy.__file__).parent
    for p in (np_dir, np_dir.parent / "numpy.libs"):
        if p.exists():
            (only_numpy / p.name).symlink_to(p, target_is_directory=True)
    (purelib / "_only_numpy.pth").write_text(f"{only_numpy}\n")

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _pip_into(py, "install", "--no-deps", "--no-index", _stub_wheel(stubs, "datasets"), _stub_wheel(stubs, "apps"),
              cwd=tmp_path)
    stub_files = {n: (purelib / n / "__init__.py").read_bytes() for n in ("datasets", "apps")}
    expected = {n: [f"stub-{n}", str(purelib / n / "__init__.py")] for n in ("datasets", "apps")}

    before = _probe(py, tmp_path)
    assert {n: before[n] for n in ("datasets", "apps")} == expected
    assert isinstance(before["tsm"], str), "tsm_core importable before it was installed"

    _pip_into(py, "install", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    after = _probe(py, tmp_path)
    assert {n: after[n] for n in ("datasets", "apps")} == expected
    assert isinstance(after["tsm"], list), f"our packages do not import: {after['tsm']}"
    version, *files, dist_version = after["tsm"]
    assert version == dist_version == _version()
    for f in files:  # the installed copy, not the checkout
        assert Path(f).is_relative_to(purelib), f
    for n, data in stub_files.items():
        assert (purelib / n / "__init__.py").read_bytes() == data
    for script in SCRIPTS:
        assert (bindir / script).exists(), f"console script {script} not installed"
    help_text = _check(_run([bindir / "tsm-bench", "--help"], cwd=tmp_path))
    assert "usage" in help_text.lower()

    _pip_into(py, "uninstall", "-y", DIST, cwd=tmp_path)
    gone = _probe(py, tmp_path)
    assert {n: gone[n] for n in ("datasets", "apps")} == expected
    assert isinstance(gone["tsm"], str), "tsm packages still importable after the uninstall"
    for n, data in stub_files.items():
        assert (purelib / n / "__init__.py").read_bytes() == data
    left = sorted(p.name for p in purelib.iterdir() if p.name.lower().startswith(("tsm", "tsm_toolkit")))
    assert not left, f"left behind by the uninstall: {left}"
    assert not any((bindir / s).exists() for s in SCRIPTS)

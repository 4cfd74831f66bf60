"""Package discovery for setuptools; all other metadata is in pyproject.toml.

Every package under ``tsm_core/`` is found, and the folders ``apps/`` and
``datasets/`` (with their subpackages) are installed as ``tsm_apps`` and
``tsm_datasets`` (pyproject.toml's ``package-dir`` maps the names back to the
folders). A new subpackage is picked up without editing a list.
"""

from setuptools import find_packages, setup


def _renamed(folder: str, name: str) -> list[str]:
    return [name + p[len(folder):] for p in find_packages(include=[folder, folder + ".*"])]


setup(packages=find_packages(include=["tsm_core", "tsm_core.*"])
      + _renamed("apps", "tsm_apps") + _renamed("datasets", "tsm_datasets"))

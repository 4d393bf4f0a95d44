"""Package list only (everything else is in pyproject.toml): ``onnxslim_kit`` and its
subpackages, and every package under ``passes/``, installed as ``onnxslim_kit.passes.*``."""

from setuptools import find_packages, setup

PACKAGES = find_packages(include=["onnxslim_kit", "onnxslim_kit.*"]) + [
    "onnxslim_kit." + name for name in find_packages(include=["passes", "passes.*"])
]

setup(packages=PACKAGES)

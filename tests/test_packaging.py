"""Packaging and docs in step with the code: license, type marker, sdist contents, extras, CLI help, README."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import cupygemm
from cupygemm import env

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> str:
    return (REPO / "pyproject.toml").read_text()


def test_license_matches_pyproject():
    assert 'license = { text = "MIT" }' in _pyproject()
    assert (REPO / "LICENSE").read_text().startswith("MIT License")


def test_py_typed_is_package_data():
    assert (Path(cupygemm.__file__).parent / "py.typed").is_file()
    assert 'cupygemm = ["py.typed"]' in _pyproject()


def test_wheel_lists_every_python_package():
    """setuptools' package list is explicit: every package directory of cupygemm and sass_tools is in it."""
    listed = set(re.search(r"^packages = \[(.*)\]$", _pyproject(), re.M).group(1).replace('"', "").split(", "))
    for top in ("cupygemm", "sass_tools"):
        for init in (REPO / top).rglob("__init__.py"):
            package = ".".join(init.parent.relative_to(REPO).parts)
            assert package in listed, package


def test_sdist_manifest_carries_what_the_tests_read():
    manifest = (REPO / "MANIFEST.in").read_text()
    for line in ("recursive-include cuda_src *.cu *.cuh", "recursive-include tests *.py",
                 "recursive-include tests/data *.cubin *.py", "recursive-include examples *.py", "include LICENSE"):
        assert line in manifest
    assert list((REPO / "tests" / "data").glob("*.cubin"))


def test_extras_keep_the_nvrtc_flavours_apart():
    """cuda12 brings only NVRTC 12; test brings no NVRTC; test13 adds NVRTC 13 (for the SASS tests of both formats)."""
    extras = dict(re.findall(r'^(\w+) = (\[.*\])$', _pyproject(), re.MULTILINE))
    assert "nvidia-cuda-nvrtc-cu12" in extras["cuda12"] and '"nvidia-cuda-nvrtc"' not in extras["cuda12"]
    assert "nvrtc" not in extras["test"]
    assert '"nvidia-cuda-nvrtc"' in extras["test13"] and set(eval(extras["test"])) < set(eval(extras["test13"]))


def test_readme_install_and_test_commands_are_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    install = re.search(r'^pip install -e "(\.\[[^\]]+\])"', readme, re.MULTILINE)
    assert install and install.group(1) == ".[cuda12,test13]"
    assert "\npython -m pytest -q " in readme
    ci = REPO / ".ci" / "run"
    if ci.exists():  # the sdist has no .ci/
        text = ci.read_text()
        assert f'\npip install -e "{install.group(1)}"\n' in text and "python -m pytest -q\n" in text


def _help(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "cupygemm", *args, "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_cli_help_points_inside_the_repository_and_matches_the_readme():
    readme = (REPO / "README.md").read_text()
    top = _help()
    for cmd in ("info", "warmup", "cache", "bench"):
        assert cmd in top and f"cupygemm {cmd}" in readme
    for args in (("bench",), ("warmup",), ("cache",), ("cache", "export"), ("cache", "import")):
        text = _help(*args)
        assert "../" not in text and "shared/" not in text, args
    warm = _help("warmup")
    for opt in ("--preset", "--nk", "--m", "--groups", "--num-sms", "--jobs", "--dry-run", "--list"):
        assert opt in warm and opt in readme


def test_readme_lists_every_environment_variable():
    readme = (REPO / "README.md").read_text()
    names = [v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and v.startswith("CUPYGEMM_")]
    assert len(names) == 9
    for name in names:
        assert f"| `{name}` |" in readme


def test_readme_extras_paragraph_says_what_test_installs():
    """Every package the test extras add is named in the README's extras paragraph, with its Python marker."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("Extras: ")
    paragraph = " ".join(readme[start:readme.index("\n\n", start)].split())
    extras = dict(re.findall(r'^(\w+) = (\[.*\])$', _pyproject(), re.MULTILINE))
    for name in ("test", "test13"):
        for requirement in eval(extras[name]):
            package = re.match(r"[\w-]+", requirement).group(0)
            if package.startswith("nvidia-cuda-"):
                package = package[len("nvidia-cuda-"):]
            assert package.lower() in paragraph.lower(), (name, package)
            marker = re.search(r"python_version\s*>=\s*'([\d.]+)'", requirement)
            if marker:
                assert f"Python >= {marker.group(1)}" in paragraph, (name, requirement)

"""Packaging and docs in step with the code: license, type marker, sdist contents, extras, CLI help, README."""
from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

import cupygemm
from cupygemm import env
from cupygemm.jit.source import cuda_src_dir

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> str:
    return (REPO / "pyproject.toml").read_text()


def test_license_matches_pyproject():
    assert 'license = { text = "MIT" }' in _pyproject()
    assert (REPO / "LICENSE").read_text().startswith("MIT License")


def test_py_typed_is_package_data():
    assert (Path(cupygemm.__file__).parent / "py.typed").is_file()
    assert 'cupygemm = ["py.typed"]' in _pyproject()


def _packages() -> set[str]:
    return set(re.search(r"^packages = \[(.*)\]$", _pyproject(), re.M).group(1).replace('"', "").split(", "))


def test_wheel_lists_every_python_package():
    """setuptools' package list is explicit: every package directory of cupygemm and sass_tools is in it."""
    listed = _packages()
    for top in ("cupygemm", "sass_tools"):
        for init in (REPO / top).rglob("__init__.py"):
            package = ".".join(init.parent.relative_to(REPO).parts)
            assert package in listed, package


def test_wheel_ships_the_cuda_sources_inside_cupygemm():
    """The repository keeps cuda_src/ at its top; the wheel installs it as package data of cupygemm
    (cupygemm/cuda_src), never as a top-level package of that generic name."""
    text = _pyproject()
    listed = _packages()
    assert "cuda_src" not in listed and "cupygemm.cuda_src" in listed
    assert {p.split(".")[0] for p in listed} == {"cupygemm", "sass_tools"}
    assert 'package-dir = { "cupygemm.cuda_src" = "cuda_src" }' in text
    assert '"cupygemm.cuda_src" = ["*.cu", "*.cuh"]' in text
    assert (REPO / "cuda_src" / "fp8_gemm.cu").is_file() and not (REPO / "cupygemm" / "cuda_src").exists()


def test_installed_distribution_has_no_top_level_cuda_src():
    """What pip installed (CI: an editable install, then the sdist's wheel, tested from the unpacked sdist): top-level
    packages cupygemm and sass_tools only; a wheel's CUDA sources under cupygemm/cuda_src, where cuda_src_dir()
    finds them. (Only pip's records count: a source tree's cupygemm.egg-info lists the sdist's files.)"""
    installed = [d for d in importlib.metadata.distributions(name="cupygemm") if d.read_text("RECORD")]
    if not installed:
        pytest.skip("cupygemm has no pip-installed distribution here (imported from a source tree)")
    dist = installed[0]
    names = [line.split(",")[0] for line in dist.read_text("RECORD").splitlines()]
    package_dir = Path(cupygemm.__file__).resolve().parent
    if "cupygemm/__init__.py" in names:  # a wheel's files
        if Path(dist.locate_file("cupygemm/__init__.py")).resolve().parent != package_dir:
            pytest.skip("the installed cupygemm is not the one imported")
        assert not [n for n in names if n.startswith("cuda_src/")]
        assert "cupygemm/cuda_src/fp8_gemm.cu" in names and "cupygemm/cuda_src/scheduler.cuh" in names
        assert cuda_src_dir() == package_dir / "cuda_src"
    else:  # an editable install: the checkout's cuda_src/
        url = urllib.parse.urlparse(json.loads(dist.read_text("direct_url.json") or "{}").get("url", ""))
        if url.scheme != "file" or Path(urllib.parse.unquote(url.path)).resolve() != REPO.resolve():
            pytest.skip("the installed cupygemm is an editable install of another tree")
        assert cuda_src_dir() == REPO / "cuda_src"
    assert sorted((dist.read_text("top_level.txt") or "cupygemm sass_tools").split()) == ["cupygemm", "sass_tools"]


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
    assert len(names) == 10
    for name in names:
        assert f"| `{name}` |" in readme


def test_docs_name_only_result_files_that_exist():
    """Every result file the READMEs and the notes link is in benchmarks/results/, and benchmarks/README.md's table of
    result files lists exactly the files there. (The sdist carries neither the results nor those docs.)"""
    results = REPO / "benchmarks" / "results"
    if not results.is_dir():
        return
    present = {p.name for p in results.iterdir()}
    for doc in ("README.md", "benchmarks/README.md", "benchmarks/NOTES.md", "cuda_src/README.md"):
        text = (REPO / doc).read_text()
        linked = set(re.findall(r"(?:benchmarks/results/|\]\(results/)([\w.-]+\.(?:json|png))", text))
        assert linked <= present, (doc, sorted(linked - present))
    table = (REPO / "benchmarks" / "README.md").read_text().split("\n## Results\n")[1]
    listed = {name for row in table.splitlines() if row.startswith("| `")
              for name in re.findall(r"`([^`]+)`", row.split("|")[1])}
    assert listed == present, (sorted(listed - present), sorted(present - listed))


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

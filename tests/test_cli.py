"""What a new user meets first: the ``cupygemm`` commands and the examples on a machine they do not fit (no GPU, bad
environment values, bad options), each answered in one clear line instead of a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# CUDA_VISIBLE_DEVICES="" hides every GPU from CUDA, so these run as on a machine without one, GPU or not.
NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="")


def _run(args: list[str], env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env or NO_GPU, capture_output=True, text=True,
                          timeout=timeout)


def _one_line_about_hopper(res: subprocess.CompletedProcess, program: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"{program}: no CUDA GPU visible") and "Hopper" in lines[0], lines[0]


@pytest.mark.parametrize("cmd", ["overhead", "chain", "jax-scan", "bench", "train-step", "multigpu"])
def test_gpu_commands_without_a_gpu_say_so_in_one_line(cmd):
    _one_line_about_hopper(_run(["-m", "cupygemm", cmd]), f"cupygemm {cmd}")


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "examples").glob("*.py")))
def test_examples_without_a_gpu_say_so_in_one_line(name):
    """The check is each example's first statement, so it runs before torch or JAX is imported (or found missing)."""
    _one_line_about_hopper(_run([str(REPO / "examples" / name)], timeout=300), name)


@pytest.mark.parametrize("gpus,torch_missing,why", [
    (2, True, "needs PyTorch with CUDA"), (2, False, "needs 2 GPUs, 1 visible"), (1, False, "needs 2 GPUs, 1 visible")])
def test_multigpu_without_torch_or_a_second_gpu_says_so_in_one_line(gpus, torch_missing, why, monkeypatch, capsys):
    """Past the Hopper check (faked here): no torch, or fewer than two GPUs, is one line and status 2."""
    import types

    from cupygemm.bench import multigpu
    from cupygemm.cli import build_parser

    monkeypatch.setattr(multigpu, "require_hopper_or_exit", lambda program: types.SimpleNamespace(name="H100"))
    if torch_missing:
        monkeypatch.setitem(sys.modules, "torch", None)
    else:
        dist = types.SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: True)
        fake = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: 1), distributed=dist)
        monkeypatch.setitem(sys.modules, "torch", fake)
        monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    args = build_parser().parse_args(["multigpu", "--gpus", str(gpus)])
    assert args.func(args) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith(f"cupygemm multigpu: {why}"), err


BAD_VALUES = {"CUPYGEMM_PDL": "maybe", "CUPYGEMM_DISABLE_CACHE": "sometimes", "CUPYGEMM_PRINT_CONFIGS": "2",
              "CUPYGEMM_CHECK_INPUTS": "y", "CUPYGEMM_FFMA_INTERLEAVE": "always", "CUPYGEMM_B_EVICT_FIRST": "first",
              "CUPYGEMM_L2_SIDES": "both", "CUPYGEMM_B_PREFETCH_KIB": "-1"}


@pytest.mark.parametrize("var", sorted(BAD_VALUES))
def test_a_bad_environment_value_is_one_line_before_any_output(var, monkeypatch, capsys):
    from cupygemm import env
    from cupygemm.cli import main

    value = BAD_VALUES[var]
    monkeypatch.setenv(var, value)
    assert main(["info"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"cupygemm: {var}: expected ") and repr(value) in err
    allowed = "/".join(env.TRUE_WORDS) if var in (env.PDL, env.DISABLE_CACHE, env.PRINT_CONFIGS, env.CHECK_INPUTS) \
        else "an integer from 0" if var == env.B_PREFETCH else "auto"
    assert allowed in err


def test_every_variable_is_checked_before_a_command_runs():
    """The CLI checks the variables through env.SETTINGS: each variable the package reads has its parser there."""
    from cupygemm import env

    names = {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and v.startswith("CUPYGEMM_")}
    assert set(env.SETTINGS) == names and set(BAD_VALUES) <= names


@pytest.mark.parametrize("args,option", [
    (["warmup", "--nk", "4096x7168", "--num-sms", "132", "--jobs", "0"], "--jobs"),
    (["warmup", "--nk", "4096x7168", "--num-sms", "-3"], "--num-sms"),
    (["warmup", "--nk", "4096x7168", "--num-sms", "1000000000000000000000000000000"], "--num-sms"),
    (["warmup", "--nk", "4096x7168", "--num-sms", "132", "--groups", "0", "--kind", "masked", "--m", "1"],
     "--groups"),
    (["cache", "export", "x.tar.gz", "--num-sms", "0"], "--num-sms"),
    (["cache", "import", "x.tar.gz", "--num-sms", "-1"], "--num-sms"),
])
def test_bad_counts_are_refused_while_parsing(args, option, capsys):
    from cupygemm.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {option}: " in err, err
    assert "choose_config" not in err


@pytest.mark.parametrize("args", [["warmup", "--nk", "4096x7168", "--dry-run"], ["cache", "export", "k.tar.gz"]])
def test_a_missing_num_sms_without_a_gpu_is_a_usage_error(args, tmp_path):
    """One convention for the option that only a GPU can stand in for: argparse's, rc 2."""
    res = _run(["-m", "cupygemm", *args], env=dict(NO_GPU, CUPYGEMM_CACHE_DIR=str(tmp_path)))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith("usage: ") and f"cupygemm {' '.join(args[:2] if args[0] == 'cache' else args[:1])}: " \
        "error: --num-sms is required without a GPU" in res.stderr, res.stderr
    assert not (tmp_path / "k.tar.gz").exists()


def _subparsers(parser, prefix=()):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _subparsers(sub, prefix + (name,))


def test_help_texts_are_plain_text():
    """Help comes from docstrings: shown without their reStructuredText markup."""
    import re

    from cupygemm.cli import build_parser

    subs = dict(_subparsers(build_parser()))
    assert {("overhead",), ("chain",), ("jax-scan",), ("cache", "import")} <= set(subs)
    for name, sub in subs.items():
        text = sub.format_help()
        assert "``" not in text and not re.search(r":(func|mod|class|data):`", text), (name, text)


def test_cache_import_help_says_what_num_sms_does_for_import():
    from cupygemm.cli import build_parser

    subs = dict(_subparsers(build_parser()))
    imp, exp = subs[("cache", "import")].format_help(), subs[("cache", "export")].format_help()
    assert "export" not in imp.split("--num-sms", 1)[1] and "check" in imp.split("--num-sms", 1)[1]
    assert "required without a GPU" in " ".join(exp.split("--num-sms", 1)[1].split())


@pytest.mark.parametrize("module,framework,hint", [("cupygemm.jax", "jax", 'pip install "jax[cuda12]"'),
                                                   ("cupygemm.torch", "torch", "pip install torch")])
def test_framework_modules_say_how_to_install_the_framework(module, framework, hint):
    """Run where the framework is missing (sys.modules[name] = None makes its import fail, installed or not)."""
    code = (f"import sys; sys.modules[{framework!r}] = None\n"
            f"try:\n    import {module}\n"
            "except ImportError as e:\n"
            "    print(type(e).__name__, '|', e, '|', type(e.__cause__).__name__, '|', e.__cause__)\n")
    res = _run(["-c", code], env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    kind, message, cause, cause_message = res.stdout.strip().split(" | ")
    assert kind == cause == "ModuleNotFoundError" and hint in message and module in message, res.stdout
    assert framework in cause_message

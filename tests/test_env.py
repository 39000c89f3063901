"""CUPYGEMM_* variables: one parser (cupygemm.env), the same spellings everywhere, clear errors."""
from __future__ import annotations

import pytest

from cupygemm import env
from cupygemm.jit import build, cache

TRUE = ["1", "true", "TRUE", "Yes", " on ", "ON\n"]
FALSE = ["0", "false", "No", " off", "OFF"]


@pytest.mark.parametrize("var,fn", [
    (env.DISABLE_CACHE, env.cache_disabled), (env.PRINT_CONFIGS, env.print_configs),
    (env.CHECK_INPUTS, env.check_inputs_enabled),
])
def test_boolean_variables_parse_alike(monkeypatch, var, fn):
    monkeypatch.delenv(var, raising=False)
    assert fn() is False
    for v in TRUE:
        monkeypatch.setenv(var, v)
        assert fn() is True, v
    for v in FALSE + ["", "   "]:  # empty = the default
        monkeypatch.setenv(var, v)
        assert fn() is False, v
    monkeypatch.setenv(var, "enabled")
    with pytest.raises(ValueError, match=f"{var}: expected one of 1/true/yes/on/0/false/no/off.*'enabled'"):
        fn()


def test_print_configs_no_means_no(monkeypatch, capsys):
    """CUPYGEMM_PRINT_CONFIGS=no used to turn printing on."""
    from cupygemm import config as C

    monkeypatch.setenv(env.PRINT_CONFIGS, "no")
    C.clear_memo()
    C.choose_config(C.KIND_NORMAL, 1000, 4096, 7168, 1, 132)
    assert "[cupygemm]" not in capsys.readouterr().err


def test_disable_cache_spellings_reach_the_cache(monkeypatch):
    monkeypatch.setenv(env.DISABLE_CACHE, "on")
    assert not cache.cache_enabled()
    monkeypatch.setenv(env.DISABLE_CACHE, "off")
    assert cache.cache_enabled()


def test_choice_variables(monkeypatch):
    monkeypatch.delenv(env.FFMA_INTERLEAVE, raising=False)
    assert build.ffma_interleave_mode() == "auto"
    for v, want in (("AUTO", "auto"), ("on", "on"), ("yes", "on"), ("1", "on"), ("false", "off"), (" ", "auto")):
        monkeypatch.setenv(env.FFMA_INTERLEAVE, v)
        assert build.ffma_interleave_mode() == want, v
    monkeypatch.setenv(env.FFMA_INTERLEAVE, "sometimes")
    with pytest.raises(ValueError, match="CUPYGEMM_FFMA_INTERLEAVE: expected one of auto, on, off"):
        build.ffma_interleave_mode()
    for v, want in (("auto", "auto"), ("true", "1"), ("Off", "0"), ("0", "0"), ("", "auto")):
        monkeypatch.setenv(env.B_EVICT_FIRST, v)
        assert env.b_evict_first_mode() == want, v
    monkeypatch.setenv(env.B_EVICT_FIRST, "2")
    with pytest.raises(ValueError, match="CUPYGEMM_B_EVICT_FIRST: expected one of auto, 1, 0"):
        env.b_evict_first_mode()


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(env.CACHE_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "cupygemm"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # invalid per the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "cupygemm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "cupygemm"
    monkeypatch.setenv(env.CACHE_DIR, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "mine"  # CUPYGEMM_CACHE_DIR wins


def test_every_variable_the_package_reads_goes_through_env():
    """No module but cupygemm.env reads a CUPYGEMM_* variable itself (the call path's signature reads
    B_EVICT_FIRST's raw value as a cache key, through env.B_EVICT_FIRST)."""
    import pathlib
    import re

    pkg = pathlib.Path(env.__file__).parent
    offenders = []
    for path in pkg.rglob("*.py"):
        if path.name == "env.py":
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?[\[(]\s*[\"']CUPYGEMM_", text) or re.search(r"getenv\(\s*[\"']CUPYGEMM_", text):
            offenders.append(str(path))
    assert not offenders

"""Shared test setup: a private kernel cache per session, and the `gpu` marker's skip rule."""
from __future__ import annotations

import functools
import os

import pytest


def pytest_configure(config):
    # Keep the user's cache untouched unless they pointed the tests at one explicitly.
    if "CUPYGEMM_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["CUPYGEMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="cupygemm-test-cache-")
    # JAX shares the GPU with CuPy and torch (and, under pytest -n, with the other workers): keep whichever test
    # starts its GPU backend first from taking 75 % of the memory up front. Read once, when the backend starts.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


@functools.lru_cache(maxsize=1)
def hopper_available() -> tuple[bool, str]:
    try:
        import cupy
    except ImportError:
        return False, "CuPy not installed"
    try:
        if not cupy.cuda.is_available():
            return False, "no CUDA GPU"
        cc = cupy.cuda.Device(0).compute_capability
    except Exception as e:  # driver missing, etc.
        return False, f"no usable CUDA GPU ({e})"
    if cc != "90":
        return False, f"GPU has compute capability {cc}, not 9.0"
    return True, ""


@functools.lru_cache(maxsize=1)
def hopper_pair_available() -> tuple[bool, str]:
    ok, why = hopper_available()
    if not ok:
        return False, why
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if count < 2:
        return False, f"{count} GPU, needs two"
    ccs = [cupy.cuda.Device(i).compute_capability for i in range(2)]
    if ccs != ["90", "90"]:
        return False, f"GPUs 0 and 1 have compute capabilities {ccs}, not both 9.0"
    return True, ""


def pytest_collection_modifyitems(config, items):
    ok, why = hopper_available()
    if not ok:
        skip = pytest.mark.skip(reason=f"gpu test: {why}")
        for item in items:
            if "gpu" in item.keywords or item.get_closest_marker("multigpu"):
                item.add_marker(skip)
        return
    ok, why = hopper_pair_available()
    if not ok:
        skip = pytest.mark.skip(reason=f"multigpu test: {why}")
        for item in items:
            if item.get_closest_marker("multigpu"):  # the marker, not a test id that happens to say multigpu
                item.add_marker(skip)



@pytest.fixture(autouse=True)
def _device_zero_current(request):
    """Every GPU test starts with device 0 current, as in a fresh process, whatever ran before it in this worker:
    JAX's GPU client, when it starts, leaves its last GPU current on the thread that started it, and a test that
    makes its arrays on the current device would then run on another GPU than the next test's threads (new threads
    start on device 0). Our own calls leaving another device current are tests of their own
    (test_multigpu_gpu.py)."""
    if "gpu" in request.keywords or request.node.get_closest_marker("multigpu") is not None:
        import cupy

        if cupy.cuda.runtime.getDevice() != 0:
            cupy.cuda.runtime.setDevice(0)
    yield

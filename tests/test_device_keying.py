"""Per-device state on CPU, with two fake GPUs of different SM counts (132 and 114, as an H100 SXM beside an H100
PCIe) and device 0 current: set_num_sms is per device, plans are made for the SM count of their own device (not
the current one's), call signatures change with any device's limit, and kernels load once per device."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import cupygemm
from cupygemm import device, gemm, packing, plan, plan_wgrad
from cupygemm.device import DeviceInfo
from cupygemm.errors import CupygemmDeviceError
from cupygemm.jit import loader
from cupygemm.kinds import kind_named

SMS = {0: 132, 1: 114}


@pytest.fixture
def two_gpus(monkeypatch):
    """Two fake devices, device 0 current (``state.current`` switches it); no overrides before or after."""
    state = SimpleNamespace(current=0)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "_current_index", lambda: state.current)
    monkeypatch.setattr(device, "_device_count", lambda: len(SMS))
    monkeypatch.setattr(device, "_query", lambda i: DeviceInfo(i, f"GPU {i}", "90", SMS[i], 232448, 50 << 20))
    monkeypatch.setattr(device, "_num_sms_overrides", {})
    monkeypatch.setattr(device, "_num_sms_key", ())
    return state


def test_set_num_sms_is_per_device(two_gpus):
    cupygemm.set_num_sms(100, device=1)
    assert cupygemm.get_num_sms(1) == 100
    assert cupygemm.get_num_sms(0) == cupygemm.get_num_sms() == 132  # device 0 is current, and untouched
    assert device.num_sms_override() is None and device.num_sms_override(1) == 100
    cupygemm.set_num_sms(64)  # DeepGEMM's form: the current device
    assert (cupygemm.get_num_sms(0), cupygemm.get_num_sms(1)) == (64, 100)
    two_gpus.current = 1
    assert cupygemm.get_num_sms() == 100
    cupygemm.reset_num_sms()  # the current device (1) only
    assert (cupygemm.get_num_sms(0), cupygemm.get_num_sms(1)) == (64, 114)


def test_set_num_sms_checks_against_its_own_device(two_gpus):
    cupygemm.set_num_sms(132, device=0)
    with pytest.raises(ValueError, match="num_sms: device 1 has 114 SMs, got 120"):
        cupygemm.set_num_sms(120, device=1)
    assert device.num_sms_override(1) is None


@pytest.mark.parametrize("value,error,match", [
    (2, ValueError, r"device: expected a device index in 0\.\.1, got 2"), (-1, ValueError, "device"),
    (True, TypeError, "device: .* got bool"), ("cuda:1", TypeError, "device: .* got str"),
    (SimpleNamespace(type="cpu", index=None), ValueError, "device: expected a CUDA device")])
def test_bad_device_is_refused_before_anything_changes(two_gpus, value, error, match):
    with pytest.raises(error, match=match):
        cupygemm.set_num_sms(100, device=value)
    assert device.num_sms_key() == ()


def test_devices_as_torch_and_cupy_name_them(two_gpus):
    torch_cuda1 = SimpleNamespace(type="cuda", index=1)  # what torch.device("cuda", 1) has
    cupy_dev1 = SimpleNamespace(id=1)  # what cupy.cuda.Device(1) has
    cupygemm.set_num_sms(90, device=torch_cuda1)
    assert cupygemm.get_num_sms(cupy_dev1) == 90
    assert device.device_index(SimpleNamespace(type="cuda", index=None)) == 0  # torch.device("cuda"): current


def test_plans_use_their_own_devices_sm_count(two_gpus, monkeypatch):
    """plan_gemm on device 1 while device 0 is current: the config is chosen for device 1's SMs."""
    seen = []
    monkeypatch.setattr(plan, "_plan", lambda *args: seen.append(args[10]))
    monkeypatch.setattr(plan_wgrad, "_plan", lambda *args: seen.append(args[-1]))
    normal, wgrad = kind_named("normal"), kind_named("wgrad")
    plan.plan_gemm(normal, 256, 512, 1024, 1, 1)
    plan.plan_gemm(wgrad, 256, 512, 1024, 1, 1)
    cupygemm.set_num_sms(100, device=1)
    plan.plan_gemm(normal, 256, 512, 1024, 1, 1)
    plan.plan_gemm(wgrad, 256, 512, 1024, 1, 1)
    plan.plan_gemm(normal, 256, 512, 1024, 1, 0)
    assert seen == [114, 114, 100, 100, 132]


def test_call_signature_changes_with_any_devices_limit(two_gpus):
    arr = SimpleNamespace(shape=(4, 128), strides=(128, 1), dtype="u1")

    def signature():
        return gemm._cupy_signature("normal", arr, arr, arr, arr, None, None, None, 0, (1, 1, 1, 1, None, None))

    before = signature()
    cupygemm.set_num_sms(100, device=1)
    assert signature() != before
    cupygemm.reset_num_sms(1)
    assert signature() == before


def test_packing_probes_with_the_packed_devices_sms(two_gpus):
    assert packing._num_sms(1) == 114


def test_get_num_sms_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(device, "gpu_available", lambda: False)
    monkeypatch.setattr(device, "current_device", lambda: (_ for _ in ()).throw(CupygemmDeviceError("no GPU")))
    monkeypatch.setattr(device, "_num_sms_overrides", {})
    with pytest.raises(CupygemmDeviceError, match="no GPU"):
        cupygemm.get_num_sms()


def test_small_kernels_and_gemm_kernels_load_once_per_device(monkeypatch):
    from cupygemm import kernels
    from cupygemm.config import choose_config

    loads = []

    def fake_load(dev, src, kinds, **kw):
        loads.append(dev)
        return SimpleNamespace(device=dev, max_clusters=1)

    monkeypatch.setattr(loader, "load", fake_load)
    monkeypatch.setattr(kernels, "load", fake_load)
    monkeypatch.setattr(kernels, "gemm_source", lambda cfg, pdl, b_prefetch: None)
    monkeypatch.setattr(kernels, "_by_config", {})
    small = loader.SmallKernel(lambda: None, ())
    try:
        assert [small.get(d).device for d in (0, 1, 0, 1)] == [0, 1, 0, 1]
        cfg = choose_config(kind_named("normal").kid, 256, 512, 1024, 1, 132)
        monkeypatch.setattr(kernels.contract, "cluster_size", lambda c: 1)
        assert [kernels.get_gemm_kernel(cfg, d).device for d in (1, 0, 1)] == [1, 0, 1]
    finally:
        loader._declared.remove(small)
    assert loads == [0, 1, 1, 0]

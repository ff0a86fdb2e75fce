"""The device layer on a CPU machine: the answers other layers rely on."""

from __future__ import annotations

import time

import pytest
import torch

from gdn import device as devices


def test_backends_and_visible_device_variables():
    assert devices.distributed_backend("cuda") == "nccl"
    assert devices.distributed_backend("npu") == "hccl"
    assert devices.distributed_backend("cpu") == "gloo"
    assert devices.visible_devices_env("cuda") == "CUDA_VISIBLE_DEVICES"
    assert devices.visible_devices_env("npu") == "ASCEND_RT_VISIBLE_DEVICES"
    assert devices.visible_devices_env("cpu") is None


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown device kind 'tpu'; expected one of cuda, npu, cpu"):
        devices.get_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")
def test_cpu_machine_answers():
    assert devices.default_kind() == "cpu"
    assert devices.is_available("cpu") and not devices.is_available("cuda")
    assert devices.device_count("cuda") == 0
    with pytest.raises(RuntimeError, match="no cuda device is available"):
        devices.get_device("cuda")
    stats = devices.memory_stats("cpu")
    assert stats.tracked is False and stats.peak_allocated == 0
    info = devices.device_info("cpu")
    assert info["device_kind"] == "cpu" and info["torch"] == torch.__version__


def test_cpu_timer_measures_host_time():
    timer = devices.DeviceTimer("cpu")
    with pytest.raises(RuntimeError, match="before start"):
        timer.elapsed_ms()
    timer.start()
    time.sleep(0.02)
    timer.stop()
    assert 15.0 <= timer.elapsed_ms() < 1000.0


@pytest.mark.gpu
def test_cuda_memory_and_timer():
    dev = devices.get_device("cuda")
    devices.reset_peak_memory(dev)
    x = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    stats = devices.memory_stats(dev)
    assert stats.tracked and stats.peak_allocated >= 64 << 20
    timer = devices.DeviceTimer(dev)
    timer.start()
    y = x.float().sum()
    timer.stop()
    assert timer.elapsed_ms() > 0 and y.item() >= 0

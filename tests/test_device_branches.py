"""Every device, dtype and backend choice, each branch forced on the CPU.

The GPU branches are selected by monkeypatching what they ask (``torch.cuda.is_available``,
``is_bf16_supported``, the free GPU memory, the CPU's bf16 flags); their parts that can run on
a CPU do run: channels_last inputs and model, autocast in the chosen dtype (on the CPU device
type, as the stand-in for CUDA's), a training step with it, the host-memory image path.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from dmlbench.devices import default_device
from dmlbench.evaluate import screen
from dmlbench.evaluate.screen import fast_bf16_matmul
from dmlbench.train import step
from dmlbench.train.divergence import GPU_FINITE_CHECK_EVERY, finite_check_interval
from dmlbench.train.rng import restore_rng_state, rng_state, seed_everything
from dmlbench.train.step import (
    GPU_CACHE_FRACTION,
    FastPath,
    ImageSource,
    TrainStep,
    cache_fits,
    cache_on_device,
    host_rows,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
BF16_FLAGS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


@pytest.fixture
def cudnn_benchmark():
    """``torch.backends.cudnn.benchmark`` set to False for the test, restored afterwards."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    yield
    torch.backends.cudnn.benchmark = saved


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} must not be called on this branch")

    return refuse


def _conv_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, stride=2),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )


def _images(n: int = 7) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, size=(n, 5, 6, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- FastPath.for_device


@pytest.mark.parametrize("enabled", [None, True, False])
def test_fast_path_on_cpu_is_channels_last_only(cudnn_benchmark, monkeypatch, enabled):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", _refuse("is_bf16_supported"))
    fast = FastPath.for_device(CPU, enabled)
    channels_last = enabled is not False
    assert (fast.device, fast.amp_dtype, fast.channels_last) == (CPU, None, channels_last)
    assert torch.backends.cudnn.benchmark is False
    x = torch.randn(2, 3, 4, 4)
    assert fast.prepare_inputs(x).is_contiguous(memory_format=torch.channels_last) is channels_last
    model = _conv_model()
    weight = next(p for p in fast.prepare_model(model).parameters() if p.dim() == 4)
    assert weight.is_contiguous(memory_format=torch.channels_last) is channels_last
    with fast.autocast():  # a null context: fp32 stays fp32 even inside a bf16-capable op
        assert torch.mm(torch.randn(3, 3), torch.randn(3, 3)).dtype == torch.float32


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")  # a CUDA autocast built on a CPU
@pytest.mark.parametrize("bf16, dtype", [(True, torch.bfloat16), (False, torch.float16)])
@pytest.mark.parametrize("enabled", [None, True])
def test_fast_path_on_cuda_picks_bf16_or_float16(cudnn_benchmark, monkeypatch, bf16, dtype, enabled):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    fast = FastPath.for_device(CUDA, enabled)
    assert (fast.device, fast.amp_dtype, fast.channels_last) == (CUDA, dtype, True)
    assert torch.backends.cudnn.benchmark is True
    context = fast.autocast()
    assert isinstance(context, torch.autocast)
    assert (context.device, context.fast_dtype) == ("cuda", dtype)


def test_fast_path_disabled_on_cuda_is_off(cudnn_benchmark, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", _refuse("is_bf16_supported"))
    fast = FastPath.for_device(CUDA, enabled=False)
    assert (fast.device, fast.amp_dtype, fast.channels_last) == (CUDA, None, False)
    assert torch.backends.cudnn.benchmark is False
    x = torch.randn(2, 3, 4, 4)
    assert fast.prepare_inputs(x) is x


@pytest.mark.parametrize("bf16, dtype", [(True, torch.bfloat16), (False, torch.float16)])
def test_forced_cuda_fast_path_runs_its_cpu_parts(cudnn_benchmark, monkeypatch, bf16, dtype):
    """The CUDA settings, with the CPU as device: channels_last and autocast in the chosen dtype."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    fast = dataclasses.replace(FastPath.for_device(CUDA), device=CPU)
    assert (fast.amp_dtype, fast.channels_last) == (dtype, True)

    x = torch.randn(4, 3, 9, 9)
    prepared = fast.prepare_inputs(x)
    assert not x.is_contiguous(memory_format=torch.channels_last)
    assert prepared.is_contiguous(memory_format=torch.channels_last)
    assert prepared.stride() != x.stride() and torch.equal(prepared, x)

    reference = _conv_model()
    expected = reference(x)
    model = fast.prepare_model(_conv_model())
    weight = model[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(weight, reference[0].weight)
    assert torch.allclose(model(prepared), expected, atol=1e-6)  # same function in fp32

    with fast.autocast():
        out = model(prepared)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    # bf16/fp16 products of a small net: a few low-precision roundings off the fp32 result
    assert torch.allclose(out.float(), expected, atol=0.05, rtol=0.05)
    assert not torch.equal(out.float(), expected)  # it really ran in the low precision


def test_train_step_with_the_cuda_settings_on_cpu(cudnn_benchmark, monkeypatch):
    """Forward under bf16 autocast, the loss in float32, one optimiser step."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    fast = dataclasses.replace(FastPath.for_device(CUDA), device=CPU)
    seen: list[torch.dtype] = []

    class SpreadLoss(torch.nn.Module):
        """Pulls same-label embeddings together; records the dtype it is handed."""

        def forward(self, embeddings, labels, mined):
            seen.append(embeddings.dtype)
            same = (labels[:, None] == labels[None, :]).float()
            return (torch.cdist(embeddings, embeddings) * same).mean()

    model = fast.prepare_model(_conv_model())
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_step = TrainStep(model, SpreadLoss(), None, [optimizer], fast, grad_clip=1.0)
    loss = train_step(torch.randn(6, 3, 9, 9), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert seen == [torch.float32]
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss)) and float(loss) > 0
    assert not loss.requires_grad
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# --------------------------------------------------------------------------- ImageSource placement


def test_cache_fits_at_most_the_free_memory_fraction():
    assert GPU_CACHE_FRACTION == 0.5
    assert cache_fits(500, 1000)
    assert not cache_fits(501, 1000)
    assert cache_fits(0, 0)
    assert not cache_fits(1, 0)
    assert cache_fits(40 * 2**30, 80 * 2**30) and not cache_fits(40 * 2**30 + 1, 80 * 2**30)


def test_cache_on_device_cpu_always_without_asking_cuda(monkeypatch):
    monkeypatch.setattr(step, "free_memory", _refuse("free_memory"))
    assert cache_on_device(CPU, 10**15)


@pytest.mark.parametrize("free, on_device", [(2000, True), (1999, False)])
def test_cache_on_device_cuda_follows_the_free_memory(monkeypatch, free, on_device):
    asked: list[torch.device] = []

    def free_memory(device):
        asked.append(device)
        return free

    monkeypatch.setattr(step, "free_memory", free_memory)
    assert cache_on_device(CUDA, 1000) is on_device
    assert asked == [CUDA]


def test_cache_on_device_other_devices_use_the_host(monkeypatch):
    monkeypatch.setattr(step, "free_memory", _refuse("free_memory"))
    assert not cache_on_device(torch.device("mps"), 1)


def test_image_source_on_cpu_keeps_the_cache_in_memory(monkeypatch):
    monkeypatch.setattr(step, "pinned_copy", _refuse("pinned_copy"))
    images = _images()
    source = ImageSource(images, CPU, sizes=np.arange(14).reshape(7, 2))
    assert source.placement == "cpu memory"
    index = np.array([4, 0, 4, 6, 1, 0])
    batch = source.batch(index)
    assert batch.dtype == torch.uint8 and batch.device == CPU
    np.testing.assert_array_equal(batch.numpy(), images[index])
    np.testing.assert_array_equal(source.sizes_of(index), np.arange(14).reshape(7, 2)[index])


def test_image_source_too_big_for_the_gpu_uses_pinned_host_copies(monkeypatch):
    """The CUDA host path without CUDA: the copy through pinned memory is the only GPU part."""
    images = _images()
    monkeypatch.setattr(step, "free_memory", lambda device: 2 * images.nbytes - 1)
    copies: list[torch.device] = []

    def pinned_copy(rows, device):
        copies.append(device)
        return rows

    monkeypatch.setattr(step, "pinned_copy", pinned_copy)
    source = ImageSource(images, CUDA)
    assert source.on_device is None
    assert source.placement == "host, pinned copies per batch"
    index = np.array([5, 2, 2, 0, 6, 5, 1])
    np.testing.assert_array_equal(source.batch(index).numpy(), images[index])
    assert copies == [CUDA]
    assert source.sizes_of(index) is None


def test_host_rows_keep_the_order_and_duplicates_from_a_memory_map(tmp_path):
    images = _images(9)
    mapped = np.lib.format.open_memmap(tmp_path / "images.npy", mode="w+", dtype=np.uint8, shape=images.shape)
    mapped[:] = images
    mapped.flush()
    mapped = np.load(tmp_path / "images.npy", mmap_mode="r")
    for index in ([8, 3, 3, 0, 5, 8, 1], [0, 1, 2], [7, 7, 7], [2]):
        rows = host_rows(mapped, np.array(index))
        assert rows.dtype == torch.uint8 and rows.shape == (len(index), 5, 6, 3)
        np.testing.assert_array_equal(rows.numpy(), images[index])


@pytest.mark.gpu
def test_image_source_both_placements_on_a_real_gpu(monkeypatch):
    images = _images()
    index = np.array([5, 2, 2, 0, 6])
    on_gpu = ImageSource(images, CUDA)
    assert on_gpu.placement == "cuda memory" and on_gpu.on_device.is_cuda
    monkeypatch.setattr(step, "free_memory", lambda device: 0)
    host = ImageSource(images, CUDA)
    assert host.placement == "host, pinned copies per batch"
    for source in (on_gpu, host):
        batch = source.batch(index)
        assert batch.is_cuda
        np.testing.assert_array_equal(batch.cpu().numpy(), images[index])


# --------------------------------------------------------------------------- loop: device, checks, RNG


@pytest.mark.parametrize("available, device", [(True, CUDA.type), (False, CPU.type)])
def test_default_device_follows_cuda_availability(monkeypatch, available, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    assert default_device() == torch.device(device)


def test_finite_check_interval_every_batch_on_cpu_else_every_25():
    assert finite_check_interval(CPU) == 1
    assert GPU_FINITE_CHECK_EVERY == 25
    assert finite_check_interval(CUDA) == 25
    assert finite_check_interval(torch.device("cuda", 3)) == 25


def _draws(generator: torch.Generator) -> tuple:
    from pytorch_metric_learning.utils import common_functions as pml_common

    return (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        int(pml_common.NUMPY_RANDOM.randint(1 << 30)),
        float(torch.rand(1, generator=generator)),
    )


def test_rng_state_without_cuda_round_trips(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", _refuse("get_rng_state_all"))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", _refuse("set_rng_state_all"))
    generator = seed_everything(11)
    _draws(generator)
    state = rng_state(generator)
    assert state["cuda"] == []
    first = _draws(generator)
    seed_everything(12)
    other = torch.Generator().manual_seed(12)
    restore_rng_state(state, other)
    assert _draws(other) == first


def test_rng_state_with_cuda_saves_and_restores_the_cuda_states(monkeypatch):
    cuda_states = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    restored: list[list[torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in cuda_states])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    generator = seed_everything(5)
    state = rng_state(generator)
    assert len(state["cuda"]) == 2 and all(map(torch.equal, state["cuda"], cuda_states))
    first = _draws(generator)
    restore_rng_state(state, generator)
    assert len(restored) == 1 and all(map(torch.equal, restored[0], cuda_states))
    assert _draws(generator) == first


def test_restore_skips_cuda_state_a_machine_cannot_take(monkeypatch):
    """A GPU checkpoint resumed on a CPU-only machine, and a CPU checkpoint resumed on a GPU."""
    generator = seed_everything(9)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    state = rng_state(generator)
    first = _draws(generator)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", _refuse("set_rng_state_all"))
    restore_rng_state({**state, "cuda": [torch.arange(16, dtype=torch.uint8)]}, generator)
    assert _draws(generator) == first
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    restore_rng_state(state, generator)  # state["cuda"] == []: nothing to restore on the GPU
    assert _draws(generator) == first


# --------------------------------------------------------------------------- CPU bf16 detection


@pytest.mark.parametrize(
    "avx512_bf16, amx, native", [(False, False, False), (True, False, True), (False, True, True), (True, True, True)]
)
def test_fast_bf16_matmul_detects_avx512_bf16_or_amx(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.delenv("DMLBENCH_CPU_BF16", raising=False)
    monkeypatch.setattr(torch.cpu, BF16_FLAGS[0], lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, BF16_FLAGS[1], lambda: amx, raising=False)
    assert fast_bf16_matmul() is native


def test_fast_bf16_matmul_without_the_torch_probes_is_false(monkeypatch):
    monkeypatch.delenv("DMLBENCH_CPU_BF16", raising=False)
    for name in BF16_FLAGS:
        monkeypatch.delattr(torch.cpu, name, raising=False)
    assert fast_bf16_matmul() is False


@pytest.mark.parametrize(
    "value, native, expected", [("1", False, True), ("0", True, False), ("", True, True), (" ", False, False)]
)
def test_fast_bf16_matmul_environment_override(monkeypatch, value, native, expected):
    monkeypatch.setenv("DMLBENCH_CPU_BF16", value)
    for name in BF16_FLAGS:
        monkeypatch.setattr(torch.cpu, name, lambda: native, raising=False)
    assert fast_bf16_matmul() is expected


def test_fast_bf16_matmul_rejects_other_values(monkeypatch):
    monkeypatch.setenv("DMLBENCH_CPU_BF16", "yes")
    with pytest.raises(ValueError, match="DMLBENCH_CPU_BF16 must be 0 or 1"):
        fast_bf16_matmul()
    assert screen.fast_bf16_matmul is fast_bf16_matmul


def test_environment_override_forces_either_cpu_path_in_a_subprocess():
    """``auto`` on the CPU takes ``screened`` with DMLBENCH_CPU_BF16=1 and faiss with 0, on any CPU
    (GPUs hidden: faiss-gpu would take ``auto`` elsewhere)."""
    code = (
        "from dmlbench.evaluate.knn import resolve_backend\n"
        "from dmlbench.evaluate.screen import fast_bf16_matmul\n"
        "print(fast_bf16_matmul(), resolve_backend('auto', 'cpu')[0])\n"
    )
    for value, expected in (("1", "True screened"), ("0", "False faiss")):
        env = {**os.environ, "DMLBENCH_CPU_BF16": value, "CUDA_VISIBLE_DEVICES": ""}
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == expected

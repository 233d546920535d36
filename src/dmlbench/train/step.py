"""One optimisation step, and the device-side pieces that make it fast on a GPU.

CUDA: bf16 autocast (the loss in float32), channels_last, ``cudnn.benchmark`` and the image cache on
the GPU when it fits this training's share (else pinned host batches). CPU: channels_last only
(``benchmarks/channels_last.py``). fp16 uses a ``GradScaler`` (Micikevicius et al., ICLR 2018)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dmlbench.data.cache import RowView
from dmlbench.devices import gpu_share
from dmlbench.train.compiling import EAGER, CompileChoice, compile_model
from dmlbench.train.divergence import FiniteWatch

GPU_CACHE_FRACTION = 0.5  # at most this share of the free GPU memory holds the image cache
AMP_DTYPES: dict[str, torch.dtype | None] = {"none": None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def cuda_amp_dtype() -> torch.dtype:
    """Autocast dtype on CUDA: bf16 where the GPU supports it (Ampere and later), else float16."""
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@dataclass(frozen=True)
class FastPath:
    """Device settings of a run: on the CPU, channels_last only; ``enabled=False``: all off."""

    device: torch.device
    amp_dtype: torch.dtype | None = None
    channels_last: bool = False
    strict_fp32: bool = False  # TensorFloat-32 off for convolutions and matrix products

    @classmethod
    def for_device(cls, device: torch.device, enabled: bool | None = None, amp: str = "auto") -> FastPath:
        """``amp``: the protocol's key; ``auto`` = bf16/fp16 on CUDA, none elsewhere; ``fp32``: no autocast
        and no TF32 (pre-Ampere arithmetic of the 2020 protocols): this process's TF32 switches go off."""
        fast = cls._for_device(device, enabled)
        strict = amp == "fp32"
        torch.backends.cudnn.allow_tf32 = not strict  # torch's default (True) unless fp32 is asked for
        torch.backends.cuda.matmul.allow_tf32 = False  # torch's default
        if amp == "auto":
            return fast
        return dataclasses.replace(fast, amp_dtype=AMP_DTYPES[amp], strict_fp32=strict)

    @classmethod
    def _for_device(cls, device: torch.device, enabled: bool | None) -> FastPath:
        if enabled is False:
            return cls(device)
        if device.type != "cuda":
            return cls(device, channels_last=True)
        torch.backends.cudnn.benchmark = True
        return cls(device, amp_dtype=cuda_amp_dtype(), channels_last=True)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A loss scaler for float16 autocast (its gradients underflow without one), else None."""
        return torch.amp.GradScaler(self.device.type) if self.amp_dtype == torch.float16 else None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def prepare_inputs(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs.contiguous(memory_format=torch.channels_last) if self.channels_last else inputs

    @property
    def precision(self) -> str:
        """The step's arithmetic for ``run.json``: ``bf16`` / ``fp16`` autocast, else ``fp32``, or
        ``fp32 (TF32 convolutions)`` where cuDNN uses TensorFloat-32 (torch's default on Ampere+)."""
        if self.amp_dtype is not None:
            return {torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp_dtype]
        if (
            self.device.type == "cuda"
            and not self.strict_fp32
            and torch.backends.cudnn.allow_tf32
            and torch.cuda.get_device_capability(self.device) >= (8, 0)
        ):
            return "fp32 (TF32 convolutions)"
        return "fp32"


def cache_fits(nbytes: int, free_bytes: int, share: float = 1) -> bool:
    """True when an image cache of ``nbytes`` fits ``GPU_CACHE_FRACTION`` of the free memory divided
    among the ``share`` trainings on the GPU (:func:`dmlbench.devices.gpu_share`)."""
    return nbytes <= GPU_CACHE_FRACTION * free_bytes / max(1.0, share)


def free_memory(device: torch.device) -> int:
    """Free bytes on a CUDA device."""
    return torch.cuda.mem_get_info(device)[0]


def cache_on_device(device: torch.device, nbytes: int) -> bool:
    """Whether the image cache lives in ``device``'s memory: on the CPU always (the memory map), on
    CUDA when it fits (:func:`cache_fits`), else on the host with pinned copies per batch."""
    if device.type == "cpu":
        return True
    return device.type == "cuda" and cache_fits(nbytes, free_memory(device), gpu_share())


def host_rows(images: np.ndarray | RowView, index: np.ndarray) -> torch.Tensor:
    """``images[index]`` in the order asked (duplicates kept), read in ascending order (memory maps)."""
    return torch.from_numpy(images[np.sort(index)][np.argsort(np.argsort(index))])


def pinned_copy(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``rows`` copied to ``device`` through pinned host memory (asynchronously)."""
    return rows.pin_memory().to(device, non_blocking=True)


def upload(images: np.ndarray | RowView, device: torch.device, rows_per_copy: int = 4096) -> torch.Tensor:
    """The whole cache on ``device``, copied ``rows_per_copy`` rows at a time (no host copy of it)."""
    out = torch.empty(images.shape, dtype=torch.uint8, device=device)
    for start in range(0, len(images), rows_per_copy):
        out[start : start + rows_per_copy] = torch.from_numpy(np.array(images[start : start + rows_per_copy]))
    return out


@dataclass
class ImageSource:
    """The training images (uint8 N x H x W x 3) with each image's valid ``(height, width)`` (``sizes``;
    None = whole canvas), gathered from the memory map, or from the GPU copy (:func:`cache_on_device`)."""

    images: np.ndarray | RowView
    device: torch.device
    sizes: np.ndarray | None = None
    on_device: torch.Tensor | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.device.type != "cpu" and cache_on_device(self.device, self.images.nbytes):
            self.on_device = upload(self.images, self.device)

    @property
    def placement(self) -> str:
        if self.device.type == "cpu":
            return "cpu memory"
        return f"{self.device.type} memory" if self.on_device is not None else "host, pinned copies per batch"

    def sizes_of(self, index: np.ndarray) -> np.ndarray | None:
        """Valid sizes of the images at ``index`` (host memory: the transforms plan crops on the
        CPU), or None for whole canvases."""
        return None if self.sizes is None else self.sizes[index]

    def batch(self, index: np.ndarray) -> torch.Tensor:
        if self.on_device is not None:
            return self.on_device[torch.from_numpy(index).to(self.on_device.device)]
        if self.device.type == "cpu":
            return host_rows(self.images, index)
        return pinned_copy(host_rows(self.images, index), self.device)


class TrainStep:
    """forward (autocast) -> miner -> loss (float32) -> backward -> clip (``grad_clip``, ``grad_clip_norm``)
    -> optimiser steps; ``watch`` records finiteness flags (:mod:`dmlbench.train.divergence`);
    ``compiled``: the forward through ``torch.compile``'s wrapper (the model stays eager)."""

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: torch.nn.Module,
        miner: Any,
        optimizers: list[torch.optim.Optimizer],
        fast: FastPath,
        grad_clip: float | None = None,
        grad_clip_norm: float | None = None,
        compiled: CompileChoice = EAGER,
    ):
        self.model, self.loss_fn, self.miner, self.optimizers = model, loss_fn, miner, optimizers
        self.fast, self.grad_clip, self.grad_clip_norm, self.compiled = fast, grad_clip, grad_clip_norm, compiled
        self.forward = compile_model(model, compiled)
        self.scaler = fast.grad_scaler()  # fp16 only

    def parameters(self) -> Iterable[torch.nn.Parameter]:
        yield from self.model.parameters()
        yield from self.loss_fn.parameters()

    def named_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter and buffer of the model and the loss (BatchNorm statistics included),
        named ``model.<name>`` / ``loss.<name>``: what a divergence check looks at."""
        for prefix, module in (("model", self.model), ("loss", self.loss_fn)):
            for name, tensor in (*module.named_parameters(), *module.named_buffers()):
                yield f"{prefix}.{name}", tensor.detach()

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor, watch: FiniteWatch | None = None) -> torch.Tensor:
        self.compiled.step_begin()
        for optimizer in self.optimizers:  # first: the last step's gradients are freed before the forward
            optimizer.zero_grad(set_to_none=True)
        with self.fast.autocast():
            embeddings = self.forward(self.fast.prepare_inputs(inputs))
        embeddings = embeddings.float()
        mined = self.miner(embeddings, labels) if self.miner is not None else None
        loss = self.loss_fn(embeddings, labels, mined)
        scaler = self.scaler
        (loss if scaler is None else scaler.scale(loss)).backward()
        if (self.grad_clip is not None or self.grad_clip_norm is not None) and scaler is not None:
            for optimizer in self.optimizers:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        if self.grad_clip is not None:  # value clipping, as the Proxy-Anchor/thesis code does
            torch.nn.utils.clip_grad_value_([p for p in self.parameters() if p.grad is not None], self.grad_clip)
        if self.grad_clip_norm is not None:  # the model's gradient norm (Hyp-ViT: its one optimiser's params)
            torch.nn.utils.clip_grad_norm_(
                [p for p in self.model.parameters() if p.grad is not None], self.grad_clip_norm
            )
        for optimizer in self.optimizers:
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)  # skipped when a gradient is not finite
        if scaler is not None:
            scaler.update()
        if watch is not None:
            watch.record(loss.detach(), embeddings.detach())
        return loss.detach()

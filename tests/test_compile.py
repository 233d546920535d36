"""``torch.compile`` of the training step (``compile: auto | on | off``): the setting is validated in
one line, ``auto`` decides by device and run length, a compiled step computes what the eager one
does, and checkpoints resume across compiled and eager runs.

On the CPU the compiled path is exercised with dynamo's ``aot_eager`` backend (graph capture and
AOTAutograd's joint forward/backward, without Inductor's C++ code generation, which takes minutes
on a small machine); Inductor with CUDA graphs is checked on a GPU (``tests/test_gpu.py``,
``make gpu-check``)."""

from __future__ import annotations

import copy

import pytest
import torch

from dmlbench.errors import ConfigError
from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES
from dmlbench.models import BACKBONES, build_model
from dmlbench.params.load import parse_params
from dmlbench.params.protocol import Protocol
from dmlbench.params.run import run_config
from dmlbench.train import compiling
from dmlbench.train.checkpoint import load_checkpoint
from dmlbench.train.compiling import COMPILE_SETTINGS, CompileChoice, choose_compile
from dmlbench.train.loop import train
from dmlbench.train.step import FastPath, TrainStep

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def aot_eager(monkeypatch):
    """Compiled steps use dynamo's aot_eager backend; dynamo's caches are cleared afterwards."""
    monkeypatch.setattr(compiling, "COMPILE_BACKEND", "aot_eager")
    yield
    torch._dynamo.reset()


def _params(raw, **protocol):
    raw = copy.deepcopy(raw)
    raw["protocols"][raw["protocol"]].update(protocol)
    return parse_params(raw)


def test_compile_setting_is_validated_in_one_line(small_raw_params):
    assert set(Protocol.model_fields["compile"].annotation.__args__) == set(COMPILE_SETTINGS)
    with pytest.raises(ConfigError) as error:
        _params(small_raw_params, compile="yes")
    assert str(error.value) == "params.yaml: protocols.demo.compile: Input should be 'auto', 'on' or 'off' (got 'yes')"
    # YAML 1.1 reads an unquoted off/on as a boolean: taken as the word
    off, on = (_params(small_raw_params, compile=value).protocols["demo"].compile for value in (False, True))
    assert (off, on) == ("off", "on")
    with pytest.raises(ConfigError, match=r"^compile: 'true' is not allowed; use one of auto, on, off$"):
        choose_compile("true", CPU, 10_000)


def test_auto_compiles_on_a_capable_gpu_for_long_runs_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(compiling.importlib.util, "find_spec", lambda name: object())  # Triton is there
    assert choose_compile("auto", CUDA, 5000) == CompileChoice("reduce-overhead", "auto")
    assert choose_compile("auto", CUDA, 1999) == CompileChoice(None, "auto: 1999 steps < 2000")
    assert choose_compile("auto", CPU, 10**6) == CompileChoice(None, "auto: cpu")  # the CPU stays bitwise as it was
    assert choose_compile("off", CUDA, 10**6) == CompileChoice(None, "protocol")
    assert choose_compile("on", CUDA, 10) == CompileChoice("reduce-overhead", "protocol")
    assert choose_compile("on", CPU, 10).mode == "default"  # CUDA graphs exist only on CUDA
    assert choose_compile("auto", CUDA, 5000).describe() == "on (reduce-overhead)"
    assert choose_compile("off", CUDA, 5000).describe() == "off (protocol)"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 1))  # a P100: no Triton
    assert choose_compile("auto", CUDA, 5000) == CompileChoice(
        None, "auto: the GPU's compute capability 6.1 is below Triton's 7.0"
    )
    with pytest.raises(ConfigError) as error:
        choose_compile("on", CUDA, 5000)
    assert str(error.value) == (
        "compile: on, but the GPU's compute capability 6.1 is below Triton's 7.0; set compile: auto or off"
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(compiling.importlib.util, "find_spec", lambda name: None)
    assert choose_compile("auto", CUDA, 5000).reason == "auto: Triton is not installed (torch's CUDA wheels bring it)"
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match=r"^compile: on, but no C\+\+ compiler .*; set compile: auto or off$"):
        choose_compile("on", CPU, 10)


def _step(choice: CompileChoice, seed: int = 0) -> TrainStep:
    torch.manual_seed(seed)
    model = build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(), 16).to(memory_format=torch.channels_last)
    spec = LOSSES["multi_similarity"]  # its miner returns index tuples of data-dependent size (eager)
    loss_params = spec.params()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fast = FastPath.for_device(CPU)
    return TrainStep(
        model.train(), spec.build(loss_params, 8, 16), spec.miner(loss_params), [optimizer], fast, 1.0, compiled=choice
    )


def test_compiled_step_computes_what_the_eager_step_does(aot_eager):
    eager, compiled = _step(CompileChoice(None, "test")), _step(CompileChoice("default", "test"))
    assert compiled.forward is not compiled.model and eager.forward is eager.model
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.rand(16, 3, 32, 32, generator=generator), torch.arange(16) // 4) for _ in range(4)]
    for inputs, labels in batches:
        torch.testing.assert_close(compiled(inputs, labels), eager(inputs, labels), rtol=1e-4, atol=1e-5)
    # the compiled wrapper trained the model's own parameters: the same weights, the same keys
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())
    for key, value in eager.model.state_dict().items():
        torch.testing.assert_close(compiled.model.state_dict()[key], value, rtol=1e-4, atol=1e-5)


class Killed(Exception):
    pass


def _kill_after_epoch_1(epoch, metrics):
    if epoch == 1:
        raise Killed


def test_a_run_resumes_across_compiled_and_eager(small_raw_params, prepared_glyphs, tmp_path, aot_eager):
    # compile is not part of the run's identity: the same config hash, and each kind's checkpoint
    # resumes in the other (plain keys, no "_orig_mod." prefix) to what an eager run gives
    _, data = prepared_glyphs
    run = RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 1)  # a second optimiser (the proxies)
    config = {
        name: run_config(_params(small_raw_params, epochs=2, iterations_per_epoch=8, compile=name), run)
        for name in ("on", "off")
    }
    assert config["on"].config_hash == config["off"].config_hash and "compile" not in config["on"].resolved["protocol"]
    uninterrupted = train(config["off"], data, device=CPU)
    assert uninterrupted.compiled == "off (protocol)" and uninterrupted.precision == "fp32"
    keys = list(build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(), 32).state_dict())
    for first, then in (("on", "off"), ("off", "on")):
        directory = tmp_path / first
        with pytest.raises(Killed):
            train(config[first], data, checkpoint_dir=directory, on_epoch=_kill_after_epoch_1, device=CPU)
        state = load_checkpoint(directory, config[then].config_hash)
        assert state is not None and state.epoch == 1 and list(state.model) == keys
        resumed = train(config[then], data, checkpoint_dir=directory, resume=state, device=CPU)
        assert resumed.resumed_from_epoch == 1
        assert resumed.compiled == {"on": "on (default)", "off": "off (protocol)"}[then]
        for a, b in zip(uninterrupted.history, resumed.history, strict=True):
            assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4), (first, then)
            assert a["val/map_at_r"] == pytest.approx(b["val/map_at_r"], abs=0.01), (first, then)
        for key, value in uninterrupted.model_state.items():
            torch.testing.assert_close(value, resumed.model_state[key], rtol=1e-3, atol=1e-4)

"""Checkpoints and models are data, never code: they load with ``torch.load(weights_only=True)``,
a pickle that would run code is refused unrun, and real ones round-trip exactly (RNG streams too)."""

from __future__ import annotations

import builtins
import os
import pickle
import random
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from dmlbench import paths
from dmlbench.errors import DmlbenchError
from dmlbench.evaluate.embed import load_trained_model
from dmlbench.grid import RunSpec
from dmlbench.params.protocol import SchedulerConfig
from dmlbench.params.run import run_config
from dmlbench.safe_load import UnsafeFile
from dmlbench.train.checkpoint import LAST, TrainState, load_checkpoint, save_checkpoint
from dmlbench.train.optim import make_scheduler
from dmlbench.train.rng import restore_rng_state, rng_state, seed_everything

RUN = RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 0)
REFUSED = "holds something other than tensors and plain values"


class _System:
    """Unpickling this runs ``os.system`` (touches ``marker``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


class _Exec:
    """Unpickling this runs ``builtins.exec`` (creates ``marker``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",)


def _torch_save(obj, path: Path) -> None:
    torch.save(obj, path)


def _pickle_dump(obj, path: Path) -> None:  # the legacy (non-zip) format torch.load also reads
    path.write_bytes(pickle.dumps(obj, protocol=2))


PAYLOADS = [_System, _Exec]
WRITERS = [_torch_save, _pickle_dump]


def test_the_payloads_do_run_code_when_unpickled(tmp_path):
    for payload in PAYLOADS:
        marker = tmp_path / f"{payload.__name__}.ran"
        pickle.loads(pickle.dumps(payload(marker)))
        assert marker.exists()


def _assert_refused(excinfo: pytest.ExceptionInfo, path: Path, marker: Path) -> None:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, DmlbenchError)
    assert message.startswith(f"{path}: {REFUSED}") and "\n" not in message
    assert not marker.exists(), "the payload ran"


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("write", WRITERS)
def test_a_checkpoint_that_would_run_code_is_refused_unrun(tmp_path, payload, write):
    marker = tmp_path / "ran"
    state = {**TrainState(config_hash="abc").to_checkpoint(), "extra": {"x": payload(marker)}}
    write(state, tmp_path / LAST)
    with pytest.raises(UnsafeFile) as excinfo:
        load_checkpoint(tmp_path, "abc")
    _assert_refused(excinfo, tmp_path / LAST, marker)
    assert "delete it to start this run over" in str(excinfo.value)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("write", WRITERS)
def test_a_model_that_would_run_code_is_refused_unrun(tmp_path, in_project, small_params, payload, write):
    marker = tmp_path / "ran"
    config = run_config(small_params, RUN)
    model_path = paths.model_dir(RUN) / "model.pt"
    model_path.parent.mkdir(parents=True)
    write({"state_dict": {}, "config_hash": config.config_hash, "selection": payload(marker)}, model_path)
    with pytest.raises(UnsafeFile) as excinfo:
        load_trained_model(config, torch.device("cpu"))
    _assert_refused(excinfo, model_path, marker)
    assert f"re-run train@{RUN.key}" in str(excinfo.value)


def test_a_checkpoint_with_pickled_numpy_rng_states_is_refused(tmp_path):
    """The format before weights-only checkpoints: never resumed, and never read unsafely."""
    old = TrainState(config_hash="abc").to_checkpoint()
    old["rng"] = {"python": random.getstate(), "numpy": np.random.get_state()}
    torch.save(old, tmp_path / LAST)
    with pytest.raises(UnsafeFile, match=rf"{REFUSED} \(numpy\..*\); .*delete it to start this run over"):
        load_checkpoint(tmp_path, "abc")


def _leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


def _draws(generator: torch.Generator) -> tuple:
    from pytorch_metric_learning.utils import common_functions as pml_common

    return (
        random.random(),
        random.gauss(0, 1),
        np.random.standard_normal(),
        np.random.randint(1 << 30),
        float(torch.rand(1)),
        pml_common.NUMPY_RANDOM.standard_normal(),
        int(pml_common.NUMPY_RANDOM.randint(1 << 30)),
        float(torch.rand(1, generator=generator)),
    )


def test_a_real_checkpoint_round_trips_weights_only_and_resumes_the_same_random_streams(tmp_path):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    schedulers = [
        make_scheduler(SchedulerConfig(name=name, step_size=2, gamma=0.5), optimizer, 5)
        for name in ("step", "cosine", "constant")
    ]
    generator = seed_everything(7)
    _draws(generator)  # leaves cached Gaussians in python's, numpy's and PML's state
    state = TrainState(config_hash="abc", epoch=2, best={"epoch": 1, "value": 0.5, "since": 1})
    state.model, state.optimizers = model.state_dict(), [optimizer.state_dict()]
    state.schedulers = [s.state_dict() for s in schedulers]
    state.rng = rng_state(generator)
    assert all(isinstance(leaf, (torch.Tensor, int, float, str, type(None))) for leaf in _leaves(state.rng))
    expected = _draws(generator)
    save_checkpoint(tmp_path, state)
    torch.load(tmp_path / LAST, weights_only=True)  # the file itself, not only our loader

    loaded = load_checkpoint(tmp_path, "abc")
    assert loaded is not None and loaded.epoch == 2 and loaded.best == state.best
    assert all(torch.equal(loaded.model[k], v) for k, v in state.model.items())
    fresh = torch.optim.Adam(torch.nn.Linear(4, 2).parameters(), lr=0.1)
    fresh.load_state_dict(loaded.optimizers[0])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    seed_everything(8)
    other = torch.Generator().manual_seed(8)
    restore_rng_state(loaded.rng, other)
    assert _draws(other) == expected


def test_a_model_file_as_the_train_stage_writes_it_loads(in_project, small_params):
    config = run_config(small_params, RUN)
    trained = config.build_model(pretrained=False)
    model_path = paths.model_dir(RUN) / "model.pt"
    model_path.parent.mkdir(parents=True)
    selection = {"split": "val", "metric": "map_at_r", "epoch": 2, "value": 0.25}
    state = {k: v.detach().cpu() for k, v in trained.state_dict().items()}
    saved = {"state_dict": state, "resolved": config.resolved, "config_hash": config.config_hash}
    torch.save({**saved, "selection": selection, "fold": None}, model_path)
    model, meta = load_trained_model(config, torch.device("cpu"))
    assert meta["selection"] == selection and meta["resolved"] == config.resolved
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())

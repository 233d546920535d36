"""The training loop: learns, selects on validation only, resumes exactly, stops on NaN."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dmlbench.config import RunSpec, config_hash, parse_params
from dmlbench.errors import TrainingDiverged
from dmlbench.evaluate.embed import compute_embeddings
from dmlbench.evaluate.metrics import retrieval_metrics
from dmlbench.models import build_model
from dmlbench.train.checkpoint import load_checkpoint
from dmlbench.train.loop import train


def _params(small_raw_params, **protocol):
    raw = copy.deepcopy(small_raw_params)
    raw["protocols"][raw["protocol"]].update(protocol)
    return parse_params(raw)


def _train_r_at_1(params, run, data, state=None):
    torch.manual_seed(run.seed)
    model = build_model(run.backbone, params.backbones[run.backbone], run.dim)
    if state is not None:
        model.load_state_dict(state)
    split = data.split("train")
    aug = params.protocol.augment
    embeddings = compute_embeddings(model, split.images, aug.eval_resize, aug.crop_size)
    return retrieval_metrics(embeddings, split.labels)["precision_at_1"]


@pytest.mark.parametrize("loss", ["contrastive", "triplet", "multi_similarity", "proxy_anchor"])
def test_each_demo_loss_beats_its_untrained_model_on_training_classes(small_raw_params, prepared_glyphs, loss):
    _, data = prepared_glyphs
    params = _params(small_raw_params, epochs=4)
    run = RunSpec("glyphs", "tiny_cnn", loss, 32, 0)
    before = _train_r_at_1(params, run, data)
    outcome = train(run, params, data, device=torch.device("cpu"))
    after = _train_r_at_1(params, run, data, outcome.model_state)
    assert after >= before + 0.05, (before, after)
    assert [h["epoch"] for h in outcome.history] == [1, 2, 3, 4]
    assert all(np.isfinite(h["train/loss"]) for h in outcome.history)
    # Selection reads the validation split, and picks the epoch with the best validation score.
    assert outcome.selection["split"] == "val"
    best = max(outcome.history, key=lambda h: h["val/map_at_r"])
    assert outcome.selected_epoch == best["epoch"]


def test_resume_after_interruption_gives_identical_results(small_raw_params, prepared_glyphs, tmp_path):
    _, data = prepared_glyphs
    params = _params(small_raw_params, epochs=3)
    run = RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 1)  # has a second optimiser and a sampler
    uninterrupted = train(run, params, data, device=torch.device("cpu"))

    class Killed(Exception):
        pass

    def kill_after_epoch_2(epoch, metrics):
        if epoch == 2:
            raise Killed

    with pytest.raises(Killed):
        train(
            run,
            params,
            data,
            checkpoint_dir=tmp_path,
            on_epoch=kill_after_epoch_2,
            device=torch.device("cpu"),
            extra_state={"mlflow_run_id": "abc"},
        )
    state = load_checkpoint(tmp_path, config_hash(params.resolved(run)))
    assert state is not None and state["epoch"] == 2 and state["extra"] == {"mlflow_run_id": "abc"}
    resumed = train(run, params, data, checkpoint_dir=tmp_path, resume=state, device=torch.device("cpu"))
    assert resumed.resumed_from_epoch == 2
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3]
    for a, b in zip(uninterrupted.history, resumed.history, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-6)
        assert a["val/map_at_r"] == pytest.approx(b["val/map_at_r"], rel=1e-6)
    for key, value in uninterrupted.model_state.items():
        torch.testing.assert_close(value, resumed.model_state[key], rtol=1e-5, atol=1e-6)
    # A checkpoint of another config is not resumed.
    assert load_checkpoint(tmp_path, "0" * 16) is None


def test_nan_loss_stops_with_a_clear_message(small_raw_params, prepared_glyphs, monkeypatch):
    _, data = prepared_glyphs
    params = _params(small_raw_params, epochs=1)
    from pytorch_metric_learning.losses import ContrastiveLoss

    monkeypatch.setattr(
        ContrastiveLoss, "forward", lambda self, *args, **kwargs: torch.tensor(float("nan"), requires_grad=True)
    )
    with pytest.raises(TrainingDiverged, match=r"loss is nan at epoch 1, batch 1; lower the learning rate"):
        train(RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0), params, data, device=torch.device("cpu"))


def test_without_validation_split_the_last_epoch_is_kept(small_raw_params, prepared_glyphs):
    _, data = prepared_glyphs
    params = _params(small_raw_params, epochs=2)
    no_val = type(data)(
        data.name, data.manifest.assign(split=data.manifest.split.replace("val", "train")), data.images, data.info
    )
    outcome = train(RunSpec("glyphs", "tiny_cnn", "contrastive", 32, 0), params, no_val, device=torch.device("cpu"))
    assert outcome.selection == {"split": None, "metric": None, "epoch": 2, "value": None}
    assert "val/map_at_r" not in outcome.history[-1]

"""Every registered loss trains the tiny trunk for 2 epochs
on the offline glyphs and retrieves the training classes better than the untrained model.

CPU numerics differ between machines (SIMD width, AVX-512/AMX, oneDNN and ATen kernels), and a few
rounding differences send a run down another trajectory, so the learned margin must be far larger
than what any one trajectory can lose. One pass over the 240 training images per epoch (15
iterations of 16) was not: R@1 gains from -0.03 to +0.27 over seeds 0-2, and proxy_nca's +0.021
became +0.017 with other oneDNN / ATen kernels forced, against the +0.02 then asserted. Each loss now
trains 8 passes per epoch, or 4 for the losses that learn fastest here, which leaves every gain
at >= 2.6x the +0.04 asserted: over seeds 0-5, and for seed 0 under seven kernel / thread
settings, the worst gains were +0.10 (npair) and +0.20 (proxy_nca, thesis_proxy) at 8 passes,
+0.15 (soft_triple) and +0.20 (snr, normalized_softmax, proxy_anchor) at 4 passes; most losses
gain +0.3 to +0.6."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dmlbench.evaluate.embed import compute_embeddings
from dmlbench.evaluate.metrics import retrieval_metrics
from dmlbench.grid import RunSpec
from dmlbench.losses import LOSSES
from dmlbench.models import build_model
from dmlbench.params.load import parse_params
from dmlbench.params.run import run_config
from dmlbench.train.loop import train

# The demo protocol's lr (1e-3) is 10x the thesis's (1e-4): the thesis loss's proxies get 10x instead
# of its code's 100x, i.e. the same absolute proxy lr (1e-2) as the thesis code.
DEMO_LR = {"thesis_proxy": {"param_lr_multiplier": 10.0}}
ITERATIONS_PER_EPOCH = 120  # 8 passes over the 240 training images (module docstring)
FAST_LEARNERS = {  # 60 iterations (4 passes) suffice: gains >= +0.15 on every seed and kernel tried
    "circle",
    "contrastive",
    "lifted_structure",
    "margin",
    "margin_per_class",
    "multi_similarity",
    "multi_similarity_without_miner",
    "normalized_softmax",
    "ntxent",
    "proxy_anchor",
    "snr",
    "soft_triple",
}
MIN_GAIN = 0.04  # R@1 on the training classes, trained - untrained


def _train_r_at_1(params, run, data, state=None) -> float:
    torch.manual_seed(run.seed)
    model = build_model(run.backbone, params.backbones[run.backbone], run.dim)
    if state is not None:
        model.load_state_dict(state)
    split = data.split("train")
    aug = params.protocol.augment
    return retrieval_metrics(compute_embeddings(model, split.images, aug.eval_resize, aug.crop_size), split.labels)[
        "precision_at_1"
    ]


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_every_loss_trains_the_tiny_trunk_in_two_epochs(small_raw_params, prepared_glyphs, loss):
    _, data = prepared_glyphs
    raw = copy.deepcopy(small_raw_params)
    raw["losses"] = {loss: DEMO_LR.get(loss, {})}  # the registry's defaults (thesis Table 4 / papers)
    iterations = ITERATIONS_PER_EPOCH // 2 if loss in FAST_LEARNERS else ITERATIONS_PER_EPOCH
    raw["protocols"][raw["protocol"]].update(epochs=2, iterations_per_epoch=iterations, test_feedback=False)
    params = parse_params(raw)
    run = RunSpec("glyphs", "tiny_cnn", loss, 32, 0)
    before = _train_r_at_1(params, run, data)
    outcome = train(run_config(params, run), data, device=torch.device("cpu"))
    after = _train_r_at_1(params, run, data, outcome.model_state)
    assert [h["epoch"] for h in outcome.history] == [1, 2] and outcome.selection["split"] == "val"
    assert all(np.isfinite(h["train/loss"]) for h in outcome.history)
    assert after >= before + MIN_GAIN, f"{loss}: R@1 on training classes {before:.3f} -> {after:.3f}"

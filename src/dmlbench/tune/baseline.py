"""The ``baseline@<dataset>-<backbone>-<loss>-<variant>`` stage: what tuning is measured against.

With ``tuning.baselines: [published]``: the published values at ``tuning.dim`` with every seed, as a
cell ``<loss>-published`` beside the tuned one (:mod:`dmlbench.analysis.tuning`).
"""

from __future__ import annotations

import shutil
from typing import Any

from dmlbench import paths
from dmlbench.evaluate.embed import embed_stage
from dmlbench.evaluate.stage import evaluate_stage
from dmlbench.grid import Combo
from dmlbench.params.model import Params
from dmlbench.params.tuning import check_baseline, search_dim
from dmlbench.train.stage import train_stage


def baseline_stage(params: Params, dataset: str, backbone: str, loss: str, variant: str) -> dict[str, Any]:
    """Train, embed and evaluate one baseline cell (every seed); return its evaluation summary."""
    combo = Combo(dataset, backbone, loss, search_dim(params), variant)
    check_baseline(params, combo)
    params.check_run(combo)
    # the models folder persists (out of DVC's run cache, see dvc.yaml): drop what no seed of this grid writes
    kept = {paths.model_dir(combo.with_seed(seed)) for seed in params.seeds}
    root = paths.ARTIFACTS / "models" / combo.relpath
    for stale in [p for p in root.glob("*") if p not in kept] if root.is_dir() else []:
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    for number, seed in enumerate(params.seeds, 1):
        print(f"{combo.stage}: seed {seed} ({number}/{len(params.seeds)})", flush=True)
        run = combo.with_seed(seed)
        train_stage(params, run)
        embed_stage(params, run)
    return evaluate_stage(params, combo)

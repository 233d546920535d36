"""The prepared image cache is memory-mapped and shared: processes reading it hold one copy in
total (the sum of their PSS), training halves and folds index it without copying."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from dmlbench.data.cache import PreparedDataset, RowView

ROOT = Path(__file__).resolve().parents[1]


def cache_memory():
    """benchmarks/cache_memory.py as a module (the benchmark's fabricator and PSS measurement); its
    folder on sys.path, which spawned readers inherit, so that they import it by name too."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("cache_memory")


def test_training_half_and_folds_index_the_map_without_copying(tmp_path):
    bench = cache_memory()
    bench.fabricate_cache(tmp_path, 400, 16)
    data = PreparedDataset.load(tmp_path)
    assert isinstance(data.images, np.memmap)
    half = data.training_half()
    assert isinstance(half.images, RowView) and half.images.base is data.images  # an index, not a copy
    fold = half.split("train", fold=1)
    assert isinstance(fold.images, RowView) and fold.images.base is data.images  # a view of a view: the map
    # the same pixels as a copy would give, in the same order, for any index
    full = np.asarray(np.load(tmp_path / "images.npy"))
    rows = np.flatnonzero(data.manifest["split"].isin(["train", "val"]).to_numpy())
    fold_rows = rows[np.flatnonzero(~half._fold_membership[:, 1])]
    index = np.array([5, 0, 5, len(fold) - 1])
    assert np.array_equal(fold.images[index], full[fold_rows[index]])
    assert np.array_equal(fold.images[2:7], full[fold_rows[2:7]])
    assert fold.images.shape == (len(fold_rows), 16, 16, 3) and fold.images.nbytes == len(fold_rows) * 16 * 16 * 3
    assert np.array_equal(np.asarray(fold.images), full[fold_rows])


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc/<pid>/smaps_rollup")
def test_two_processes_hold_one_resident_copy(tmp_path):
    """Two readers that each touch every training image (whole half and a fold) add up to about one
    cache of PSS; reading it into memory (the old default) costs one copy each."""
    bench = cache_memory()
    size = bench.fabricate_cache(tmp_path, 2400, 168)  # 203 MB: the fixed per-process overhead is small beside it
    shared = bench.measure(tmp_path, 2)["pss_sum"]
    copied = bench.measure(tmp_path, 2, in_memory=True)["pss_sum"]
    assert shared <= 1.2 * size, f"sum of PSS {shared / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB cache"
    assert copied >= 1.8 * size  # the measurement sees copies where there are some

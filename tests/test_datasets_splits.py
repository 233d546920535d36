"""Split schemes: fixed_val, the Reality Check's rc_cv (against powerful-benchmarker's rules and
the blocks in the reference notes), the thesis's kfold, and PreparedDataset.split by fold."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dmlbench.data.base import SplitConfig
from dmlbench.data.cache import PreparedDataset
from dmlbench.data.splits import assign_splits, parse_folds, rc_cv_classes
from dmlbench.errors import DataError


def mlrc_reference(num_labels: int, partitions: int = 4, test_size: float = 0.5) -> list[tuple[list, list]]:
    """powerful-benchmarker (branch metric-learning) MLRCSplitManager, transcribed: split lengths
    from ratios, then per partition a value-range rule on the sorted labels (wrapping when a > b).
    Returns (train labels, val labels) per partition, labels 0..num_labels-1."""
    labels = list(range(num_labels))
    val_ratio = (1.0 / partitions) * (1 - test_size)
    train_ratio = (1.0 - val_ratio) * (1 - test_size)
    lengths = {k: int(num_labels * v) for k, v in {"train": train_ratio, "val": val_ratio, "test": test_size}.items()}
    lengths["train"] += num_labels - sum(lengths.values())
    trainval = labels[: lengths["test"]]
    lengths.pop("test")
    out = []
    for partition in range(partitions):
        start = int((float(partition) / partitions) * len(trainval))
        rules = {}
        for key, length in lengths.items():
            s, e = start % len(trainval), (start + length - 1) % len(trainval)
            a, b = trainval[s], trainval[e]
            rules[key] = (lambda x, a=a, b=b: a <= x <= b) if a < b else (lambda x, a=a, b=b: x >= a or x <= b)
            start += length
        out.append(([x for x in trainval if rules["train"](x)], [x for x in trainval if rules["val"](x)]))
    return out


def _frame(train_classes: int, test_classes: int, per_class: int = 2) -> pd.DataFrame:
    labels = np.repeat(np.arange(1, train_classes + test_classes + 1), per_class)
    return pd.DataFrame({"label": labels, "split": np.where(labels <= train_classes, "train", "test")})


def _val_blocks(frame: pd.DataFrame, config: SplitConfig) -> list[list[int]]:
    assigned = assign_splits(frame, config)
    folds = parse_folds(assigned["fold"])
    return [sorted({lab for lab, f in zip(frame.label, folds, strict=True) if k in f}) for k in range(config.folds)]


def test_rc_cv_reproduces_the_reality_check_blocks_of_cub_and_cars():
    # Reference notes (pml_and_powerful_benchmarker.md §2): CUB val blocks 75-99, 0-24, 25-49, 50-74
    # (0-based class indices); Cars 74 train / 24 val, classes 24 and 73 never validate.
    cub = _val_blocks(_frame(100, 100), SplitConfig(scheme="rc_cv"))
    assert cub == [list(range(76, 101)), list(range(1, 26)), list(range(26, 51)), list(range(51, 76))]  # 1-based ids
    cars = _val_blocks(_frame(98, 98), SplitConfig(scheme="rc_cv"))
    assert [len(b) for b in cars] == [24] * 4
    never = sorted(set(range(1, 99)) - {c for block in cars for c in block})
    assert never == [25, 74]  # 0-based 24 and 73
    for fold, block in enumerate(cars):  # every fold trains on the other 74 training classes
        assert len(set(range(1, 99)) - set(block)) == 74, fold


@pytest.mark.parametrize("num_classes", [16, 22, 100, 101, 196, 200, 333])
def test_rc_cv_equals_powerful_benchmarker_rules(num_classes):
    """Our index arithmetic on the training half == MLRCSplitManager on a dataset of 2 x T classes."""
    train_classes = num_classes // 2
    ours = rc_cv_classes(np.arange(train_classes), SplitConfig(scheme="rc_cv"))
    reference = mlrc_reference(2 * train_classes)
    for block, (ref_train, ref_val) in zip(ours, reference, strict=True):
        assert sorted(block.tolist()) == ref_val
        assert sorted(set(range(train_classes)) - set(block.tolist())) == ref_train


def test_rc_cv_on_sop_sized_training_half():
    # SOP's official training half has 11,318 classes (MLRC's own halving gives 11,317; we keep the
    # official test set): 2,829 validation classes per fold, disjoint blocks.
    blocks = rc_cv_classes(np.arange(11318), SplitConfig(scheme="rc_cv"))
    assert [len(b) for b in blocks] == [2829] * 4
    assert len(np.unique(np.concatenate(blocks))) == 4 * 2829


def test_kfold_puts_every_training_class_in_exactly_one_fold():
    frame = _frame(100, 100)
    config = SplitConfig(scheme="kfold", seed=3)
    assigned = assign_splits(frame, config)
    train = assigned["split"] == "train"
    assert set(assigned.loc[~train, "fold"]) == {""} and (assigned["split"] != "val").all()
    folds = parse_folds(assigned.loc[train, "fold"])
    assert all(len(f) == 1 for f in folds)
    blocks = _val_blocks(frame, config)
    assert [len(b) for b in blocks] == [10] * 10 and sorted(sum(blocks, [])) == list(range(1, 101))
    assert blocks != sorted(blocks)  # random, not contiguous
    assert _val_blocks(frame, config) == blocks  # deterministic
    assert _val_blocks(frame, SplitConfig(scheme="kfold", seed=4)) != blocks
    uneven = _val_blocks(_frame(23, 5), SplitConfig(scheme="kfold", num_folds=4))
    assert sorted(len(b) for b in uneven) == [5, 6, 6, 6]


@pytest.mark.parametrize(
    "config",
    [
        SplitConfig(scheme="standard"),
        SplitConfig(scheme="fixed_val", val_fraction=0.3, seed=1),
        SplitConfig(scheme="rc_cv"),
        SplitConfig(scheme="kfold", num_folds=5),
    ],
)
def test_validation_never_contains_test_classes(config):
    frame = pd.DataFrame({"label": np.repeat(np.arange(30), 2), "split": ["train"] * 20 + ["query", "gallery"] * 20})
    assigned = assign_splits(frame, config)
    held_out = set(frame.label[frame.split != "train"])
    validating = set(frame.label[assigned["split"] == "val"]) | set(frame.label[assigned["fold"] != ""])
    assert validating <= set(range(10)) and not validating & held_out
    assert assigned.loc[frame.split != "train", "split"].equals(frame.split[frame.split != "train"])


def test_split_config_errors():
    with pytest.raises(ValueError, match="num_folds applies to the schemes rc_cv, kfold, not 'fixed_val'"):
        SplitConfig(scheme="fixed_val", num_folds=4)
    with pytest.raises(ValueError, match="greater than or equal to 2"):
        SplitConfig(scheme="kfold", num_folds=1)
    with pytest.raises(DataError, match="kfold with 10 folds needs >= 10 training classes, got 6"):
        assign_splits(_frame(6, 6), SplitConfig(scheme="kfold"))
    assert SplitConfig(scheme="rc_cv").folds == 4 and SplitConfig(scheme="kfold").folds == 10
    assert SplitConfig(scheme="fixed_val").folds == 0


def _prepared(config: SplitConfig, tmp_path) -> PreparedDataset:
    """A PreparedDataset over a synthetic manifest (image i holds the value i)."""
    from dmlbench.data.prepare import order_by_split

    frame = _frame(8, 4, per_class=3)
    frame["path"] = [f"img{i}.jpg" for i in range(len(frame))]
    frame["class_name"] = frame.label.astype(str)
    frame[["split", "fold"]] = assign_splits(frame, config)
    frame = order_by_split(frame)
    n = len(frame)
    images = np.arange(n, dtype=np.uint8)[:, None, None, None] * np.ones((1, 4, 4, 3), dtype=np.uint8)
    sizes = np.tile([[4, 3]], (n, 1)).astype(np.int32)
    info = {"dataset": "synthetic", "image_size": 3, "num_folds": config.folds}
    return PreparedDataset("synthetic", frame, images, info, sizes)


def test_prepared_dataset_split_by_fold(tmp_path):
    data = _prepared(SplitConfig(scheme="rc_cv"), tmp_path)  # 8 training classes: 2 per fold
    assert data.num_folds == 4
    whole = data.split("train")
    assert len(whole) == 24 and set(whole.labels) == set(range(1, 9))
    assert len(data.split("val")) == 0  # a CV dataset has no fixed validation rows
    seen = set()
    for fold in range(4):
        train, val = data.split("train", fold=fold), data.split("val", fold=fold)
        assert len(train) + len(val) == 24 and not set(train.labels) & set(val.labels)
        assert val.num_classes == 2 and train.sizes.shape == (18, 2) and val.images.shape == (6, 4, 4, 3)
        # images, labels and sizes stay aligned with the manifest rows
        rows = data.manifest.index[(data.manifest.split == "train") & data.manifest.fold.str.contains(str(fold))]
        assert val.images[:, 0, 0, 0].tolist() == rows.tolist()
        seen |= set(val.labels)
    assert seen == set(range(1, 9))
    assert len(data.split("test", fold=2)) == 12  # the fold does not touch the test half
    with pytest.raises(ValueError, match=r"fold must be in 0..3, got 4"):
        data.split("train", fold=4)


def test_non_cv_split_rejects_folds_and_slices_without_copy(tmp_path):
    data = _prepared(SplitConfig(scheme="fixed_val", val_fraction=0.25, seed=0), tmp_path)
    assert data.num_folds == 0
    with pytest.raises(ValueError, match="the split scheme has no folds"):
        data.split("train", fold=0)
    train, val, test = data.split("train"), data.split("val"), data.split("test")
    assert (len(train), len(val), len(test)) == (18, 6, 12)
    # Splits are contiguous in the cache: slices are views (zero-copy on a memory map).
    assert np.shares_memory(train.images, data.images) and np.shares_memory(test.sizes, data.sizes)

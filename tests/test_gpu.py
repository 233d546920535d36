"""The GPU path against the CPU path (``pytest -m gpu``; skipped without a CUDA GPU, run by
``make gpu-check``): neighbour search and k-means, faiss-gpu, a bf16 training step of every
loss, augmentation on the device, and kill-and-resume of a training run."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dmlbench.evaluate.clustering import kmeans_assign
from dmlbench.evaluate.knn import faiss_gpus, normalize_rows, rank_neighbours
from dmlbench.evaluate.ranking import RankingTask
from dmlbench.losses import LOSSES

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
# bf16 autocast vs fp32 of one training step: the loss within 5 % (+0.02 for losses near 0) and
# the model's gradient pointing the same way (cosine >= 0.9). bf16 keeps 8 bits of mantissa, so
# embeddings differ by ~0.4 % and a miner may pick a slightly different set of pairs.
BF16_LOSS_RTOL, BF16_LOSS_ATOL, BF16_GRAD_COSINE = 0.05, 0.02, 0.9
# kill-and-resume on the GPU: cuDNN and atomics are not bitwise reproducible, so the resumed run
# is compared with the uninterrupted one within these bounds (same selected epoch required).
RESUME_METRIC_ATOL, RESUME_LOSS_RTOL = 0.03, 0.05


def _clustered(seed: int, n: int, dim: int, classes: int, support: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors of ``support`` entries +-1/sqrt(support) (16: +-1/4): every dot product is a
    multiple of 1/support, exact in fp32 whatever the order of summation, so GPU and CPU compute
    the same similarities and near-ties are real ties, which the tie rule breaks the same way."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    labels[:classes] = np.arange(classes)
    labels[classes : 2 * classes] = np.arange(classes)  # every class at least twice
    prototypes = np.zeros((classes, dim), dtype=np.float32)
    for row in prototypes:
        row[rng.choice(dim, support, replace=False)] = rng.choice([-1.0, 1.0], support)
    x = prototypes[labels] * np.where(rng.random((n, dim)) < 0.2, -1.0, 1.0).astype(np.float32)
    x = x / np.float32(np.sqrt(support))
    assert np.array_equal(normalize_rows(x), x)  # already unit norm, exactly
    return x, labels


def test_knn_on_cuda_equals_the_cpu_results():
    x, labels = _clustered(6, n=6000, dim=64, classes=600)
    task = dict(queries=x, query_labels=labels, references=x, reference_labels=labels, k=40, first_limit=1000)
    gpu = rank_neighbours(RankingTask(**task, self_index=np.arange(len(x)), backend="torch", device="cuda"))
    for backend in ("torch", "faiss"):
        cpu = rank_neighbours(RankingTask(**task, self_index=np.arange(len(x)), backend=backend, device="cpu"))
        assert np.array_equal(cpu.hits, gpu.hits) and np.array_equal(cpu.first_positive, gpu.first_positive)
    task = dict(queries=x[:2000], query_labels=labels[:2000], references=x[2000:], reference_labels=labels[2000:])
    gpu = rank_neighbours(RankingTask(**task, k=20, first_limit=500, backend="torch", device="cuda"))
    cpu = rank_neighbours(RankingTask(**task, k=20, first_limit=500, backend="faiss", device="cpu"))
    assert np.array_equal(cpu.hits, gpu.hits) and np.array_equal(cpu.first_positive, gpu.first_positive)


@pytest.mark.parametrize(("n", "dim", "k"), [(3000, 32, 600), (300, 4, 299)])
def test_kmeans_on_cuda_equals_faiss_on_the_cpu(n, dim, k):
    x = normalize_rows(np.random.default_rng(n + k).normal(size=(n, dim)).astype(np.float32))
    on_cuda = kmeans_assign(x, k, niter=20, backend="torch", device="cuda")
    assert np.array_equal(on_cuda, kmeans_assign(x, k, niter=20, backend="faiss", device="cpu"))
    assert np.array_equal(on_cuda, kmeans_assign(x, k, niter=20, backend="auto", device="cuda"))


@pytest.mark.skipif(faiss_gpus() == 0, reason="faiss has no GPU here (faiss-cpu): the torch path is the GPU path")
def test_faiss_gpu_equals_faiss_cpu(monkeypatch):
    from dmlbench.evaluate import knn

    x, labels = _clustered(7, n=5000, dim=64, classes=500)
    task = RankingTask(
        queries=x,
        query_labels=labels,
        references=x,
        reference_labels=labels,
        k=40,
        first_limit=1000,
        self_index=np.arange(len(x)),
        backend="faiss",
    )
    gpu = rank_neighbours(task)
    monkeypatch.setattr(knn, "faiss_gpus", lambda: 0)
    cpu = rank_neighbours(task)
    assert np.array_equal(cpu.hits, gpu.hits) and np.array_equal(cpu.first_positive, gpu.first_positive)


def _step_loss_and_gradient(model, loss_name: str, amp: bool, inputs, labels) -> tuple[float, torch.Tensor, bool]:
    """One real :class:`TrainStep` (SGD with lr 0: parameters stay, gradients remain)."""
    from dmlbench.train.step import FastPath, TrainStep

    spec = LOSSES[loss_name]
    params = spec.params()
    torch.manual_seed(1)
    loss_fn = spec.build(params, int(labels.max()) + 1, 32).to(CUDA)
    fast = FastPath.for_device(CUDA, enabled=amp)
    model = fast.prepare_model(copy.deepcopy(model))
    optimizers = [torch.optim.SGD(list(model.parameters()) + list(loss_fn.parameters()), lr=0.0)]
    loss = TrainStep(model, loss_fn, spec.miner(params), optimizers, fast)(inputs, labels)
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    finite = bool(torch.isfinite(grads).all()) and all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return float(loss), grads, finite


@pytest.mark.parametrize("loss_name", sorted(LOSSES))
def test_bf16_training_step_of_every_loss_is_finite_and_close_to_fp32(loss_name):
    from dmlbench.models import BACKBONES, build_model

    torch.manual_seed(0)
    model = build_model("tiny_cnn", BACKBONES["tiny_cnn"].params(), 32).to(CUDA).train()
    inputs = torch.rand(32, 3, 32, 32, device=CUDA)
    labels = torch.arange(32, device=CUDA) // 4  # 8 classes x 4 images
    fp32, grad32, finite32 = _step_loss_and_gradient(model, loss_name, False, inputs, labels)
    bf16, grad16, finite16 = _step_loss_and_gradient(model, loss_name, True, inputs, labels)
    assert finite32 and finite16 and np.isfinite(bf16)
    assert bf16 == pytest.approx(fp32, rel=BF16_LOSS_RTOL, abs=BF16_LOSS_ATOL)
    if grad32.norm() > 0:
        cosine = float(torch.nn.functional.cosine_similarity(grad32, grad16, dim=0))
        assert cosine >= BF16_GRAD_COSINE, cosine


@pytest.mark.parametrize("sized", [False, True])
def test_augmentation_on_the_gpu_equals_the_cpu_path(sized):
    from dmlbench.data.augment import eval_transform, train_transform

    rng = np.random.default_rng(3)
    batch = torch.from_numpy(rng.integers(0, 256, (64, 96, 96, 3), dtype=np.uint8))
    sizes = np.stack([rng.integers(40, 97, 64), rng.integers(40, 97, 64)], axis=1) if sized else None
    outputs = {}
    for device in ("cpu", "cuda"):
        generator = torch.Generator().manual_seed(11)  # crops are drawn on the host: same boxes
        crops = [
            train_transform(batch.to(device), 40, (0.08, 1.0), (0.75, 1.3333), True, generator, sizes=sizes)
            for _ in range(3)
        ]
        outputs[device] = [c.cpu() for c in crops] + [eval_transform(batch.to(device), 48, 40, sizes=sizes).cpu()]
    for cpu, gpu in zip(outputs["cpu"], outputs["cuda"], strict=True):
        assert cpu.shape == gpu.shape == (64, 3, 40, 40)
        torch.testing.assert_close(gpu, cpu, rtol=0, atol=2e-5)  # same crops and flips, float rounding only
    # the crops are not all the same (the boxes, flips and scales vary)
    assert not torch.equal(outputs["cuda"][0], outputs["cuda"][1])


class _Killed(Exception):
    pass


def test_kill_and_resume_on_the_gpu_gives_the_same_selection(tmp_path, prepared_glyphs, small_raw_params):
    from dmlbench.grid import RunSpec
    from dmlbench.params.load import parse_params
    from dmlbench.params.model import config_hash
    from dmlbench.params.run import run_config
    from dmlbench.train.checkpoint import load_checkpoint
    from dmlbench.train.loop import train

    raw = copy.deepcopy(small_raw_params)
    raw["protocols"][raw["protocol"]].update(epochs=5)
    params = parse_params(raw)
    _, data = prepared_glyphs
    run = RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 0)  # a second optimiser, proxies on the GPU
    whole = train(run_config(params, run), data, device=CUDA)

    def killed_after_epoch_2(epoch, metrics):
        if epoch == 2:
            raise _Killed

    with pytest.raises(_Killed):
        train(run_config(params, run), data, checkpoint_dir=tmp_path, on_epoch=killed_after_epoch_2, device=CUDA)
    checkpoint = load_checkpoint(tmp_path, config_hash(run_config(params, run).resolved))
    assert checkpoint is not None and checkpoint.epoch == 2
    resumed = train(run_config(params, run), data, checkpoint_dir=tmp_path, resume=checkpoint, device=CUDA)
    assert resumed.resumed_from_epoch == 2 and [h["epoch"] for h in resumed.history] == [1, 2, 3, 4, 5]
    assert resumed.selected_epoch == whole.selected_epoch
    for ours, theirs in zip(resumed.history, whole.history, strict=True):
        assert ours["train/loss"] == pytest.approx(theirs["train/loss"], rel=RESUME_LOSS_RTOL)
        for key in ("val/map_at_r", "val/precision_at_1"):
            assert ours[key] == pytest.approx(theirs[key], abs=RESUME_METRIC_ATOL), (ours["epoch"], key)


def test_compiled_gpu_training_matches_eager_and_resumes(tmp_path, prepared_glyphs, small_raw_params, monkeypatch):
    # compile: on through the real loop (Inductor, CUDA graphs) against the eager loop, in fp32
    # without TF32 so that the two differ by summation order only; epoch 1 warms up with a frozen
    # trunk (a second graph after it); the compiled run is killed after epoch 2 and resumed
    # compiled from its checkpoint. Same tolerances as the eager kill-and-resume above.
    from dmlbench.grid import RunSpec
    from dmlbench.params.load import parse_params
    from dmlbench.params.run import run_config
    from dmlbench.train.checkpoint import load_checkpoint
    from dmlbench.train.loop import train

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    assert torch.get_float32_matmul_precision() == "highest"  # torch's default: no TF32 matrix products
    _, data = prepared_glyphs
    run = RunSpec("glyphs", "tiny_cnn", "proxy_anchor", 32, 0)
    configs = {}
    for setting in ("on", "off"):
        raw = copy.deepcopy(small_raw_params)
        raw["protocols"][raw["protocol"]].update(
            epochs=3, warmup_epochs=1, iterations_per_epoch=10, amp="none", compile=setting
        )
        configs[setting] = run_config(parse_params(raw), run)
    eager = train(configs["off"], data, device=CUDA)

    def killed_after_epoch_2(epoch, metrics):
        if epoch == 2:
            raise _Killed

    with pytest.raises(_Killed):
        train(configs["on"], data, checkpoint_dir=tmp_path, on_epoch=killed_after_epoch_2, device=CUDA)
    checkpoint = load_checkpoint(tmp_path, configs["on"].config_hash)
    assert checkpoint is not None and checkpoint.epoch == 2
    resumed = train(configs["on"], data, checkpoint_dir=tmp_path, resume=checkpoint, device=CUDA)
    torch._dynamo.reset()
    assert resumed.compiled == "on (reduce-overhead)" and resumed.precision == "fp32"
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3]
    for ours, theirs in zip(resumed.history, eager.history, strict=True):
        assert ours["train/loss"] == pytest.approx(theirs["train/loss"], rel=RESUME_LOSS_RTOL)
        assert ours["val/map_at_r"] == pytest.approx(theirs["val/map_at_r"], abs=RESUME_METRIC_ATOL), ours["epoch"]

"""One training step of each modern recipe at its real batch, on the device: time and peak memory.

For ``hyp_vit`` (DINO ViT-S/16, 384-d, the sphere loss; CUB's 100 classes x 9 and SOP's 450 x 2)
and ``berton2025`` (DINOv2 ViT-B/14 class token, Multi-Similarity + miner, 64 x 4 with squash +
RandAugment(3)): the protocol of params.yaml resolved for the dataset, its optimiser groups,
frozen modules, head, amp and clipping, the transform on synthetic uint8 images on the device, and
the step. Trunks are random-initialised (no weights needed): the time and memory are the
architecture's. Prints a table; writes ``recipe_steps.json`` under ``--out``.

    python benchmarks/recipe_steps.py --out /tmp/recipes             # a GPU
    python benchmarks/recipe_steps.py --out /tmp/recipes --smoke     # CPU: tiny_vit, small batches
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dmlbench.data.augment import rand_augment, resolve_interpolation, squash_train_transform, train_transform  # noqa: E402
from dmlbench.losses import LOSSES  # noqa: E402
from dmlbench.models import BACKBONES, build_model  # noqa: E402
from dmlbench.params.files import read_params_file  # noqa: E402
from dmlbench.params.protocol import Protocol  # noqa: E402
from dmlbench.train.optim import freeze_modules, make_model_optimizer  # noqa: E402
from dmlbench.train.sampling import class_pass_batches, epoch_batches  # noqa: E402
from dmlbench.train.step import FastPath, TrainStep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# (name, protocol, dataset for the overrides, backbone, loss, dim, classes in the training split)
CASES = [
    ("hyp_vit CUB (100 x 9)", "hyp_vit", "cub200", "dino_vits16", "hyp_vit_sphere", 384, 100),
    ("hyp_vit SOP (450 x 2)", "hyp_vit", "sop", "dino_vits16", "hyp_vit_sphere", 384, 11318),
    ("berton2025 (64 x 4)", "berton2025", "cub200", "dinov2_vitb14", "multi_similarity", 768, 80),
]


def _case(name, protocol_name, dataset, backbone, loss, dim, classes, args, device):
    raw = read_params_file(ROOT / "params.yaml")["protocols"][protocol_name]
    protocol = Protocol.model_validate(raw).for_run(dataset, backbone)
    if args.smoke:  # tiny_vit at 32 px, batches / 10
        backbone, dim = "tiny_vit", 64 if protocol.head == "none" else 32
        protocol = protocol.model_copy(
            update={
                "batch_size": protocol.batch_size // 10 // protocol.samples_per_class * protocol.samples_per_class,
                "augment": protocol.augment.model_copy(update={"crop_size": 32, "eval_resize": 32}),
            }
        )
    torch.manual_seed(0)
    model = build_model(backbone, BACKBONES[backbone].params(), dim, pooling=protocol.pooling)
    if protocol.head == "none":
        model.head = torch.nn.Identity()
    elif protocol.head_init == "orthogonal":
        torch.nn.init.orthogonal_(model.head.weight)
        torch.nn.init.zeros_(model.head.bias)
    fast = FastPath.for_device(device, None, protocol.amp)
    model = fast.prepare_model(model)
    frozen = freeze_modules(protocol, model)
    optimiser = make_model_optimizer(protocol, model)
    spec = LOSSES[loss]
    params = spec.params.model_validate(protocol.losses.get(loss, {}))
    step = TrainStep(
        model, spec.build(params, classes, dim).to(device), spec.miner(params), [optimiser], fast,
        protocol.grad_clip, protocol.grad_clip_norm,
    )  # fmt: skip
    labels = np.repeat(np.arange(classes), 12)
    np.random.seed(0)
    if protocol.sampler == "class_pass":
        batches = class_pass_batches(labels, protocol.batch_size, protocol.samples_per_class)
    else:
        batches = epoch_batches(labels, protocol.batch_size, protocol.samples_per_class, iterations=4)
    side = 256 if not args.smoke else 40
    images = torch.randint(0, 256, (protocol.batch_size, side, side, 3), dtype=torch.uint8, device=device)
    aug, kernel = protocol.augment, resolve_interpolation(protocol.augment.interpolation, model.interpolation)
    generator = torch.Generator().manual_seed(0)
    targets = torch.from_numpy(labels[batches[0]]).to(device)

    def transform():
        if aug.train == "squash":
            return squash_train_transform(
                images, aug.crop_size, aug.hflip, generator, interpolation=kernel,
                rand_augment_ops=aug.rand_augment, rand_augment_magnitude=aug.rand_augment_magnitude,
            )  # fmt: skip
        out = train_transform(
            images, aug.crop_size, aug.crop_scale, aug.crop_ratio, aug.hflip, generator, interpolation=kernel
        )
        return rand_augment(out, aug.rand_augment, aug.rand_augment_magnitude, generator) if aug.rand_augment else out

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timings = {"transform": [], "step": []}
    losses = []
    for i in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        inputs = transform()
        sync()
        middle = time.perf_counter()
        losses.append(float(step(inputs, targets)))
        sync()
        if i >= args.warmup:
            timings["transform"].append(middle - start)
            timings["step"].append(time.perf_counter() - middle)
    return {
        "case": name,
        "backbone": backbone,
        "loss": loss,
        "batch": protocol.batch_size,
        "per_class": protocol.samples_per_class,
        "batches_per_epoch": int(batches.shape[0]),
        "amp": protocol.amp,
        "frozen": len(frozen),
        "groups": len(optimiser.param_groups),
        "transform_ms": 1000 * float(np.median(timings["transform"])),
        "step_ms": 1000 * float(np.median(timings["step"])),
        "images_per_s": protocol.batch_size / float(np.median(np.add(timings["transform"], timings["step"]))),
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "losses_finite": bool(np.isfinite(losses).all()),
        "loss_first_last": [losses[0], losses[-1]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny_vit, batches / 10 (CPU)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = [_case(*case, args, device) for case in CASES]
    print(f"device: {name}; torch {torch.__version__}; {args.steps} timed steps after {args.warmup}")
    print(
        f"{'case':24} {'trunk':15} {'batch':>5} {'b/ep':>5} {'amp':>4} {'transform ms':>12} {'step ms':>8} "
        f"{'img/s':>7} {'peak GiB':>8} finite"
    )
    for r in rows:
        peak = f"{r['peak_gib']:8.1f}" if r["peak_gib"] is not None else f"{'-':>8}"
        print(
            f"{r['case']:24} {r['backbone']:15} {r['batch']:5d} {r['batches_per_epoch']:5d} {r['amp']:>4} "
            f"{r['transform_ms']:12.1f} {r['step_ms']:8.1f} {r['images_per_s']:7.0f} {peak} {r['losses_finite']}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recipe_steps.json").write_text(json.dumps({"device": name, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""NCHW vs channels_last (NHWC) on the CPU: inference and training-step time of a backbone.

The demo trains and embeds on the CPU in channels_last (``FastPath.for_device``,
``evaluate.embed.INFERENCE_FORMAT``). This prints, for one backbone at the demo's sizes, the
seconds per pass in each memory format, the speed-up, and the largest difference between the
two formats' embeddings (float rounding only).

    python benchmarks/channels_last.py                           # tiny_cnn, 32 px, 1 thread
    python benchmarks/channels_last.py --threads 2 --images 1600 --batch 256
    python benchmarks/channels_last.py --backbone resnet50 --size 224 --images 64 --batch 32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


def seconds(function, repeats: int) -> float:
    """Median wall seconds of ``function()`` over ``repeats`` calls, after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="tiny_cnn")
    parser.add_argument("--size", type=int, default=32, help="input side, px (demo: 32)")
    parser.add_argument("--images", type=int, default=1600, help="images embedded per pass (demo test split: 1600)")
    parser.add_argument("--batch", type=int, default=256, help="inference batch (demo eval_batch_size: 256)")
    parser.add_argument("--train-batch", type=int, default=32, help="training batch (demo: 32)")
    parser.add_argument("--steps", type=int, default=20, help="training steps per pass")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from dmlbench.models import BACKBONES, build_model

    torch.set_num_threads(args.threads)
    spec = BACKBONES[args.backbone]
    params = spec.params()

    def model(memory_format: torch.memory_format) -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(args.backbone, params, dim=64).to(memory_format=memory_format)

    images = torch.rand(args.images, 3, args.size, args.size)
    batch = torch.rand(args.train_batch, 3, args.size, args.size)
    rows, outputs = [], {}
    for name, memory_format in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
        net = model(memory_format).eval()
        with torch.inference_mode():
            embed = lambda net=net: [net(images[i : i + args.batch]) for i in range(0, args.images, args.batch)]  # noqa: E731
            inference = seconds(embed, args.repeats)
            outputs[name] = torch.cat(embed())
        net = model(memory_format).train()
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

        def train(net: torch.nn.Module = net, optimizer: torch.optim.Optimizer = optimizer) -> None:
            for _ in range(args.steps):
                net(batch).square().sum().backward()
                optimizer.step()
                optimizer.zero_grad()

        rows.append((name, inference, seconds(train, args.repeats)))

    print(
        f"{args.backbone}, {args.size} px, {args.threads} thread(s), torch {torch.__version__}: "
        f"inference = {args.images} images in batches of {args.batch}; training = {args.steps} steps of "
        f"{args.train_batch}"
    )
    print(f"{'format':<14} {'inference s':>12} {'training s':>11}")
    for name, inference, train_seconds in rows:
        print(f"{name:<14} {inference:>12.3f} {train_seconds:>11.3f}")
    (_, base_inference, base_train), (_, inference, train_seconds) = rows
    print(f"speed-up: inference {base_inference / inference:.2f}x, training {base_train / train_seconds:.2f}x")
    difference = (outputs["NCHW"] - outputs["channels_last"]).abs().max().item()
    print(f"largest |embedding difference| between the formats: {difference:.2e} (unit-norm embeddings)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

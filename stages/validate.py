"""DVC stage validate: check every key of params.yaml (its tuning and cluster sections too), and
that every pretrained weights file the grid needs is here or downloadable, before any other stage
runs.

Its output never changes (so it re-runs on any params change without invalidating
downstream stages); `download` depends on it, so bad input fails here, in one line.
"""

from dmlbench.cli import main, stage_parser
from dmlbench.params.complete import load_complete
from dmlbench.params.load import validated_marker
from dmlbench.pipeline.preflight import require_weights


def validate(params, args) -> None:
    require_weights(params)  # missing pretrained weights fail here, before download and prepare
    validated_marker(params, args.out)


if __name__ == "__main__":
    main(stage_parser(__doc__, "out"), validate, load=lambda args: load_complete(args.params))

"""DVC stage validate: check every key of params.yaml (its tuning and cluster sections too), and
that every pretrained weights file the grid needs is here or downloadable, before any other stage
runs; then write each stage's inputs manifest (artifacts/inputs/<stage>.json: the md5 of every code
file and the value of every params.yaml key it reads, derived from the source by
dmlbench.pipeline.reads; always from params.yaml, the file DVC resolves the stages from, whatever
--params checked).

Its marker output never changes; a manifest changes only when what its stage reads changed, so an
edit re-runs exactly the stages that read what was edited. Every other stage depends on its
manifest, so bad input fails here, in one line.
"""

from dmlbench.cli import main, stage_parser
from dmlbench.params.complete import load_complete
from dmlbench.params.load import validated_marker
from dmlbench.pipeline.manifests import write_manifests
from dmlbench.pipeline.preflight import require_backend, require_weights, weights_pins


def validate(params, args) -> None:
    require_backend(params)  # a backend without its package fails here, not after training
    require_weights(params)  # missing pretrained weights fail here, before download and prepare
    written = write_manifests(pins=weights_pins(params))
    print(f"wrote the inputs manifests of {written} stages (artifacts/inputs/)")
    validated_marker(params, args.out)


if __name__ == "__main__":
    main(stage_parser(__doc__, "out"), validate, load=lambda args: load_complete(args.params))

"""DVC stage train@<dataset>-<backbone>-<loss>-<dim>-<seed>: train one run, log it to MLflow, then embed
the test (and validation) classes with the selected model."""

from dmlbench.cli import main, run_spec, stage_parser
from dmlbench.evaluate.embed import embed_stage
from dmlbench.params.load import load_params
from dmlbench.train.stage import train_stage


def train_and_embed(params, args) -> dict:
    run = run_spec(args)
    info = train_stage(params, run)
    embed_stage(params, run)
    return info


if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "backbone", "loss", "dim", "seed"),
        train_and_embed,
        load=lambda args: load_params(args.params),
    )

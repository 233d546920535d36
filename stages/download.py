"""DVC stage download@<dataset>: fetch the dataset into artifacts/raw/<dataset>."""

from dmlbench.cli import main, stage_parser
from dmlbench.data.stage import download_stage
from dmlbench.params.datasets import load_dataset_params

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset"),
        lambda dataset, args: download_stage(args.dataset, dataset),
        load=lambda args: load_dataset_params(args.params, args.dataset),
    )

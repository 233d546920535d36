"""DVC stage prepare@<dataset>: decode, resize and split into artifacts/prepared/<dataset>."""

from dmlbench.cli import main, stage_parser
from dmlbench.data.stage import prepare_stage
from dmlbench.params.datasets import load_dataset_params

if __name__ == "__main__":
    main(
        stage_parser(__doc__, "dataset", "workers"),
        lambda dataset, args: prepare_stage(args.dataset, dataset, workers=args.workers),
        load=lambda args: load_dataset_params(args.params, args.dataset),
    )

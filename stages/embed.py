"""DVC stage embed@<dataset>-<backbone>-<loss>-<dim>-<seed>: embed test/val images with the selected model."""

from dmlbench.cli import main, run_parser, run_spec
from dmlbench.evaluate.embed import embed_stage

if __name__ == "__main__":
    main(run_parser(__doc__), lambda params, args: embed_stage(params, run_spec(args)))

"""OpenEvolve evaluator file: `evaluate(program_path) -> {'combined_score': ...}`.

Point OpenEvolve at this file with a seed policy from this folder, e.g.

    python openevolve-run.py cluster/policies/seeds/plas_seed.py \\
        cluster/policies/seeds/openevolve_evaluator.py --config my_config.yaml

The score is seed mean JCT / candidate mean JCT on the target cell (paper 003 §5.3):
`cluster.sweep.EVAL_CELL` ("search-cell": 30 SWE-agent programs at 0.1 programs/s on the
memory-pressure engine), overridable with $PDLAB_EVAL_CELL (a cell name or a JSON object
of SimConfig fields); the seed policy per axis is `cluster.sweep.EVAL_SEEDS` ($PDLAB_EVAL_SEED).
"""

from cluster.sweep import evaluate

__all__ = ["evaluate"]

"""bench_precision: bfloat16 parameters lose small perturbations and updates to rounding."""

from agentic_esopt import models
from experiments import bench_precision


def test_bfloat16_rounds_away_what_float32_keeps():
    float32 = bench_precision.measure(models.load("tiny"), 1e-3, 5e-4, 4)
    bfloat16 = bench_precision.measure(models.load("tiny", "bfloat16"), 1e-3, 5e-4, 4)
    assert float32["perturbed_fraction"] == {"matrices": 1.0, "vectors": 1.0}
    assert float32["update_error"] < 1e-6
    # Matrices (|θ| ~ 0.02) mostly take σε = 1e-3·ε; norm scales (θ = 1) almost never do.
    assert bfloat16["perturbed_fraction"]["matrices"] > 0.9
    assert bfloat16["perturbed_fraction"]["vectors"] < 0.1
    assert bfloat16["updated_fraction"]["vectors"] == 0.0 and bfloat16["update_error"] > 0.05
    # Stochastic rounding moves some norm scales (unbiased) where nearest moves none.
    assert bfloat16["updated_fraction_stochastic"]["vectors"] > 0.0
    assert (bfloat16["updated_fraction_stochastic"]["matrices"]
            > bfloat16["updated_fraction"]["matrices"])
    # Low-rank members add σ(xA)Bᵀ inside each linear: nothing rounds into the weights.
    assert abs(bfloat16["logit_change_lowrank"] / float32["logit_change_lowrank"] - 1) < 0.1

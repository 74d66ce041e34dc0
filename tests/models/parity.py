"""Helpers shared by the model parity tests: left-padded batches, torch reference logits,
and the check that population rows equal forwards on each member's perturbed params."""

import numpy as np
import torch

from agentic_esopt import es, models


def left_padded_batch(vocab=259, length=40, seed=0):
    """(ids, mask) of 3 rows: one full, one with 11 pads, one with all but 3 padded."""
    ids = np.random.RandomState(seed).randint(3, vocab, (3, length))
    mask = np.ones_like(ids)
    mask[1, :11] = 0
    mask[2, :length - 3] = 0
    return ids, mask


def torch_logits(model, ids, mask):
    """A transformers model's float32 logits with left-padding-aware positions."""
    positions = np.maximum(mask.cumsum(-1) - 1, 0)
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(positions)).logits.float().numpy()


def assert_population_rows_equal_member_forwards(config, params, population, members, ids,
                                                 mask):
    """Batched population logits equal each member's own forward, on real tokens; the
    perturbation visibly changes the logits, so the comparison is meaningful. (Each
    member's forward runs the whole batch, the plain forward's compiled shape.)"""
    batched = np.asarray(models.logits(config, params, ids, mask, population, members))
    plain = np.asarray(models.logits(config, params, ids, mask))
    real = mask.astype(bool)
    for row, member in enumerate(members):
        member_params = es.noise.perturb(params, population, member)
        expected = np.asarray(models.logits(config, member_params, ids, mask))[row]
        np.testing.assert_allclose(batched[row][real[row]], expected[real[row]], atol=1e-4,
                                   rtol=0)
        assert np.abs(expected - plain[row])[real[row]].max() > 1e-2

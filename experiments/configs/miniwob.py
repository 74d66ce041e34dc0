"""ES on MiniWoB++ in a real browser, on CPU with SmolLM2-135M (the README's web run).

Shaped so that the small model gets signal: one-action click pages, a short page tree,
at most 2 replies, only the latest observation in the prompt, and the reply opened with
"click('" so that the model only has to pick an element id.
"""

from experiments.configs import common

PAGES = ("click-test", "click-test-2", "click-button", "click-link")


def get_config():
    return common.base_config(
        "miniwob",
        env=dict(tasks=PAGES, train_instances=200, max_turns=2, observation_tokens=250,
                 browsers=4, timeout_ms=2000),
        model=dict(name="smollm2-135m", dtype="float32"),
        es=dict(population_size=8, noise="lowrank", rank=1, antithetic=True,
                sigma_schedule="cosine", sigma_start=4e-3, sigma_end=2e-3,
                learning_rate=2e-3, optimizer="sgd", fitness="zscore", scope="full"),
        rollout=dict(tasks_per_generation=4, max_turns=2, max_new_tokens=6, temperature=0.7,
                     history_turns=0, reply_prefix="click('", stop_at_newline=True),
        eval=dict(split="eval", size=32, temperature=0.7),
        run=dict(seed=0, generations=8, eval_every=8, checkpoint_every=1))

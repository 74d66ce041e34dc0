"""End-of-run reports from metrics records: the reward-curve PNG and the summary table."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from agentic_esopt.fileio import atomic_write_text  # pylint: disable=wrong-import-position

# (summary key, label, per-episode key of eval records)
COMPARED = (("mean_reward", "mean reward", "episode_rewards"),
            ("success_rate", "success rate", "episode_solved"))


def _of_kind(records: Sequence[dict], kind: str) -> list[dict]:
    return sorted((r for r in records if r["kind"] == kind), key=lambda r: r["generation"])


def plot_reward_curve(records: Sequence[dict], path: str) -> None:
    """Train mean/max reward per generation and held-out eval (± s.e.) to a PNG."""
    train, evals = _of_kind(records, "train"), _of_kind(records, "eval")
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    generations = [r["generation"] for r in train]
    left.plot(generations, [r["reward_mean"] for r in train], label="population mean")
    left.plot(generations, [r["reward_max"] for r in train], label="population max")
    left.set(title="Training reward", xlabel="generation", ylabel="reward")
    left.legend()
    evals = [r for r in evals if _is_episode_eval(r)]
    eval_generations = [r["generation"] for r in evals]
    for key, label, _ in COMPARED if evals else ():
        right.errorbar(eval_generations, [r[key] for r in evals],
                       yerr=[r[f"{key}_se"] for r in evals], capsize=3, marker="o",
                       label=label)
    right.set(title="Held-out evaluation (± s.e.)", xlabel="generations completed")
    if evals:
        right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _ratio(difference: float, se: float) -> float | None:
    if se > 0:
        return difference / se
    return 0.0 if difference == 0 else None  # No spread: only "no change" has a ratio.


def _paired_se(initial: dict, final: dict, episodes_key: str) -> float | None:
    """s.e. of the mean per-episode difference, when both evaluations played the same
    tasks in the same order (else None)."""
    tasks = initial.get("episode_task_ids")
    if tasks is None or tasks != final.get("episode_task_ids"):
        return None
    differences = np.subtract(final[episodes_key], initial[episodes_key])
    if differences.size < 2:
        return None
    return float(differences.std(ddof=1) / math.sqrt(differences.size))


def _comparison(initial: dict, final: dict, key: str, episodes_key: str) -> dict:
    difference = final[key] - initial[key]
    pooled_se = math.hypot(initial[f"{key}_se"], final[f"{key}_se"])
    paired_se = _paired_se(initial, final, episodes_key)
    return dict(initial=initial[key], initial_se=initial[f"{key}_se"], final=final[key],
                final_se=final[f"{key}_se"], difference=difference,
                difference_in_se=_ratio(difference, pooled_se), paired_se=paired_se,
                difference_in_paired_se=(None if paired_se is None
                                         else _ratio(difference, paired_se)))


def compare(before: dict, after: dict) -> dict:
    """Two episode evaluations' mean reward and success rate: each difference and its
    ratio to the pooled and (same tasks in the same order) the paired s.e."""
    return {key: _comparison(before, after, key, episodes) for key, _, episodes in COMPARED}


def _is_episode_eval(record: dict) -> bool:
    return "mean_reward" in record


def rollout_totals(train: Sequence[dict]) -> dict | None:
    """The training rollouts' environment steps and seconds summed over generations, with
    steps per second and the model's share of the time (None without timed rollouts)."""
    timed = [r for r in train if "rollout_s" in r]
    if not timed:
        return None
    steps, seconds = (sum(r[k] for r in timed) for k in ("env_steps", "rollout_s"))
    policy_s = sum(r["policy_s"] for r in timed)
    return dict(env_steps=steps, rollout_s=seconds, policy_s=policy_s,
                steps_per_s=steps / seconds if seconds else None,
                policy_share=policy_s / seconds if seconds else None)


def summarize(records: Sequence[dict]) -> dict:
    """Initial vs final held-out evaluation, the difference in s.e. units, and wall time.

    The difference is divided by the pooled s.e. √(se_initial² + se_final²) and, when both
    evaluations played the same tasks (as ``evaluation.evaluate`` does, with the same
    sampling key), by the paired s.e. of the per-episode differences. A ratio is None
    when its s.e. is 0 and the values differ. Evaluations of other reward sources (a
    heuristic search) are reported as their final record.
    """
    train, evals = _of_kind(records, "train"), _of_kind(records, "eval")
    if not evals:
        raise ValueError("no evaluation records to summarise")
    initial, final = evals[0], evals[-1]
    if not _is_episode_eval(final):
        return dict(generations=len(train), final_generation=final["generation"],
                    final_eval={k: v for k, v in final.items() if k not in ("kind",)},
                    wall_time_s=sum(r["wall_time_s"] for r in records))
    return dict(
        generations=len(train), initial_generation=initial["generation"],
        final_generation=final["generation"], eval_episodes=final["num_episodes"],
        **compare(initial, final),
        train_reward_mean_first=train[0]["reward_mean"] if train else None,
        train_reward_mean_last=train[-1]["reward_mean"] if train else None,
        rollouts=rollout_totals(train), wall_time_s=sum(r["wall_time_s"] for r in records))


def _format_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def summary_markdown(summary: dict) -> str:
    """The summary as a markdown table."""
    if "final_eval" in summary:
        rows = [f"| {k} | {v} |" for k, v in summary["final_eval"].items()]
        return "\n".join([f"Final evaluation after {summary['final_generation']} "
                          "generations:", "", "| metric | value |", "|---|---|", *rows,
                          "", f"wall time {summary['wall_time_s']:.1f} s."]) + "\n"
    lines = [
        f"| metric | initial (gen {summary['initial_generation']}) | final (gen "
        f"{summary['final_generation']}) | difference | difference / s.e. | "
        "difference / paired s.e. |",
        "|---|---|---|---|---|---|",
    ]
    for key, label, _ in COMPARED:
        c = summary[key]
        lines.append(f"| {label} | {c['initial']:.4f} ± {c['initial_se']:.4f} | "
                     f"{c['final']:.4f} ± {c['final_se']:.4f} | {c['difference']:+.4f} | "
                     f"{_format_ratio(c['difference_in_se'])} | "
                     f"{_format_ratio(c['difference_in_paired_se'])} |")
    lines.append("")
    lines.append(f"{summary['generations']} generations, {summary['eval_episodes']} held-out "
                 f"episodes per evaluation, wall time {summary['wall_time_s']:.1f} s.")
    rollouts = summary.get("rollouts")
    if rollouts and rollouts["rollout_s"]:
        lines.append(f"Training rollouts: {rollouts['env_steps']:.0f} environment steps in "
                     f"{rollouts['rollout_s']:.1f} s ({rollouts['steps_per_s']:.2f} steps/s), "
                     f"{rollouts['policy_share']:.0%} of it in the model's calls, the rest in "
                     "the environments.")
    return "\n".join(lines) + "\n"


def write_summary(summary: dict, json_path: str, markdown_path: str) -> str:
    """Writes summary.json and summary.md; returns the markdown."""
    markdown = summary_markdown(summary)
    atomic_write_text(json_path, json.dumps(summary, indent=2) + "\n")
    atomic_write_text(markdown_path, markdown)
    return markdown

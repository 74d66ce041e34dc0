"""Metrics files, standard errors, the summary table and the reward-curve PNG."""

import glob
import json
import math

import numpy as np
import pytest

from agentic_esopt.agents import Trajectory, sources
from agentic_esopt.training import metrics, report


def _eval(generation, mean, mean_se, success, success_se, wall=1.0):
    return dict(kind="eval", generation=generation, num_episodes=8, mean_reward=mean,
                mean_reward_se=mean_se, success_rate=success, success_rate_se=success_se,
                mean_turns=2.0, wall_time_s=wall)


def _train(generation, mean, wall=2.0):
    return dict(kind="train", generation=generation, reward_mean=mean, reward_max=mean + 0.1,
                wall_time_s=wall)


RECORDS = [_eval(0, 0.2, 0.03, 0.1, 0.04), _train(0, 0.3), _train(1, 0.4),
           _eval(2, 0.5, 0.04, 0.25, 0.0)]


def test_mean_and_standard_error():
    mean, se = sources.mean_and_standard_error([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and se == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    assert sources.mean_and_standard_error([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError):
        sources.mean_and_standard_error([])


def test_episode_statistics():
    def episode(reward, solved):
        return Trajectory(member=0, task_id="t", generation=0, messages=[], actions=["a"],
                          rewards=[reward], total_reward=reward, num_turns=1, solved=solved,
                          info={})

    stats = sources.episode_statistics([episode(1.0, True), episode(0.0, False)])
    assert stats["num_episodes"] == 2 and stats["success_rate"] == 0.5
    assert stats["mean_reward"] == 0.5 and stats["success_rate_se"] == pytest.approx(0.5)


def test_summary_compares_first_and_last_evaluation_in_standard_errors():
    summary = report.summarize(RECORDS)
    reward = summary["mean_reward"]
    assert reward["initial"] == 0.2 and reward["final"] == 0.5
    assert reward["difference"] == pytest.approx(0.3)
    assert reward["difference_in_se"] == pytest.approx(0.3 / math.hypot(0.03, 0.04))
    assert summary["success_rate"]["difference_in_se"] == pytest.approx(0.15 / 0.04)
    assert summary["generations"] == 2 and summary["final_generation"] == 2
    assert summary["wall_time_s"] == pytest.approx(6.0)
    assert summary["train_reward_mean_last"] == 0.4


def test_summary_totals_the_timed_rollouts():
    timed = [dict(_train(g, 0.3), env_steps=steps, rollout_s=seconds, policy_s=model_s)
             for g, steps, seconds, model_s in ((0, 30.0, 10.0, 8.0), (1, 20.0, 10.0, 9.0))]
    summary = report.summarize([RECORDS[0], *timed, RECORDS[-1]])
    assert summary["rollouts"] == dict(env_steps=50.0, rollout_s=20.0, policy_s=17.0,
                                       steps_per_s=2.5, policy_share=0.85)
    assert ("50 environment steps in 20.0 s (2.50 steps/s), 85% of it in the model's calls"
            in report.summary_markdown(summary))
    assert report.summarize(RECORDS)["rollouts"] is None  # records without timings


def _eval_of(generation, task_ids, rewards, solved):
    statistics = sources.episode_statistics([
        Trajectory(member=0, task_id=t, generation=generation, messages=[], actions=["a"],
                   rewards=[r], total_reward=r, num_turns=1, solved=s, info={})
        for t, r, s in zip(task_ids, rewards, solved)])
    return dict(kind="eval", generation=generation, wall_time_s=1.0, **statistics)


def test_summary_pairs_evaluations_of_the_same_tasks():
    before = _eval_of(0, ["a", "b", "c", "d"], [0.0, 0.5, 0.5, 1.0], [0, 0, 0, 1])
    after = _eval_of(3, ["a", "b", "c", "d"], [0.5, 1.0, 0.5, 1.0], [0, 1, 0, 1])
    reward = report.summarize([before, after])["mean_reward"]
    differences = np.array([0.5, 0.5, 0.0, 0.0])
    assert reward["difference"] == pytest.approx(differences.mean())
    assert reward["paired_se"] == pytest.approx(differences.std(ddof=1) / 2)
    assert reward["difference_in_paired_se"] == pytest.approx(
        differences.mean() / (differences.std(ddof=1) / 2))
    success = report.summarize([before, after])["success_rate"]
    assert success["difference_in_paired_se"] == pytest.approx(0.25 / 0.25)
    other_tasks = _eval_of(3, ["a", "b", "c", "e"], [0.5, 1.0, 0.5, 1.0], [0, 1, 0, 1])
    unpaired = report.summarize([before, other_tasks])["mean_reward"]
    assert unpaired["paired_se"] is None and unpaired["difference_in_paired_se"] is None
    assert unpaired["difference_in_se"] == pytest.approx(reward["difference_in_se"])


def test_summary_without_spread():
    same = [_eval(0, 0.0, 0.0, 0.0, 0.0), _eval(1, 0.0, 0.0, 1.0, 0.0)]
    summary = report.summarize(same)
    assert summary["mean_reward"]["difference_in_se"] == 0.0
    assert summary["success_rate"]["difference_in_se"] is None
    assert "| success rate | 0.0000 ± 0.0000 | 1.0000 ± 0.0000 | +1.0000 | n/a | n/a |" in (
        report.summary_markdown(summary))
    with pytest.raises(ValueError, match="no evaluation records"):
        report.summarize([_train(0, 1.0)])


def test_write_summary_and_plot(tmp_path):
    summary = report.summarize(RECORDS)
    markdown = report.write_summary(summary, tmp_path / "s.json", tmp_path / "s.md")
    assert ("| mean reward | 0.2000 ± 0.0300 | 0.5000 ± 0.0400 | +0.3000 | +6.00 | n/a |"
            in markdown)
    assert json.loads((tmp_path / "s.json").read_text()) == summary
    assert (tmp_path / "s.md").read_text() == markdown
    report.plot_reward_curve(RECORDS, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_logger_trim_and_truncated_lines(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    logger = metrics.MetricsLogger(path, str(tmp_path / "tb"))
    for record in RECORDS:
        logger.log(record["kind"], record["generation"],
                   {k: v for k, v in record.items() if k not in ("kind", "generation")})
    logger.close()
    assert metrics.read_metrics(path) == RECORDS
    events = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert len(events) == 1 and b"train/reward_mean" in open(events[0], "rb").read()
    with open(path, "a") as f:
        f.write('{"kind": "train", "generat')  # A write cut by a crash.
    assert metrics.read_metrics(path) == RECORDS
    metrics.trim_metrics(path, 2)
    assert metrics.read_metrics(path) == RECORDS[:3]
    assert open(path).read().endswith("}\n")
    with pytest.raises(ValueError, match="unknown metrics kind"):
        metrics.MetricsLogger(path, str(tmp_path / "tb")).log("test", 0, {})

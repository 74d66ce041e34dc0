"""EoH / Sample heuristic search: prompts, extraction, rewards, selection, steps, resume."""

import ast
import dataclasses
import json
import math
import zlib
from typing import NamedTuple

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from agentic_esopt.agents import ahd_prompts
from agentic_esopt.agents import eoh
from agentic_esopt import envs
from agentic_esopt.envs.ahd import tasks


@dataclasses.dataclass(frozen=True)
class SquareTask:
    """Approximate x**2 on [0, 1]: objective = mean squared error (minimise)."""

    description: str = "Approximate the square function on the unit interval."
    function_name: str = "priority"
    minimise: bool = True

    def interface(self):
        return 'def priority(x: float) -> float:\n    """Estimates x squared, x in [0, 1]."""\n'


TASK = SquareTask()
GRID = np.linspace(0.0, 1.0, 11)


def reply(idea, body):
    return f"{{{idea}}}\n```python\ndef priority(x):\n    return {body}\n```"


INIT_REPLIES = [reply("zero", "0.0"), "I cannot help with that.", reply("linear", "x"),
                reply("nan", "float('nan')"), reply("half", "0.5 * x"),
                "```python\ndef priority(x)\n    return x\n```", reply("constant", "0.3")]
EVOLVED_REPLIES = [reply("square", "x * x"), reply("near square", "x * x + 0.01"),
                   reply("cube", "x ** 3"), reply("blend", "0.5 * x + 0.5 * x * x"),
                   "```python\ndef other(x, y):\n    return x\ndef another(x):\n    return y\n```",
                   reply("mid", "0.8 * x * x")]


def fake_llm(calls, init_replies=tuple(INIT_REPLIES), evolved_replies=tuple(EVOLVED_REPLIES)):
    """A deterministic, stateless LLM: each reply depends on its prompt and batch position.

    ``i1`` prompts are all alike, so position j answers ``init_replies[j]``; others pick
    from ``evolved_replies`` by a hash of position and prompt.
    """

    def llm(prompts, members):
        calls.append((list(prompts), list(members)))
        replies = []
        for j, prompt in enumerate(prompts):
            if "Design a new heuristic for this" in prompt:
                replies.append(init_replies[j % len(init_replies)])
            else:
                index = zlib.crc32(f"{j}:{prompt}".encode()) % len(evolved_replies)
                replies.append(evolved_replies[index])
        return replies

    return llm


class Scored(NamedTuple):
    valid: bool
    objective: float | None
    error: str | None


def square_error(code):
    namespace = {}
    exec(code, namespace)  # pylint: disable=exec-used
    return float(np.mean([(namespace["priority"](x) - x * x) ** 2 for x in GRID]))


def in_process_evaluator(evaluated):
    def evaluate(codes):
        evaluated.extend(codes)
        results = []
        for code in codes:
            objective = square_error(code)
            ok = math.isfinite(objective)
            results.append(Scored(ok, objective if ok else None, None if ok else "not finite"))
        return results

    return evaluate


def individual(call_index, objective, valid=True, **fields):
    return eoh.Individual(description=f"idea {call_index}", code=f"# {call_index}\n",
                          objective=objective, valid=valid, operator="i1", parents=(),
                          member=0, generation=0, call_index=call_index, **fields)


# ---------------------------------------------------------------- prompts


def test_prompt_shows_the_interface_and_the_parents():
    parents = [individual(3, 0.25), individual(7, 0.125)]
    prompt = ahd_prompts.build_prompt("e2", TASK, parents)
    for text in (TASK.description, TASK.interface(), "lower is better",
                 "idea 3", "idea 7", "# 3", "# 7", "0.25", "0.125", "{...}", "```python",
                 "`priority`", "common"):
        assert text in prompt, text
    maximise = ahd_prompts.build_prompt("i1", dataclasses.replace(TASK, minimise=False), [])
    assert "higher is better" in maximise and "Heuristic 1" not in maximise


def test_each_operator_asks_for_something_different():
    parent = [individual(0, 1.0)]
    prompts = {op: ahd_prompts.build_prompt(op, TASK, [] if op == "i1" else parent)
               for op in ahd_prompts.OPERATORS}
    assert len(set(prompts.values())) == len(ahd_prompts.OPERATORS)
    assert "different" in prompts["e1"] and "parameters" in prompts["m2"]


@pytest.mark.parametrize("operator, parents, message", [
    ("i1", 1, "takes 0"), ("m1", 2, "takes 1"), ("m2", 0, "takes 1"), ("e1", 0, "takes 1"),
    ("x9", 0, "unknown operator")])
def test_prompt_rejects_wrong_parent_counts(operator, parents, message):
    with pytest.raises(ValueError, match=message):
        ahd_prompts.build_prompt(operator, TASK, [individual(i, 1.0) for i in range(parents)])


# ---------------------------------------------------------------- extraction


def run_extracted(candidate, x=0.5):
    namespace = {}
    exec(candidate.code, namespace)  # pylint: disable=exec-used
    return namespace["priority"](x)


def test_extracts_idea_and_code_and_ignores_trailing_prose():
    text = ("Sure! {Use the square directly.}\n```python\nimport math\n\n"
            "def priority(x):\n    return {'v': x * x}['v']\n```\nHope this helps {really}.")
    candidate = ahd_prompts.extract_candidate(text, "priority")
    assert candidate.description == "Use the square directly."
    assert run_extracted(candidate) == 0.25


def test_picks_the_block_that_defines_the_function():
    text = ("{Squares.}\n```python\ndef priority(x):\n    return x * x\n```\nUsage:\n"
            "```python\nprint(priority(2))\n```\n")
    assert run_extracted(ahd_prompts.extract_candidate(text, "priority")) == 0.25


def test_unfenced_code_is_cut_before_trailing_prose():
    text = ("Idea: square it.\nimport math\ndef priority(x):\n    return math.pow(x, 2)\n"
            "This is optimal because squares are squares.\nDone")
    candidate = ahd_prompts.extract_candidate(text, "priority")
    assert candidate.description == "Idea: square it."
    assert run_extracted(candidate) == 0.25
    assert "Done" not in candidate.code


def test_unterminated_fence_runs_to_the_end():
    text = "{cut off}\n```python\ndef priority(x):\n    return x * x\n"
    assert run_extracted(ahd_prompts.extract_candidate(text, "priority")) == 0.25


def test_a_single_wrongly_named_function_is_aliased():
    text = "{renamed}\n```python\ndef square_priority(x):\n    return x * x\n```"
    candidate = ahd_prompts.extract_candidate(text, "priority")
    assert "priority = square_priority" in candidate.code
    assert run_extracted(candidate) == 0.25


@pytest.mark.parametrize("text, reason", [
    ("I would sort the nodes by distance.", "no code"),
    ("```python\ndef helper(x):\n    return x\ndef other(x):\n    return x\n```",
     "no function named 'priority' (found: ['helper', 'other'])"),
    ("```python\ndef priority(x)\n    return x\n```", "does not parse"),
    ("```python\nvalue = 3\n```", "no function named"),
    (None, "not text"),
])
def test_extraction_failures_have_reasons(text, reason):
    failure = ahd_prompts.extract_candidate(text, "priority")
    assert isinstance(failure, ahd_prompts.ExtractionFailure)
    assert reason in failure.reason


FRAGMENTS = ["```python\n", "```", "\n", "def priority(x):\n", "    return x\n", "{idea}",
             "def other(y):\n", "import numpy as np\n", "@decorator\n", "(((", "\0", "}{",
             "from a import b\n", "    ", "print(1)\n", "Done"]


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=20)),
                           max_size=12).map("".join))
def test_extraction_never_raises_and_returns_parsable_code(text):
    result = ahd_prompts.extract_candidate(text, "priority")
    if isinstance(result, ahd_prompts.Candidate):
        names = [node.name for node in ast.parse(result.code).body
                 if hasattr(node, "name")]
        assert "priority" in names or "priority = " in result.code
    else:
        assert isinstance(result, ahd_prompts.ExtractionFailure) and result.reason


# ---------------------------------------------------------------- rewards, selection


@pytest.mark.parametrize("child, parent, worst, minimise, expected", [
    (2.0, 3.0, 5.0, True, 1.0),       # improvement P - C
    (4.0, 3.0, 5.0, True, -1.0),      # worse than parent, better than worst: P - C
    (6.0, 3.0, 5.0, True, -1.0),      # worse than worst: max(P - W, -1) = max(-2, -1)
    (6.0, 3.0, 3.5, True, -0.5),      # worse than worst: max(-0.5, -1)
    (None, 3.0, 3.5, True, -0.5),     # invalid: same clip
    (None, 3.0, 3.0, True, 0.0),      # parent is the worst: clip is 0
    (4.0, 3.0, 1.0, False, 1.0),      # maximising: C - P
    (0.5, 3.0, 1.0, False, -1.0),     # maximising, worse than worst: max(-(3 - 1), -1)
    (None, 3.0, 2.8, False, -0.2),
])
def test_eoh_es_reward(child, parent, worst, minimise, expected):
    assert eoh.eoh_es_reward(child, parent, worst, minimise) == pytest.approx(expected)


def test_sample_es_rewards():
    rewards = eoh.sample_es_rewards([1.0, None, 3.0], minimise=True)
    assert rewards == pytest.approx([-1.0, -3.0 - 1.0, -3.0])  # std([-1, -3]) = 1
    assert eoh.sample_es_rewards([1.0, None, 3.0], minimise=False) == pytest.approx(
        [1.0, 1.0 - 1.0, 3.0])
    assert eoh.sample_es_rewards([None, None], minimise=True) == [eoh.NO_VALID_REWARD] * 2
    assert eoh.sample_es_rewards([2.0, None], minimise=True) == [-2.0, -2.0]


def test_select_survivors_keeps_the_best_distinct_objectives():
    pool = [individual(0, 3.0), individual(1, 1.0), individual(2, 1.0),
            individual(3, None, valid=False), individual(4, 2.0), individual(5, 0.5)]
    assert [i.call_index for i in eoh.select_survivors(pool, 3, True)] == [5, 1, 4]
    assert [i.call_index for i in eoh.select_survivors(pool, 2, False)] == [0, 4]


def test_select_parents_is_distinct_seeded_and_rank_weighted():
    population = [individual(i, float(i)) for i in range(4)]
    first, again = (eoh.select_parents(population, 2, np.random.default_rng(1))
                    for _ in range(2))
    assert first == again and len({p.call_index for p in first}) == 2
    rng = np.random.default_rng(0)
    counts = np.bincount([eoh.select_parents(population, 1, rng)[0].call_index
                          for _ in range(2000)], minlength=4)
    assert counts[0] > counts[1] > counts[2] > counts[3]
    with pytest.raises(ValueError, match="cannot select 5"):
        eoh.select_parents(population, 5, rng)


# ---------------------------------------------------------------- searches


def search(llm, evaluate, task, config, run_dir=None, *, seed=0, state=None, cache=None,
           on_batch=None):
    """Steps a search until its budget, as the trainer does (one batch a generation).

    Returns:
      (the final state, every batch).
    """
    state = eoh.initial_state(seed) if state is None else state
    cache = {} if cache is None else cache
    batches = []
    while state.call_count < config.budget:
        state, batch = eoh.step(state, cache, llm, evaluate, task, config, run_dir)
        batches.append(batch)
        if on_batch is not None:
            on_batch(batch, state)
    return state, batches


def test_tiny_eoh_search_improves_and_respects_the_budget(tmp_path):
    calls = []
    config = eoh.EoHConfig(population_size=3, budget=23, offspring_per_operator=2,
                           num_members=7)
    state, batches = search(fake_llm(calls), in_process_evaluator([]), TASK, config,
                            str(tmp_path))
    prompts_sent = sum(len(prompts) for prompts, _ in calls)
    assert prompts_sent == state.call_count == config.budget
    assert all(members == [j % 7 for j in range(len(members))] for _, members in calls)
    assert [len(prompts) for prompts, _ in calls] == [7, 8, 8]
    records = [json.loads(line) for line in open(tmp_path / eoh.PROGRAMS_FILE)]
    assert [r["call_index"] for r in records] == list(range(config.budget))
    assert any(not r["valid"] and "extraction failed" in r["error"] for r in records)
    assert any(not r["valid"] and r["error"] == "not finite" for r in records)
    initial = [r["objective"] for r in records if r["generation"] == 0 and r["valid"]]
    assert state.population[0].objective < min(initial)
    assert state.population[0].objective == 0.0  # found x * x
    assert len(state.population) == 3 and state.generation >= 2
    for batch in batches:
        assert len(batch.offspring) == len(batch.rewards)
        if batch.offspring[0].operator != "i1":
            assert all(-1.0 <= r for r in batch.rewards if r < 0)
            parents = {p for child in batch.offspring for p in child.parents}
            assert parents and all(p < batch.offspring[0].call_index for p in parents)


def tsp_reply(idea, body):
    return (f"{{{idea}}}\n```python\nimport numpy as np\n\n"
            f"def select_next_node(current_node, destination_node, unvisited_nodes, "
            f"distance_matrix):\n    row = distance_matrix[current_node, unvisited_nodes]\n"
            f"    return {body}\n```")


def test_tiny_eoh_search_in_the_sandbox_on_a_registry_task():
    task = tasks.TASKS["tsp_constructive"]
    init = (tsp_reply("first", "int(unvisited_nodes[0])"), "no idea, sorry",
            tsp_reply("farthest", "int(unvisited_nodes[np.argmax(row)])"))
    evolved = (tsp_reply("nearest", "int(unvisited_nodes[np.argmin(row)])"),
               tsp_reply("stay", "current_node"),  # illegal: already visited
               tsp_reply("last", "int(unvisited_nodes[-1])"))
    calls = []
    config = eoh.EoHConfig(population_size=2, budget=11, num_members=3)
    with envs.make("ahd", task="tsp_constructive", size=8, train_size=2,
                   timeout_s=60.0) as source:
        state, batches = search(fake_llm(calls, init, evolved), source.evaluate, task,
                                config)
    assert sum(len(prompts) for prompts, _ in calls) == state.call_count == 11
    nearest = task.baseline(task.generate_instances(8, 2, 0))
    initial = [c.objective for c in batches[0].offspring if c.valid]
    assert len(initial) == 2 and min(initial) > nearest
    assert state.population[0].objective == nearest
    assert state.population[0].description == "nearest"


def test_resume_from_a_checkpoint_after_a_crash_matches_an_uninterrupted_search(tmp_path):
    config = eoh.EoHConfig(population_size=3, budget=27)
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "crashed"
    straight_dir.mkdir()
    run_dir.mkdir()
    straight_evaluated = []
    straight, _ = search(fake_llm([]), in_process_evaluator(straight_evaluated), TASK,
                         config, str(straight_dir), seed=3)

    evaluated = []
    state, cache, evolution_batches = eoh.initial_state(3), {}, 0
    while evolution_batches < 2:  # a crash after the second evolution batch is logged
        checkpoint = json.dumps(eoh.state_to_json(state))  # after every completed batch
        state, batch = eoh.step(state, cache, fake_llm([]), in_process_evaluator(evaluated),
                                TASK, config, str(run_dir))
        evolution_batches += batch.offspring[0].operator != "i1"
    before_resume = len(evaluated)
    restored = eoh.state_from_json(json.loads(checkpoint))
    resumed, _ = search(fake_llm([]), in_process_evaluator(evaluated), TASK, config,
                        str(run_dir), state=restored,
                        cache=eoh.restore_log(str(run_dir), restored.call_count))
    assert resumed == straight
    assert len(evaluated) == len(set(evaluated))  # no program evaluated twice
    assert sorted(evaluated) == sorted(straight_evaluated)
    crashed_codes = {child.code for child in batch.offspring if child.code}
    assert crashed_codes and crashed_codes <= set(evaluated[:before_resume])
    logs = [open(d / eoh.PROGRAMS_FILE).read() for d in (straight_dir, run_dir)]
    assert logs[0] == logs[1]


def test_a_restored_search_continues_under_a_larger_budget(tmp_path):
    config = eoh.EoHConfig(population_size=2, budget=6)
    first, _ = search(fake_llm([]), in_process_evaluator([]), TASK, config, str(tmp_path))
    restored = eoh.state_from_json(json.loads(json.dumps(eoh.state_to_json(first))))
    assert restored == first and first.call_count == 6
    longer, _ = search(fake_llm([]), in_process_evaluator([]), TASK,
                       dataclasses.replace(config, budget=10), str(tmp_path), state=restored,
                       cache=eoh.restore_log(str(tmp_path), restored.call_count))
    assert longer.call_count == 10
    records = [json.loads(line) for line in open(tmp_path / eoh.PROGRAMS_FILE)]
    assert [r["call_index"] for r in records] == list(range(10))


def test_sample_keeps_the_best_and_rewards_batches_like_sample_es():
    calls = []
    config = eoh.SampleConfig(budget=10, batch_size=4, num_members=4)
    state, batches = search(fake_llm(calls), in_process_evaluator([]), TASK, config)
    assert [len(prompts) for prompts, _ in calls] == [4, 4, 2]
    offspring = [child for batch in batches for child in batch.offspring]
    best = min(c.objective for c in offspring if c.valid)
    assert state.population == (min((c for c in offspring if c.valid),
                                    key=lambda c: (c.objective, c.call_index)),)
    assert state.population[0].objective == best
    for batch in batches:
        objectives = [c.objective if c.valid else None for c in batch.offspring]
        assert list(batch.rewards) == eoh.sample_es_rewards(objectives, True)


@pytest.mark.parametrize("make, message", [
    (lambda: eoh.EoHConfig(operators=("i1", "e1")), "operators"),
    (lambda: eoh.EoHConfig(population_size=0), "population_size"),
    (lambda: eoh.EoHConfig(num_members=0), "num_members >= 1"),
    (lambda: eoh.SampleConfig(budget=-1), "budget >= 0"),
    (lambda: eoh.SampleConfig(batch_size=0), "batch_size"),
])
def test_bad_configs_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def claims_nan(codes):
    return [Scored(True, float("nan"), None) for _ in codes]


def test_misbehaving_llm_or_evaluator_is_caught():
    config = eoh.SampleConfig(budget=1)
    state, batch = eoh.step(eoh.initial_state(0), {}, fake_llm([]), claims_nan, TASK, config)
    assert state.population == ()
    assert "evaluator gave objective nan" in batch.offspring[0].error
    with pytest.raises(ValueError, match="llm returned 0 replies for 1 prompts"):
        eoh.step(eoh.initial_state(0), {}, lambda prompts, members: [], claims_nan, TASK,
                 config)
    with pytest.raises(ValueError, match="evaluate returned 0 results"):
        eoh.step(eoh.initial_state(0), {}, fake_llm([]), lambda codes: [], TASK, config)

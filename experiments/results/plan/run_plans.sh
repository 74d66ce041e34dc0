#!/bin/bash
# The paper's settings on TPU targets; one JSON per row, most important first. A row whose
# JSON exists is skipped, so a rerun resumes.
cd "$(dirname "$0")/../../.."
OUT=experiments/results/plan
run() { # name config model target mesh rules prompt extra...
  local name=$1 cfg=$2 model=$3 target=$4 mesh=$5 rules=$6 prompt=$7; shift 7
  [ -e $OUT/$name.json ] && return
  local cmd="python -m experiments.plan --config=experiments/configs/$cfg --model=$model --target=$target --config.mesh.shape=$mesh --config.mesh.rules=$rules --prompt_tokens=$prompt $* --json"
  echo "$(date -u +%T) $name: $cmd" >&2
  timeout 2400 nice -n 10 $cmd > $OUT/$name.json.tmp 2> /tmp/plan_$name.err && python -c "
import json,sys; r=json.load(open('$OUT/$name.json.tmp')); r['command']=sys.argv[1]; json.dump(r, open('$OUT/$name.json','w'), indent=1)" "$cmd"
  rm -f $OUT/$name.json.tmp
}
S=sudoku_qwen3_5_4b.py C=countdown_es_at_scale.py W=webarena_lite.py
GRPO=--config.rule.name=grpo SAMPLED="--config.rollout.temperature=1.0" LOWRANK="--config.es.noise=lowrank --config.es.rank=1"
run sudoku_es_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024
run sudoku_es_v5p-8 $S qwen3.5-4b tpu:v5p:2x2x1 data:2,model:2 fsdp 1024
run sudoku_grpo_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:1,model:8 fsdp 1024 $GRPO
run sudoku_grpo_v5p-8 $S qwen3.5-4b tpu:v5p:2x2x1 data:2,model:2 fsdp 1024 $GRPO
run sudoku_grpo_v6e-8 $S qwen3.5-4b tpu:v6e:2x4 data:1,model:8 fsdp 1024 $GRPO
run sudoku_es_v6e-8 $S qwen3.5-4b tpu:v6e:2x4 data:2,model:4 fsdp 1024
run sudoku_es_lowrank_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024 $LOWRANK
# The fix that makes full-rank ES fit v5e-8: no kept per-member caches.
run sudoku_es_nokeep_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024 --config.rollout.keep_kv_cache=False
# GRPO's rollout plays 8 samples x 32 puzzles = 256 rows at once; in batches of a few puzzles
# (rollout.batch_size) beside a small AdamW mini-batch, with the weights over all 8 chips:
run sudoku_grpo_mb4_rb4_v6e-8 $S qwen3.5-4b tpu:v6e:2x4 data:1,model:8 fsdp 1024 $GRPO --config.rule.minibatch_size=4 --config.rollout.batch_size=4
run sudoku_grpo_mb2_rb2_nokeep_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:1,model:8 fsdp 1024 $GRPO --config.rule.minibatch_size=2 --config.rollout.batch_size=2 --config.rollout.keep_kv_cache=False
# docs/pods.md's v4-32 recipe's mesh on a v5p-32 (4 hosts x 4 chips): a multi-host slice, one process planned.
run sudoku_es_v5p-32 $S qwen3.5-4b tpu:v5p:2x2x4 data:4,model:4 fsdp 1024
run countdown_es_v5p-8 $C qwen2.5-7b tpu:v5p:2x2x1 data:2,model:2 fsdp 256
# Countdown's preset decodes greedily (temperature 0); GRPO samples its groups at 1.
run countdown_grpo_v5p-8 $C qwen2.5-7b tpu:v5p:2x2x1 data:2,model:2 fsdp 256 $GRPO $SAMPLED
run webarena_es_v5p-8 $W qwen3.5-27b tpu:v5p:2x2x1 data:1,model:4 fsdp 8192
run webarena_grpo_v5p-8 $W qwen3.5-27b tpu:v5p:2x2x1 data:1,model:4 fsdp 8192 $GRPO
run countdown_es_v6e-8 $C qwen2.5-7b tpu:v6e:2x4 data:2,model:4 fsdp 256
run countdown_grpo_v6e-8 $C qwen2.5-7b tpu:v6e:2x4 data:1,model:8 fsdp 256 $GRPO $SAMPLED
run countdown_es_v5e-8 $C qwen2.5-7b tpu:v5e:2x4 data:2,model:4 fsdp 256
run countdown_grpo_v5e-8 $C qwen2.5-7b tpu:v5e:2x4 data:1,model:8 fsdp 256 $GRPO $SAMPLED
run webarena_es_v6e-8 $W qwen3.5-27b tpu:v6e:2x4 data:1,model:8 fsdp 8192
run webarena_grpo_v6e-8 $W qwen3.5-27b tpu:v6e:2x4 data:1,model:8 fsdp 8192 $GRPO
# Fixes for rows that did not fit. Countdown ES: no kept member caches (a Countdown episode
# has one turn) and 250 held-out tasks (the preset's 2,000 in one batch need 92 GiB).
run countdown_es_nokeep_eval250_v5p-8 $C qwen2.5-7b tpu:v5p:2x2x1 data:2,model:2 fsdp 256 --config.rollout.keep_kv_cache=False --config.eval.size=250
# GRPO on 32 and 16 GiB chips: smaller AdamW mini-batches (more steps per generation).
run sudoku_grpo_mb4_v6e-8 $S qwen3.5-4b tpu:v6e:2x4 data:1,model:8 fsdp 1024 $GRPO --config.rule.minibatch_size=4
run sudoku_grpo_mb2_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:1,model:8 fsdp 1024 $GRPO --config.rule.minibatch_size=2
# Those two fix the AdamW step but leave the rollouts too large: with data:1 every chip holds
# all 32 rows' caches (4 KV heads do not split 8 ways). The rows over 2 chips instead:
run sudoku_grpo_mb4_d2_v6e-8 $S qwen3.5-4b tpu:v6e:2x4 data:2,model:4 fsdp 1024 $GRPO --config.rule.minibatch_size=4
run sudoku_grpo_mb2_d2_nokeep_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024 $GRPO --config.rule.minibatch_size=2 --config.rollout.keep_kv_cache=False
# The presets themselves with two layout flags (neither changes an episode): no kept caches
# and held-out tasks in batches (eval.batch_size).
run countdown_es_nokeep_evalbatch250_v5p-8 $C qwen2.5-7b tpu:v5p:2x2x1 data:2,model:2 fsdp 256 --config.rollout.keep_kv_cache=False --config.eval.batch_size=250
run webarena_es_nokeep_evalbatch8_v5p-8 $W qwen3.5-27b tpu:v5p:2x2x1 data:1,model:4 fsdp 8192 --config.rollout.keep_kv_cache=False --config.eval.batch_size=8
run webarena_es_nokeep_evalbatch8_v6e-8 $W qwen3.5-27b tpu:v6e:2x4 data:1,model:8 fsdp 8192 --config.rollout.keep_kv_cache=False --config.eval.batch_size=8
# Rank-1 ES plays its 32 members x 32 puzzles as one batch; in batches of 8 puzzles:
run sudoku_es_lowrank_rb8_v5e-8 $S qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024 $LOWRANK --config.rollout.batch_size=8
# WebArena-Lite ES on v6e-8: 8 tasks' 8,192-token prompts per prefill piece are refused; 2 at a time:
run webarena_es_nokeep_batch2_v6e-8 $W qwen3.5-27b tpu:v6e:2x4 data:1,model:8 fsdp 8192 --config.rollout.keep_kv_cache=False --config.rollout.batch_size=2 --config.eval.batch_size=2
# GRPO in batches: Countdown's 8 samples x 200 tasks 25 tasks at a time, WebArena-Lite's
# 8 samples x 8 tasks one task at a time, AdamW on single turns; no kept caches; held-out
# tasks in batches as ES's rows above.
run countdown_grpo_rb25_nokeep_v5p-8 $C qwen2.5-7b tpu:v5p:2x2x1 data:2,model:2 fsdp 256 $GRPO $SAMPLED --config.rollout.batch_size=25 --config.rollout.keep_kv_cache=False --config.eval.batch_size=250
run webarena_grpo_mb1_rb1_nokeep_v5p-8 $W qwen3.5-27b tpu:v5p:2x2x1 data:1,model:4 fsdp 8192 $GRPO --config.rule.minibatch_size=1 --config.rollout.batch_size=1 --config.rollout.keep_kv_cache=False --config.eval.batch_size=8

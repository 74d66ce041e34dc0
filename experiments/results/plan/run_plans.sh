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
  timeout 900 nice -n 10 $cmd > $OUT/$name.json.tmp 2> /tmp/plan_$name.err && python -c "
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

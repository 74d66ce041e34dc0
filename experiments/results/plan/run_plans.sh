#!/bin/bash
# The paper's settings on TPU targets; one JSON per row.
cd "$(dirname "$0")/../../.."
OUT=experiments/results/plan
run() { # name config model target mesh rules prompt extra...
  local name=$1 cfg=$2 model=$3 target=$4 mesh=$5 rules=$6 prompt=$7; shift 7
  local cmd="python -m experiments.plan --config=experiments/configs/$cfg --model=$model --target=$target --config.mesh.shape=$mesh --config.mesh.rules=$rules --prompt_tokens=$prompt $* --json"
  echo "$name: $cmd" >&2
  timeout 900 nice -n 10 $cmd > $OUT/$name.json.tmp 2> /tmp/plan_$name.err && python -c "
import json,sys; r=json.load(open('$OUT/$name.json.tmp')); r['command']=sys.argv[1]; json.dump(r, open('$OUT/$name.json','w'), indent=1)" "$cmd"
  rm -f $OUT/$name.json.tmp
}
run sudoku_es_v5e-8 sudoku_qwen3_5_4b.py qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024
run sudoku_grpo_v5e-8 sudoku_qwen3_5_4b.py qwen3.5-4b tpu:v5e:2x4 data:1,model:8 fsdp 1024 --config.rule.name=grpo
run sudoku_es_v5p-8 sudoku_qwen3_5_4b.py qwen3.5-4b tpu:v5p:2x2x1 data:2,model:2 fsdp 1024
run sudoku_es_lowrank_v5e-8 sudoku_qwen3_5_4b.py qwen3.5-4b tpu:v5e:2x4 data:2,model:4 fsdp 1024 --config.es.noise=lowrank --config.es.rank=1

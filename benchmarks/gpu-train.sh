#!/usr/bin/env bash
# Training speed on one GPU: lmlm bench train for the paper's presets, a 500-step LMLM run from
# shards (loaded back with AutoModelForCausalLM), and the FSDP config. Work (shards, checkpoints)
# goes to RUN (default runs/gpu-train), JSON results to RES (default: RUN). Needs the paper's
# tokenizers: TOK=folder holding gpt2/ and llama2/ (default ../shared/data/tokenizers).
set -uo pipefail
RUN=${RUN:-runs/gpu-train}; RES=${RES:-$RUN}; T=${TOK:-../shared/data/tokenizers}; mkdir -p "$RUN" "$RES"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
L="python -m lmlm.cli"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bench() { local name=$1; shift; echo "== $name"; $L bench train --device cuda --seq-len 1024 "$@" 2> "$RUN/$name.err" \
  | tail -1 | tee "$RES/$name.json" | cut -c1-700; echo; }
bench gpt2-124m-b32 --model gpt2-124m --micro-batch-size 32 --steps 40 --warmup-steps 6 --corpus-tokens 10000000 \
  --tokenizer "$T/gpt2" --work "$RUN/w-gpt2"
bench gpt2-124m-b64 --model gpt2-124m --micro-batch-size 64 --steps 30 --warmup-steps 6 --tokenizer "$T/gpt2" \
  --work "$RUN/w-gpt2"
bench llama2-382m-b16 --model llama2-382m --micro-batch-size 16 --steps 30 --warmup-steps 6 --corpus-tokens 2000000 \
  --tokenizer "$T/llama2" --work "$RUN/w-llama"
echo "== 500 steps gpt2-124m LMLM from shards"
$L train --data "$RUN/w-gpt2/shards" --model gpt2-124m --seq-len 1024 --batch-size 32 --micro-batch-size 32 \
  --max-steps 500 --warmup-steps 50 --lr 6e-4 --precision auto --log-every 25 --out "$RUN/run500" --no-progress \
  2> "$RUN/run500.err" | tail -1 | tee "$RES/run500.json"; tail -2 "$RUN/run500.err"
cp "$RUN/run500/train_log.jsonl" "$RES/run500-log.jsonl"
python -c "from transformers import AutoModelForCausalLM as A; m = A.from_pretrained('$RUN/run500/checkpoint'); \
print('run500 checkpoint loads:', type(m).__name__, m.config.vocab_size)"
echo "== FSDP (configs/accelerate/fsdp.yaml, 1 process)"
accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 1 -m lmlm.train \
  --data "$RUN/w-gpt2/shards" --model gpt2-124m --seq-len 1024 --batch-size 32 --micro-batch-size 32 \
  --max-steps 30 --log-every 10 --out "$RUN/fsdp" --no-progress 2> "$RUN/fsdp.err" | tail -1 | tee "$RES/fsdp.json"
grep -E "Error" "$RUN/fsdp.err" | head -5
python -c "from transformers import AutoModelForCausalLM as A; m = A.from_pretrained('$RUN/fsdp/checkpoint'); \
print('fsdp checkpoint loads:', type(m).__name__, m.config.vocab_size)"

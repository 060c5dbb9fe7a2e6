#!/usr/bin/env bash
# CLI test: `deepinfer inspect` on a valid synthetic tiny-V4.1 checkpoint and on
# corrupted ones. Every error must exit with status 2 and print exactly one
# line on stderr starting with "error:" (no "terminate called", no stack trace).
# Usage: inspect_errors.sh BINARY SOURCE_DIR
set -uo pipefail
BIN=$1
SRC=$2
DATA="$SRC/tests/data"
FIX="$SRC/tests/cli/checkpoint_fixture.py"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error NAME SUBSTRING -- ARGS...   (runs $BIN ARGS)
expect_error() {
  local name=$1 want=$2
  shift 3
  "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne 2 ]; then fail "$name: exit status $rc, expected 2"; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines lines on stderr, expected 1:"; cat "$TMP/err"; fi
  if ! head -1 "$TMP/err" | grep -q '^error: '; then fail "$name: stderr does not start with 'error: '"; fi
  if ! grep -qF -- "$want" "$TMP/err"; then fail "$name: stderr lacks '$want': $(cat "$TMP/err")"; fi
  if grep -qiE 'terminate called|what\(\)|stack|Aborted|core dumped' "$TMP/err"; then
    fail "$name: crash output: $(cat "$TMP/err")"
  fi
  if [ -s "$TMP/out" ]; then fail "$name: unexpected stdout: $(head -3 "$TMP/out")"; fi
  echo "ok: $name -> $(cat "$TMP/err")"
}

CFG="$DATA/tiny_v41_config.json"

# The expected tensor list, from the config alone.
mkdir -p "$TMP/cfg"
cp "$CFG" "$TMP/cfg/config.json"
"$BIN" inspect --config-only --json --tensors "$TMP/cfg" >"$TMP/plan.json" || fail "inspect --config-only failed"

# Valid checkpoint.
python3 "$FIX" plan "$TMP/plan.json" "$CFG" "$TMP/valid" valid
"$BIN" inspect "$TMP/valid" >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" -eq 0 ] || fail "valid: exit status $rc: $(cat "$TMP/err")"
grep -q "parameters    23,056,468" "$TMP/out" || fail "valid: parameter count 23,056,468 not printed"
grep -q "all 772 expected tensors present" "$TMP/out" || fail "valid: validation line missing"
grep -qE '^  6 +1  Reindex ' "$TMP/out" || fail "valid: layer 6 Reindex line missing"
"$BIN" inspect --json "$TMP/valid" >"$TMP/out.json" || fail "valid --json failed"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['parameters']==23056468 and len(j['layers'])==10" "$TMP/out.json" \
  || fail "valid --json: bad content"

# Tolerated extra (vision tensors with vision off) passes.
python3 "$FIX" plan "$TMP/plan.json" "$CFG" "$TMP/vision" vision_extra
"$BIN" inspect "$TMP/vision" >"$TMP/out" 2>"$TMP/err" || fail "vision_extra: $(cat "$TMP/err")"
grep -q "1 tolerated extra tensors ignored" "$TMP/out" || fail "vision_extra: not reported"

# Model directory / config errors.
expect_error missing_dir "config.json: cannot open" -- inspect "$TMP/does-not-exist"
mkdir -p "$TMP/badcfg" && printf '{"model_type": "deepseek_v41", ' >"$TMP/badcfg/config.json"
expect_error bad_config_json "config.json: not valid JSON" -- inspect "$TMP/badcfg"
mkdir -p "$TMP/nokey"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); del j['text_config']['hidden_size']; json.dump(j, open(sys.argv[2],'w'))" "$CFG" "$TMP/nokey/config.json"
expect_error missing_config_key "missing required key text_config.hidden_size" -- inspect "$TMP/nokey"
mkdir -p "$TMP/badtype"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j['text_config']['num_hidden_layers']='8'; json.dump(j, open(sys.argv[2],'w'))" "$CFG" "$TMP/badtype/config.json"
expect_error config_wrong_type "text_config.num_hidden_layers: expected an integer, found a string" -- inspect "$TMP/badtype"
mkdir -p "$TMP/nockpt" && cp "$CFG" "$TMP/nockpt/config.json"
expect_error no_checkpoint "no model.safetensors.index.json or model.safetensors" -- inspect "$TMP/nockpt"

# Corrupted safetensors files.
for c in truncated header_past_eof header_absurd header_bad_json unknown_dtype bytes_mismatch \
         overlap out_of_range index_missing_shard index_bad_json; do
  python3 "$FIX" raw "$CFG" "$TMP/$c" "$c"
done
expect_error truncated "model.safetensors: file is 5 bytes, expected at least 8" -- inspect "$TMP/truncated"
expect_error header_past_eof "runs past the end of the file" -- inspect "$TMP/header_past_eof"
expect_error header_absurd "header length 104857601 bytes, expected at most 104857600" -- inspect "$TMP/header_absurd"
expect_error header_bad_json "model.safetensors: header: not valid JSON" -- inspect "$TMP/header_bad_json"
expect_error unknown_dtype "tensor layers.0.x: unknown dtype \"Q4_K\"" -- inspect "$TMP/unknown_dtype"
expect_error bytes_mismatch "tensor w: BF16 [2, 3] needs 12 bytes, found data_offsets [0, 10] = 10 bytes" -- inspect "$TMP/bytes_mismatch"
expect_error overlap "tensor b: data_offsets [12, 20] overlap tensor a's [0, 16]" -- inspect "$TMP/overlap"
expect_error out_of_range "tensor a: data_offsets [8, 24] run past the end of the data: expected end <= 16, found 24" -- inspect "$TMP/out_of_range"
expect_error index_missing_shard "weight_map names shard model-00002-of-00002.safetensors" -- inspect "$TMP/index_missing_shard"
expect_error index_bad_json "model.safetensors.index.json: not valid JSON" -- inspect "$TMP/index_bad_json"

# Checkpoint does not match the config.
for c in missing_tensor unexpected_tensor wrong_dtype wrong_shape; do
  python3 "$FIX" plan "$TMP/plan.json" "$CFG" "$TMP/$c" "$c"
done
expect_error missing_tensor "missing tensor layers.5.ffn.gate.bias: expected dtype F32 shape [8]" -- inspect "$TMP/missing_tensor"
expect_error unexpected_tensor "model.safetensors: unexpected tensor layers.3.attn.indexer.wq_b.weight: F8_E4M3 [256, 64]" -- inspect "$TMP/unexpected_tensor"
expect_error wrong_dtype "model.safetensors: tensor layers.3.attn.wq_b.weight: expected dtype F8_E4M3 shape [512, 64], found BF16 [512, 64]" -- inspect "$TMP/wrong_dtype"
expect_error wrong_shape "tensor layers.0.ffn.experts.1.w2.weight: expected dtype I8 shape [64, 32], found I8 [64, 64]" -- inspect "$TMP/wrong_shape"

if [ "$fails" -ne 0 ]; then
  echo "$fails failure(s)"
  exit 1
fi
echo "all inspect checks passed"

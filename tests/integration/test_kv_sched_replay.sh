#!/bin/sh
# `kvpool kv-sched-replay` against the original scheduler (ref.py): the samples
# plus a short setting of the reference checker (2 seeds per named mode,
# the --bad modes included), then the replay's own error handling.
# Env (from ctest): KVP_BIN, KVP_SHARED_DIR.
set -u
: "${KVP_BIN:?KVP_BIN not set}"
: "${KVP_SHARED_DIR:?KVP_SHARED_DIR not set}"
CHECK="$KVP_SHARED_DIR/tools/kvsched-ref/check.py"
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

if [ ! -f "$CHECK" ]; then
    echo "FAIL: $CHECK not found"
    exit 1
fi

if /usr/bin/python3 "$CHECK" --seeds "${KVP_KV_REPLAY_SEEDS:-2}" --steps 200 "$KVP_BIN kv-sched-replay"; then
    ok "check.py matches ref.py (samples + 16 modes)"
else
    bad "check.py matches ref.py"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# a first line that is not a valid config: no output, non-zero exit
printf '{"op":"config","version":2}\n' | "$KVP_BIN" kv-sched-replay > "$tmp/out" 2> "$tmp/err"
rc=$?
if [ "$rc" -ne 0 ] && [ ! -s "$tmp/out" ] && grep -q "bad config" "$tmp/err"; then
    ok "bad config line rejected (exit $rc)"
else
    bad "bad config line (exit $rc)"
fi

# invalid lines answer BadEvent / UnknownRequest / TypeError and the stream goes on
cat > "$tmp/in" <<'EVENTS'
{"op":"config","version":1,"kv_role":"kv_both","load_async":true,"lookup_async":false,"enable_lookup":true,"block_size":16,"hash_block_size":16,"partial_hits":false}
not json

{"op":"req","req_id":"r1","num_tokens":true,"num_computed_tokens":0,"all_token_ids":[],"block_hashes":[]}
{"op":"req","req_id":"r1","num_tokens":40,"num_computed_tokens":0,"all_token_ids":[1,2,3],"block_hashes":["aa","bb"]}
{"op":"get_num_new_matched_tokens","req_id":"ghost","num_computed_tokens":0,"lookup":1}
{"op":["x"]}
{"op":"get_num_new_matched_tokens","req_id":"r1","num_computed_tokens":0,"lookup":32.0}
{"op":"get_num_new_matched_tokens","req_id":"r1","num_computed_tokens":0,"lookup":32}
{"op":"update_state_after_alloc","req_id":"r1","block_ids":[[1,2,3]],"num_external_tokens":16}
{"op":"reset_store","reply":"error"}
EVENTS
cat > "$tmp/want" <<'OUT'
{"ret":null}
{"error":"BadEvent"}
{"error":"BadEvent"}
{"ret":null}
{"error":"UnknownRequest"}
{"error":"TypeError"}
{"error":"BadEvent"}
{"lookup_called":{"non_block":false,"num_block_hashes":2,"num_tokens":40},"ret":[32,true]}
{"error":"AssertionError"}
{"ret":false}
OUT
"$KVP_BIN" kv-sched-replay < "$tmp/in" > "$tmp/out" 2> "$tmp/err"
rc=$?
if [ "$rc" -eq 0 ] && cmp -s "$tmp/out" "$tmp/want"; then
    ok "invalid events answered, stream continues"
else
    bad "invalid events (exit $rc)"
    diff "$tmp/want" "$tmp/out"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

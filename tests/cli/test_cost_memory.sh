# hyperpar cost's forward memory estimate (weights exact + activations estimated) against the memory
# `hyperpar run` measures on every rank (anonymous memory grown from before the runner to after the forward,
# freed heap given back, plus the tp and cp groups' shared windows: window_bytes, the collectives' memory on one
# node, which is shared memory (RssShmem), not anonymous, so RssAnon never sees it, while cost's activations
# count it in place of the scratch block it replaces): within 15%, on generated models large enough that the
# buffers dominate (bf16 weights, vocab 8192, 512 tokens), dense and MoE, at tp, cp, dp x tp, loss-parallel and
# EP.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
if [ "${HP_SANITIZED:-0}" = 1 ]; then
    echo "SKIP: a sanitizer build: its memory is not the runtime's"
    check "skipped under the sanitizers" true
    finish
    exit $?
fi
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
"$HP" gen --family llama --out "$WORK/dense" --layers 2 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 \
    --intermediate 1536 --vocab 8192 --dtype bf16 >/dev/null
"$HP" gen --family qwen3_moe --out "$WORK/moe" --layers 2 --hidden 256 --heads 8 --kv-heads 4 --head-dim 32 \
    --moe-intermediate 256 --intermediate 512 --experts 16 --top-k 4 --vocab 4096 --dtype bf16 >/dev/null
python3 - "$WORK" <<'PY'
import json, struct, sys
for name, V in (("dense", 8192), ("moe", 4096)):
    B, S = 2, 256
    ids = [(i * 37) % V for i in range(B * S)]
    h = json.dumps({"input_ids": {"dtype": "I64", "shape": [B, S], "data_offsets": [0, 8 * B * S]}}).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    open(sys.argv[1] + "/" + name + ".ids", "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<%dq" % (B * S), *ids))
PY
# within RUN COST: every rank's weights + activations within 15% of the measured growth
within() {
    python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1])); cost = json.load(open(sys.argv[2]))
ok = len(run["ranks"]) == len(cost["ranks"])
for a, b in zip(run["ranks"], cost["ranks"]):
    m = a["anon_bytes_grown"]
    if m < 0:
        print("SKIP: no RssAnon here"); sys.exit(0)
    m += a["window_bytes"]
    r = (b["weight_bytes"] + b["activation_bytes"]) / m
    print("  rank %d: estimate %.1f MB, measured %.1f MB (window %.1f MB), ratio %.3f" % (a["rank"],
          (b["weight_bytes"] + b["activation_bytes"]) / 1e6, m / 1e6, a["window_bytes"] / 1e6, r))
    ok = ok and 0.85 <= r <= 1.15
sys.exit(0 if ok else 1)
PY
}
n=0
while read -r mdl np flags; do
    n=$((n + 1))
    ov=""
    [ "$mdl" = moe ] && case "$flags" in *--ep*) ov="--overrides data/overrides/qwen3_moe_ep.yaml" ;; esac
    $MPI -np $np "$HP" run "$WORK/$mdl" --input "$WORK/$mdl.ids" $flags $ov --stats-json "$WORK/r$n.json" \
        >/dev/null 2>"$WORK/r$n.err" </dev/null
    "$HP" cost "$WORK/$mdl" --input "$WORK/$mdl.ids" $flags $ov --format json -o "$WORK/c$n.json"
    echo "$mdl $flags:"
    check "memory estimate within 15%: $mdl $flags" within "$WORK/r$n.json" "$WORK/c$n.json"
done <<'LIST'
dense 1 --tp 1
dense 2 --tp 2
dense 2 --tp 2 --loss-parallel
dense 2 --cp 2
dense 4 --dp 2 --tp 2
moe 1 --tp 1
moe 2 --tp 2 --ep 2
LIST
finish

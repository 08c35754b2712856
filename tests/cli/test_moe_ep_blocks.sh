# Issue 10 (items 1, 2, 3, 11, 18, 19, 24) for `hyperpar moe` under mpirun:
# - uneven row blocks at np 2, 3 and 4 with a capacity factor equal the one-process layer run on each rank's
#   block (rank r takes the r-th block; the first T mod N ranks one row more), also with fewer rows than ranks;
# - ranks given inputs of other row counts or values, or other weights, are refused before any exchange (exit 2,
#   no crash, no hang), the error printed once;
# - a non-finite output is an error naming the row and the cause (exit 2), also under mpirun;
# - a folder without config.json, and a shard folder run with another mesh, say what is wrong.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"

# st_range FILE NAME: the absolute byte offset and the byte length of tensor NAME's data.
st_range() {
    local n hdr off
    n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
    hdr=$(head -c $((8 + n)) "$1" | tail -c "$n")
    off=$(grep -o "\"$2\":{[^}]*}" <<<"$hdr" | grep -o '"data_offsets":\[[0-9]*,[0-9]*\]' | grep -o '[0-9]*,[0-9]*')
    echo $((8 + n + ${off%,*})) $((${off#*,} - ${off%,*}))
}
# st_bytes FILE NAME [SKIP LEN]: tensor NAME's data bytes (or LEN of them from SKIP) on stdout.
st_bytes() {
    local r
    r=($(st_range "$1" "$2"))
    local skip=${3:-0} len=${4:-${r[1]}}
    tail -c +$((r[0] + skip + 1)) "$1" | head -c "$len"
}
le64() {
    local h i out=""
    h=$(printf '%016x' "$1")
    for i in 14 12 10 8 6 4 2 0; do out+="\\x${h:$i:2}"; done
    printf "$out"
}
# st_write OUT "NAME DTYPE ROWS COLS DATAFILE"...: a safetensors file of 2-D tensors holding those bytes.
st_write() {
    local out="$1" hdr="{" off=0 sep="" spec n d r c f
    shift
    for spec in "$@"; do
        read -r n d r c f <<<"$spec"
        local sz
        sz=$(stat -c %s "$f")
        hdr+="$sep\"$n\":{\"dtype\":\"$d\",\"shape\":[$r,$c],\"data_offsets\":[$off,$((off + sz))]}"
        off=$((off + sz))
        sep=","
    done
    hdr+="}"
    while [ $(( ${#hdr} % 8 )) -ne 0 ]; do hdr+=" "; done
    { le64 ${#hdr}; printf '%s' "$hdr"; for spec in "$@"; do read -r n d r c f <<<"$spec"; cat "$f"; done; } >"$out"
}
# mkx OUT MODEL ROW0 ROWS COLS: x [ROWS, COLS] from rows ROW0.. of MODEL's f32 embedding (random values).
mkx() {
    st_bytes "$2/model.safetensors" model.embed_tokens.weight $(($3 * $5 * 4)) $(($4 * $5 * 4)) >"$WORK/xb"
    st_write "$1" "x F32 $4 $5 $WORK/xb"
}
# cat_outputs OUT ROWS H K FILES...: one moe output holding the rows of each file in turn.
cat_outputs() {
    local out="$1" T="$2" H="$3" K="$4" f
    shift 4
    : >"$WORK/cy"; : >"$WORK/ci"; : >"$WORK/cw"
    for f in "$@"; do
        st_bytes "$f" y >>"$WORK/cy"; st_bytes "$f" topk_idx >>"$WORK/ci"; st_bytes "$f" topk_w >>"$WORK/cw"
    done
    st_write "$out" "y F32 $T $H $WORK/cy" "topk_idx I32 $T $K $WORK/ci" "topk_w F32 $T $K $WORK/cw"
}
# one_error CODE NEEDLE -- cmd: expect, and the error printed exactly once however many ranks.
one_error() {
    expect "$@"
    shift 3
    local n
    n=$("$@" 2>&1 </dev/null | grep -c "hyperpar: error")
    check "error printed once ($n times): $*" [ "$n" -eq 1 ]
}

# The issue's layer: 24 experts (divisible by 2, 3 and 4), top-6, H 96; x = 29 rows.
RQ="$WORK/rq"
"$HP" gen --family qwen3_moe --out "$RQ" --layers 1 --hidden 96 --heads 6 --kv-heads 2 --head-dim 16 \
    --moe-intermediate 24 --experts 24 --top-k 6 --vocab 64 --dtype f32 --seed 7 >/dev/null 2>&1
A=qwen3moe_topk_router
for T in 29 3; do
    mkx "$WORK/x$T.st" "$RQ" 0 $T 96
    for np in 2 3 4; do
        [ $T -lt $np ] && [ $np -ne 4 ] && continue
        # One-process runs of every rank's block: [r*q + min(r, T%np), ...) of q or q+1 rows.
        blocks=()
        q=$((T / np)); rem=$((T % np))
        for ((r = 0; r < np; r++)); do
            lo=$((r * q + (r < rem ? r : rem))); n=$((q + (r < rem ? 1 : 0)))
            [ $n -eq 0 ] && continue
            mkx "$WORK/xb$r.st" "$RQ" $lo $n 96
            "$HP" moe "$RQ" --layer 0 --archetype $A --capacity-factor 1.0 --input "$WORK/xb$r.st" \
                --output "$WORK/yb$r.st" 2>/dev/null </dev/null
            blocks+=("$WORK/yb$r.st")
        done
        cat_outputs "$WORK/ref.st" $T 96 6 "${blocks[@]}"
        for extra in "" "--overlap" "--dispatch-chunks 3"; do
            expect 0 "OK" -- $MPI -np $np "$HP" moe "$RQ" --layer 0 --ep $np --archetype $A --capacity-factor 1.0 \
                $extra --input "$WORK/x$T.st" --compare "$WORK/ref.st" --ref-prefix "" --compare-rtol 1e-5
        done
    done
done
expect 0 "rows per rank: 15 on rank 0, 14 on rank 1" -- $MPI -np 2 "$HP" moe "$RQ" --layer 0 --ep 2 --archetype $A \
    --input "$WORK/x29.st" --output "$WORK/y.st"
# One row on four ranks: three ranks hold none and still take part.
mkx "$WORK/x1.st" "$RQ" 5 1 96
"$HP" moe "$RQ" --layer 0 --archetype $A --input "$WORK/x1.st" --output "$WORK/y1.st" 2>/dev/null </dev/null
expect 0 "OK" -- $MPI -np 4 "$HP" moe "$RQ" --layer 0 --ep 4 --archetype $A --input "$WORK/x1.st" \
    --compare "$WORK/y1.st" --ref-prefix "" --compare-rtol 1e-6

# Ranks that read other inputs or weights: refused before any exchange, printed once.
G=data/golden/qwen3_moe_batched_bf16
X=$G/moe_io.safetensors
"$HP" gen --family qwen3_moe --out "$WORK/a" >/dev/null 2>&1
"$HP" gen --family qwen3_moe --out "$WORK/b" --seed 7 >/dev/null 2>&1
rm -f "$WORK/y.st"
mkx "$WORK/x34.st" "$WORK/a" 0 34 64
mkx "$WORK/x32.st" "$WORK/a" 1 32 64
one_error 2 "rank 1 read 34 rows of x but rank 0 read 32" -- $MPI \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype $A --input "$X" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype $A --input "$WORK/x34.st" --output "$WORK/y.st"
one_error 2 "rank 1 read an input x with the same shape as rank 0's but other values" -- $MPI \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype $A --input "$X" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$G" --layer 1 --ep 2 --archetype $A --input "$WORK/x32.st" --output "$WORK/y.st"
one_error 2 "rank 1 loaded other weights for layer 1 than rank 0" -- $MPI \
    -np 1 "$HP" moe "$WORK/a" --layer 1 --ep 2 --archetype $A --input "$WORK/x32.st" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$WORK/b" --layer 1 --ep 2 --archetype $A --input "$WORK/x32.st" --output "$WORK/y.st"
check "no output left by refused runs" [ ! -e "$WORK/y.st" ]
# The shared-expert layer that hung with 3 and 5 rows.
"$HP" gen --family qwen2_moe --seed 11 --out "$WORK/q2" >/dev/null 2>&1
mkx "$WORK/x3.st" "$WORK/q2" 0 3 64
mkx "$WORK/x5.st" "$WORK/q2" 3 5 64
one_error 2 "rank 1 read 5 rows of x but rank 0 read 3" -- $MPI \
    -np 1 "$HP" moe "$WORK/q2" --layer 0 --ep 2 --archetype qwen2moe_shared_expert_gate --input "$WORK/x3.st" --output "$WORK/y.st" : \
    -np 1 "$HP" moe "$WORK/q2" --layer 0 --ep 2 --archetype qwen2moe_shared_expert_gate --input "$WORK/x5.st" --output "$WORK/y.st"
# An agreed error at np 3 and 4 is printed once (rank 0), as bench ep does.
one_error 2 "num_experts (8) must be divisible by ep_size (3)" -- $MPI -np 3 "$HP" moe data/golden/mixtral_batched_bf16 \
    --layer 0 --ep 3 --archetype mixtral_topk_router --input data/golden/mixtral_batched_bf16/moe_io.safetensors --output "$WORK/y.st"
one_error 2 "has 4 ranks but mpirun started 2" -- $MPI -np 2 "$HP" moe "$G" --layer 1 --mesh dp=4 --ep 2 \
    --archetype $A --input "$X" --output "$WORK/y.st"

# Non-finite outputs: exit 2 with the row and the cause, one process and under mpirun.
{ printf '%s' ""; for ((i = 0; i < 8 * 64; i++)); do printf '\xe6\xb1\x61\x7f'; done; } >"$WORK/big.bin" # 3e38
st_write "$WORK/xbig.st" "x F32 8 64 $WORK/big.bin"
rm -f "$WORK/y.st"
expect 2 "output row 0 is not finite" -- "$HP" moe "$WORK/a" --layer 1 --input "$WORK/xbig.st" --output "$WORK/y.st"
expect 2 "reaches 3e+38 in magnitude" -- "$HP" moe "$WORK/a" --layer 1 --input "$WORK/xbig.st" --output "$WORK/y.st"
one_error 2 "reaches 3e+38 in magnitude" -- $MPI -np 2 "$HP" moe "$WORK/a" --layer 1 --ep 2 --archetype $A \
    --input "$WORK/xbig.st" --output "$WORK/y.st"
check "no output written for a non-finite result" [ ! -e "$WORK/y.st" ]

# A folder without config.json: say so (not "0 layers (0..-1)").
mkdir "$WORK/nocfg" && cp "$WORK/a/model.safetensors" "$WORK/nocfg/"
expect 2 "the folder has no config.json" -- "$HP" moe "$WORK/nocfg" --layer 1 --input "$WORK/x32.st" --output "$WORK/y.st"
one_error 2 "the folder has no config.json" -- $MPI -np 2 "$HP" moe "$WORK/nocfg" --layer 1 --ep 2 --archetype $A \
    --input "$WORK/x32.st" --output "$WORK/y.st"
# A shard folder for ep=2 on dp=4, run with a mesh that orders the ranks otherwise: the same ep, so the
# message names the mesh, not "run with --ep 2".
"$HP" shard "$WORK/a" --dp 4 --ep 2 --out "$WORK/s4" >/dev/null 2>&1
expect 0 "" -- $MPI -np 4 "$HP" moe "$WORK/s4" --layer 1 --ep 2 --archetype $A --input "$WORK/x32.st" --output "$WORK/y.st"
expect 2 "the folder was sharded for this same ep=2" -- $MPI -np 4 "$HP" moe "$WORK/s4" --layer 1 --mesh ep=2,dp=2 \
    --archetype $A --input "$WORK/x32.st" --output "$WORK/y.st"
finish

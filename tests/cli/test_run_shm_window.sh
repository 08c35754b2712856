# The collectives through the shared window (ranks on one node, comm_mpi.c) and through MPI's own (the window
# off: HP_MPI_FORCE_PIECES=1, no /dev/shm room at all: HP_MPI_SHM_AVAIL=0, or room for the first window but not
# its growth, so it falls back mid-forward) give byte-identical `run --output` at tp 2, dp 2 x tp 2, cp 2 and
# tp 2 with the loss parallel; --stats-json's window_bytes says which path ran (positive through the window, 0
# otherwise).
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
# B 2 (the sequence gathers strided, not contiguous), blocks of 128 KiB, logits of 2 MiB per tp rank: past the
# window's first MiB
"$HP" gen --family llama --out "$WORK/m" --layers 2 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 \
    --intermediate 512 --vocab 4096 >/dev/null
window() { python3 -c "import json,sys; print(min(r['window_bytes'] for r in json.load(open(sys.argv[1]))['ranks']))" "$1"; }
n=0
while read -r np flags; do
    n=$((n + 1))
    $MPI -np $np "$HP" run "$WORK/m" --random-input 2,128 $flags -o "$WORK/w$n.st" --stats-json "$WORK/w$n.json" \
        >/dev/null 2>"$WORK/w$n.err" </dev/null
    check "the window carries the collectives: np=$np $flags" test "$(window "$WORK/w$n.json")" -gt 0
    for env in HP_MPI_FORCE_PIECES=1 HP_MPI_SHM_AVAIL=0 HP_MPI_SHM_AVAIL=16777216; do
        $MPI -np $np -x $env "$HP" run "$WORK/m" --random-input 2,128 $flags -o "$WORK/f$n.st" \
            --stats-json "$WORK/f$n.json" >/dev/null 2>"$WORK/f$n.err" </dev/null
        # the mid-forward fall back needs a call past the first MiB: the logits' all-gather over tp
        [ "$env" = HP_MPI_SHM_AVAIL=16777216 ] && [ "$flags" != "--tp 2" ] || \
            check "$env: MPI's collectives at the end: np=$np $flags" test "$(window "$WORK/f$n.json")" = 0
        check "$env: the same output to the byte: np=$np $flags" cmp -s "$WORK/w$n.st" "$WORK/f$n.st"
    done
done <<'LIST'
2 --tp 2
4 --dp 2 --tp 2
2 --cp 2
2 --tp 2 --loss-parallel
LIST
finish

# Threads per rank: by default max(1, this process's cores / the ranks the launcher started on this node), so
# ranks x threads never oversubscribe the cores; --threads N and OMP_NUM_THREADS override it. The bench headers
# say the choice ("threads   : 1 per rank (2 cores, 2 ranks on this node)"). The expected counts are computed
# from what each rank sees (nproc under the same mpirun: the launcher may bind a rank to its own cores).
source "$(dirname "$0")/lib.sh"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
SMALL="--preset llama-3-8b --hidden 64 --intermediate 128 --heads 4 --kv-heads 2 --head-dim 16 --layers 1 --tokens 16 --vocab 512 --reps 1"
mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp" HP_BENCH_PYTHON=false
unset OMP_NUM_THREADS
cores_word() { [ "$1" -eq 1 ] && echo "1 core" || echo "$1 cores"; }

# 2 ranks: each rank's cores shared by the 2 ranks of this node.
c2=$($MPI -np 2 nproc | head -1)
t2=$((c2 / 2)); [ $t2 -ge 1 ] || t2=1
out=$($MPI -np 2 "$HP" bench run $SMALL 2>&1 </dev/null)
check "2 ranks: exit 0" test $? -eq 0
check "2 ranks: $t2 per rank by default" grep -qF "threads   : $t2 per rank ($(cores_word $c2), 2 ranks on this node)" <<<"$out"
check "2 ranks: said once" test "$(grep -c 'threads   :' <<<"$out")" -eq 1
if [ "$(nproc)" -eq 2 ]; then
    check "2 ranks on this 2-core machine: 1 thread per rank" grep -qF "threads   : 1 per rank (" <<<"$out"
fi
# --threads overrides the default, and so does OMP_NUM_THREADS (given to every rank).
expect 0 "threads   : 3 per rank (--threads; $(cores_word $c2), 2 ranks on this node)" -- $MPI -np 2 "$HP" bench run $SMALL --threads 3
expect 0 "threads   : 2 per rank (OMP_NUM_THREADS; $(cores_word $c2), 2 ranks on this node)" -- \
    $MPI -np 2 -x OMP_NUM_THREADS=2 "$HP" bench run $SMALL
expect 0 "threads   : 3 per rank (--threads; " -- $MPI -np 2 -x OMP_NUM_THREADS=2 "$HP" bench run $SMALL --threads 3

# One process: all of its cores.
c1=$(nproc)
expect 0 "threads   : $c1 per rank ($(cores_word $c1), 1 rank on this node)" -- "$HP" bench run $SMALL
expect 0 "threads   : 1 per rank (OMP_NUM_THREADS; " -- env OMP_NUM_THREADS=1 "$HP" bench run $SMALL
# bench moe (no MPI: the launcher's environment names the ranks of the node).
MOE="--preset qwen3-30b-a3b --tokens 4 --reps 1 --max-gib 0.05"
expect 0 "threads  : $c1 per rank ($(cores_word $c1), 1 rank on this node)" -- "$HP" bench moe $MOE
expect 0 "threads  : $t2 per rank ($(cores_word $c2), 2 ranks on this node)" -- $MPI -np 2 "$HP" bench moe $MOE
expect 0 "threads  : 1 per rank (--threads; " -- "$HP" bench moe $MOE --threads 1
check "the temporary checkpoints are gone" test -z "$(ls -A "$WORK/tmp" | grep hp-bench-run)"
finish

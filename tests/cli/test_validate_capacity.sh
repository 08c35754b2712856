# validate with a capacity factor (issue 36): each rank limits the slots of the rows it routes, and validate's
# one-process reference applies the same factor within the same blocks of rows, so a correct plan validates (it
# said DIVERGES before); where no such reference exists validate says the comparison is not defined (exit 2). Under
# a pipeline (pp=2: the sparse layers on stage 1 only, rank 0's stage has none) the factor and the blocks are stage 1's.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
MPI="timeout 300 mpirun --allow-run-as-root --oversubscribe"
M=data/forward/deepseek_v3
OV="--overrides data/overrides/deepseek_v3_ep.yaml" # capacity_factor 1.25
I="--input $M/forward_io.safetensors"
loss_of() { sed -n 's/^loss: distributed \([^,]*\),.*/\1/p' "$1"; }
while read -r np flags; do
    tag=$np$(tr -d ' -=,' <<<"$flags")
    $MPI -np $np "$HP" validate $M $I $flags $OV >"$WORK/$tag.log" 2>&1 </dev/null
    rc=$?
    check "np=$np $flags: validates with capacity 1.25 (rc $rc)" test $rc -eq 0
    check "np=$np $flags: every boundary agrees" grep -q "^loss: .*: ok$" "$WORK/$tag.log"
    # the limit really dropped slots: the loss is not the capacity-free model's (5.060252)
    got=$(loss_of "$WORK/$tag.log")
    check "np=$np $flags: the loss $got is the limited model's" python3 -c "import sys; sys.exit(abs($got - 5.060252) < 1e-4)"
done <<'LIST'
2 --tp 2 --ep 2
2 --tp 2 --ep 2 --backward
2 --tp 2 --ep 2 --no-sequence-parallel
2 --mesh dp=1,ep=2 --ep-axis
4 --dp 2 --tp 2 --ep 2
4 --pp 2 --tp 2 --ep 2
4 --pp 2 --tp 2 --ep 2 --backward
4 --mesh pp=2,dp=1,ep=2 --ep-axis
LIST
# cp pads 15 positions to 16: the padding takes capacity on rank 1, which one process has no row for
expect 2 "the comparison is not defined" -- $MPI -np 2 "$HP" validate $M --random-input 2,15 --cp 2 --ep 2 $OV
finish

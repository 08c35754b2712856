#!/bin/sh
# Runs a torch.distributed test script under torchrun and keeps its "skipped" meaning:
#   sh torchrun_test.sh TORCHRUN NPROC SCRIPT ARGS...   ->   TORCHRUN --standalone --nproc_per_node NPROC SCRIPT ARGS...
# torchrun reports a child's exit 77 as its own failure (1), so a script that skips writes its reason to
# $HP_SKIP_FILE first; a torchrun that cannot start (torch not importable) skips too. Exit 77 (skipped) in both
# cases unless HP_REQUIRE_TORCH=1, then 1.
torchrun=$1 np=$2
shift 2
skip() {
    echo "SKIP: $1"
    if [ "$HP_REQUIRE_TORCH" = 1 ]; then echo "FAIL: HP_REQUIRE_TORCH=1"; exit 1; fi
    exit 77
}
"$torchrun" --help >/dev/null 2>&1 || skip "$torchrun cannot start (is torch installed for it?)"
marker=$(mktemp "${TMPDIR:-/tmp}/hp_torchrun_skip.XXXXXX") || exit 1
HP_SKIP_FILE=$marker "$torchrun" --standalone --nproc_per_node "$np" "$@"
rc=$?
reason=$(cat "$marker" 2>/dev/null)
rm -f "$marker"
if [ "$rc" -ne 0 ] && [ -n "$reason" ]; then skip "$reason"; fi
exit "$rc"

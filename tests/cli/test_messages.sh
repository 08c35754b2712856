# test_messages.sh — what the CLI prints is safe and said once:
#  - an option given twice is a usage error naming both values, in every command (--freeze repeats);
#  - under mpirun a usage error is printed once (rank 0), and every rank exits 2;
#  - names read from files (tensor names, dtype strings, names inside --input) reach the terminal escaped:
#    no raw ESC byte in any message of inspect, plan, shard, cost or run;
#  - an output location that cannot take a file is refused before any work, naming the user's path once and
#    never the temporary "<path>.tmp.<pid>"; a full disk names the user's file too.
source "$(dirname "$0")/lib.sh"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"
W="$WORK"
MOUNTS=()
trap 'for d in "${MOUNTS[@]}"; do umount "$d" 2>/dev/null; done; rm -rf "$W"' EXIT
"$HP" gen --family llama --out "$W/gl" 2>/dev/null || { echo "FAIL: gen"; exit 1; }

# ids FILE NAME: a safetensors file with one I64 [1, 4] tensor called NAME.
ids() {
    python3 - "$1" "$2" <<'EOF'
import json, struct, sys
data = struct.pack("<4q", 1, 2, 3, 4)
hb = json.dumps({sys.argv[2]: {"dtype": "I64", "shape": [1, 4], "data_offsets": [0, len(data)]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(hb)) + hb + data)
EOF
}
# hostile SRC DST MODE: a copy of checkpoint SRC whose model.safetensors carries an ESC sequence in a tensor name
# (rename: a weight renamed; extra: one more tensor overlapping another) or in a dtype string (dtype).
hostile() {
    python3 - "$1" "$2" "$3" <<'EOF'
import json, os, shutil, struct, sys
src, dst, mode = sys.argv[1:4]
shutil.copytree(src, dst)
p = os.path.join(dst, "model.safetensors")
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
names = sorted(k for k in h if k != "__metadata__")
if mode == "rename":
    k = [k for k in names if "layers.0.mlp.up_proj" in k][0]
    h[k.replace("up_proj", "up\x1b[31mproj")] = h.pop(k)
elif mode == "extra":
    h["evil\x1b]0;pwned\x07.weight"] = dict(h[names[0]])
else:
    h[names[0]]["dtype"] = "F\x1b[2J32"
hb = json.dumps(h).encode()
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])
EOF
}
ids "$W/ids.st" input_ids

# ---- an option given twice ----
twice() { # twice NEEDLE -- command...: exit 2, the message once, nothing else run
    local needle="$1"; shift 2
    local out rc
    out=$("$@" 2>&1 </dev/null); rc=$?
    check "twice: '$*' exits 2 (rc $rc)" test "$rc" -eq 2
    check "twice: '$*' says '$needle'" grep -qF -- "$needle" <<<"$out"
    check "twice: '$*' one error" test "$(grep -c 'hyperpar: error' <<<"$out")" -eq 1
}
twice "run: --input is given twice ('$W/ids.st' and 'B'); give it once" -- "$HP" run "$W/gl" --input "$W/ids.st" --input B
twice "run: --input is given twice ('A' and 'B')" -- "$HP" run "$W/gl" -i A --input B
twice "validate: --compare-rtol is given twice ('0.1' and '0.2')" -- "$HP" validate "$W/gl" --rtol 0.1 --compare-rtol 0.2 --input A
twice "run: --output is given twice" -- "$HP" run "$W/gl" --input "$W/ids.st" -o "$W/a.st" --output "$W/b.st"
twice "plan: --tp is given twice ('2' and '4')" -- "$HP" plan "$W/gl" --tp 2 --tp 4
twice "plan: --output is given twice ('$W/a' and '$W/b')" -- "$HP" plan "$W/gl" -o "$W/a" -o "$W/b"
twice "plan: --overrides is given twice" -- "$HP" plan "$W/gl" --overrides a.yaml --overrides b.yaml
twice "shard: --out is given twice ('$W/s1' and '$W/s2')" -- "$HP" shard "$W/gl" --tp 2 --out "$W/s1" -o "$W/s2"
twice "shard: --plan is given twice" -- "$HP" shard "$W/gl" --plan p1 --plan p2 --out "$W/s3"
twice "cost: --output is given twice ('$W/c1' and '$W/c2')" -- "$HP" cost "$W/gl" -o "$W/c1" --output "$W/c2"
twice "cost: --seq is given twice ('8' and '16')" -- "$HP" cost "$W/gl" --seq 8 --seq 16
twice "cost: --input is given twice" -- "$HP" cost "$W/gl" --input a --input b
twice "gen: --family is given twice ('llama' and 'qwen3')" -- "$HP" gen --family llama --family qwen3 --out "$W/g2"
twice "gen: --out is given twice" -- "$HP" gen --family llama --out "$W/g3" --out "$W/g4"
twice "inspect: --depth is given twice ('1' and '2')" -- "$HP" inspect "$W/gl" --tree --depth 1 --depth 2
twice "moe: --input is given twice" -- "$HP" moe "$W/gl" --layer 0 --input a --input b
twice "merge: --out is given twice" -- "$HP" merge "$W/s" --out "$W/m1" --out "$W/m2"
twice "advise: --world is given twice ('2' and '4')" -- "$HP" advise "$W/gl" --world 2 --world 4
twice "demo: --out is given twice" -- "$HP" demo --out "$W/d1" --out "$W/d2"
twice "bench: --tokens is given twice ('4' and '8')" -- "$HP" bench moe --preset qwen3-30b-a3b --tokens 4 --tokens 8
twice "bench: --reps is given twice" -- "$HP" bench run --preset llama3-8b --reps 1 --reps 2
twice "bench: --tokens is given twice" -- "$HP" bench ep --preset qwen3-30b-a3b --tokens 4 --tokens 8
twice "bench advise: --world is given twice" -- "$HP" bench advise "$W/gl" --world 2 --world 4
check "nothing was written by a refused command" test ! -e "$W/s1" -a ! -e "$W/g2" -a ! -e "$W/g3" -a ! -e "$W/d1" -a ! -e "$W/a"
# --freeze is the repeatable option: both patterns are used.
out=$("$HP" plan "$W/gl" --freeze 'model.embed_tokens.*' --freeze 'nothing.*' 2>&1 >/dev/null); rc=$?
check "--freeze repeats (rc $rc)" test "$rc" -eq 0
check "--freeze: the second pattern is used" grep -qF -- "--freeze 'nothing.*' matched no parameter" <<<"$out"

# ---- usage errors under mpirun: printed once, every rank exits 2 ----
once() { # once NEEDLE -- command...
    local needle="$1"; shift 2
    local out rc
    out=$($MPI -np 2 "$@" 2>&1 </dev/null); rc=$?
    check "mpirun: '$*' exits 2 (rc $rc)" test "$rc" -eq 2
    check "mpirun: '$*' printed once" test "$(grep -cF -- "$needle" <<<"$out")" -eq 1
    check "mpirun: '$*' one error line" test "$(grep -c 'hyperpar: error' <<<"$out")" -eq 1
}
once "give either --plan or the plan flags" -- "$HP" run "$W/gl" --plan "$W/p.json" --tp 2 --input "$W/ids.st"
once "--rtol expects a number in (0, 1], got '-1'" -- "$HP" validate "$W/gl" --rtol -1 --input "$W/ids.st"
once "--input is given twice" -- "$HP" run "$W/gl" --input "$W/ids.st" --input "$W/ids.st"
once "moe: unknown option '--bogus'" -- "$HP" moe "$W/gl" --bogus
once "run: --input needs a value (FILE)" -- "$HP" run "$W/gl" --input
once "--mesh 'tp=x'" -- "$HP" run "$W/gl" --mesh tp=x --input "$W/ids.st"
once "unknown command 'frobnicate'" -- "$HP" frobnicate
once "--layers expects an integer" -- "$HP" gen --family llama --out "$W/gm" --layers 0
# getopt's own complaints are off: ours is the only line, under mpirun too.
out=$($MPI -np 2 "$HP" run "$W/gl" --bogus 2>&1 </dev/null)
check "mpirun: no getopt complaint" test "$(grep -c "unrecognized option\|requires an argument" <<<"$out")" -eq 0
check "mpirun: our unknown-option error once" test "$(grep -cF "run: unknown option '--bogus'" <<<"$out")" -eq 1
# A warning before the ranks agree (the library's: an unknown torch_dtype, with an ESC in it): once, escaped.
cp -r "$W/gl" "$W/gw"
python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["torch_dtype"] = "int8\x1b[1m"; json.dump(c, open(p, "w"))' \
    "$W/gw/config.json"
out=$($MPI -np 2 "$HP" run "$W/gw" --input "$W/ids.st" 2>&1 </dev/null); rc=$?
check "mpirun warning: the run succeeds (rc $rc)" test "$rc" -eq 0
check "mpirun warning: printed once" test "$(grep -c 'torch_dtype "int8\\x1B\[1m" is not one of' <<<"$out")" -eq 1
check "mpirun warning: no raw ESC" bash -c '! LC_ALL=C grep -q $'"'"'\x1b'"'"' <<<"$1"' _ "$out"
# The launcher's variables decide without mpirun too: rank 1 keeps quiet, rank 0 or none prints; all exit 2.
for v in OMPI_COMM_WORLD_RANK PMIX_RANK PMI_RANK; do
    out=$(env "$v=1" "$HP" plan "$W/gl" --tp 2 --tp 4 2>&1); rc=$?
    check "$v=1: exit 2 (rc $rc)" test "$rc" -eq 2
    check "$v=1: says nothing" test -z "$out"
    out=$(env "$v=0" "$HP" plan "$W/gl" --tp 2 --tp 4 2>&1)
    check "$v=0: prints" grep -q "is given twice" <<<"$out"
done

# ---- names from files are escaped in every message ----
noesc() { # noesc NEEDLE -- command...: exit 2, the message quotes the name escaped, no raw ESC anywhere
    local needle="$1"; shift 2
    local out rc
    out=$("$@" 2>&1 </dev/null); rc=$?
    check "escape: '$*' exits 2 (rc $rc)" test "$rc" -eq 2
    check "escape: '$*' quotes '$needle'" grep -qF -- "$needle" <<<"$out"
    check "escape: '$*' no raw ESC or BEL" bash -c '! LC_ALL=C grep -q $'"'"'[\x1b\x07]'"'"' <<<"$1"' _ "$out"
}
for mode in rename extra dtype; do hostile "$W/gl" "$W/e_$mode" $mode; done
ids "$W/ids_esc.st" $'input\x1b[31m_ids'
for mode in rename extra dtype; do
    case $mode in
        rename) needle='up\x1B[31mproj' ;;
        extra) needle='evil\x1B]0;pwned\x07.weight' ;;
        dtype) needle="unknown dtype 'F\\x1B[2J32'" ;;
    esac
    [ $mode = rename ] || noesc "$needle" -- "$HP" inspect "$W/e_$mode"
    noesc "$needle" -- "$HP" plan "$W/e_$mode"
    noesc "$needle" -- "$HP" shard "$W/e_$mode" --tp 2 --out "$W/o_$mode"
    noesc "$needle" -- "$HP" cost "$W/e_$mode"
    noesc "$needle" -- "$HP" run "$W/e_$mode" --input "$W/ids.st"
    noesc "$needle" -- "$HP" validate "$W/e_$mode" --input "$W/ids.st"
done
# An index whose weight_map lists a tensor (with an ESC in its name) that the shard does not hold.
mkdir "$W/e_index" && cp "$W/gl/config.json" "$W/e_index/" && cp "$W/gl/model.safetensors" "$W/e_index/model-00001-of-00001.safetensors"
python3 - "$W/e_index" <<'EOF2'
import json, struct, sys
d = sys.argv[1]
b = open(d + "/model-00001-of-00001.safetensors", "rb").read()
h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
wm = {k: "model-00001-of-00001.safetensors" for k in h if k != "__metadata__"}
wm["ghost\x1b[31m.weight"] = "model-00001-of-00001.safetensors"
json.dump({"metadata": {}, "weight_map": wm}, open(d + "/model.safetensors.index.json", "w"))
EOF2
noesc 'ghost\x1B[31m.weight' -- "$HP" inspect "$W/e_index"
noesc 'ghost\x1B[31m.weight' -- "$HP" plan "$W/e_index" --tp 2
noesc "ids_esc.st" -- "$HP" run "$W/gl" --input "$W/ids_esc.st"
noesc "ids_esc.st" -- "$HP" cost "$W/gl" --input "$W/ids_esc.st"
# A name the user typed is escaped as well (it is echoed in the message).
noesc '--freeze '"'"'x\x1B[2Jy['"'"' is not a valid glob' -- "$HP" plan "$W/gl" --freeze $'x\x1b[2Jy['
# inspect --tensors lists the renamed weight escaped (a backslash doubled).
out=$("$HP" inspect "$W/e_rename" --tensors 2>&1)
check "inspect --tensors: escaped" grep -qF 'up\x1B[31mproj' <<<"$out"
check "inspect --tensors: no raw ESC" bash -c '! LC_ALL=C grep -q $'"'"'\x1b'"'"' <<<"$1"' _ "$out"

# ---- outputs that cannot be written: refused first, the user's path named once ----
unwritable() { # unwritable PATH -- command...
    local path="$1"; shift 2
    local out rc
    out=$("$@" 2>&1 </dev/null); rc=$?
    check "unwritable: '$*' fails (rc $rc)" test "$rc" -ne 0
    check "unwritable: '$*' names $path once" test "$(grep -oF -- "$path" <<<"$out" | wc -l)" -eq 1
    check "unwritable: '$*' never names the temporary" bash -c '! grep -q "\.tmp\." <<<"$1"' _ "$out"
    check "unwritable: '$*' one error" test "$(grep -c 'hyperpar: error' <<<"$out")" -eq 1
    check "unwritable: '$*' refused before any work" bash -c '! grep -q "^run: loss" <<<"$1"' _ "$out"
}
unwritable /sys/x.html -- "$HP" cost "$W/gl" -o /sys/x.html --format html
unwritable /sys/x.txt -- "$HP" cost "$W/gl" --output /sys/x.txt
unwritable /proc/x.json -- "$HP" plan "$W/gl" -o /proc/x.json
unwritable /sys/x.st -- "$HP" run "$W/gl" --input "$W/ids.st" --output /sys/x.st
unwritable /sys/stats.json -- "$HP" run "$W/gl" --input "$W/ids.st" --stats-json /sys/stats.json
unwritable /sys/shards -- "$HP" shard "$W/gl" --tp 2 --out /sys/shards
unwritable /sys/x.html -- "$HP" advise "$W/gl" --world 2 --mem-per-rank 80GB -o /sys/x.html
out=$($MPI -np 2 "$HP" run "$W/gl" --input "$W/ids.st" --output /sys/x.st 2>&1 </dev/null); rc=$?
check "mpirun run --output /sys/x.st: exit 2 (rc $rc)" test "$rc" -eq 2
check "mpirun run --output /sys/x.st: named once" test "$(grep -oF /sys/x.st <<<"$out" | wc -l)" -eq 1
check "mpirun run --output /sys/x.st: before the forward" bash -c '! grep -q "^run: loss" <<<"$1"' _ "$out"
# A read-only file system and a full one (tmpfs mounts; skipped where this process may not mount).
mkdir -p "$W/ro" "$W/full"
if mount -t tmpfs -o size=64k,ro tmpfs "$W/ro" 2>/dev/null; then
    MOUNTS+=("$W/ro")
    unwritable "$W/ro/x.st" -- "$HP" run "$W/gl" --input "$W/ids.st" --output "$W/ro/x.st"
    unwritable "$W/ro/p.json" -- "$HP" plan "$W/gl" -o "$W/ro/p.json"
    unwritable "$W/ro/c.html" -- "$HP" cost "$W/gl" -o "$W/ro/c.html" --format html
    unwritable "$W/ro/shards" -- "$HP" shard "$W/gl" --tp 2 --out "$W/ro/shards"
else
    echo "note: cannot mount a tmpfs here; the read-only file system cases are skipped"
fi
if mount -t tmpfs -o size=64k tmpfs "$W/full" 2>/dev/null; then
    MOUNTS+=("$W/full")
    out=$("$HP" gen --family llama --out "$W/full/g" 2>&1); rc=$?
    # gen measures the free space first: a model that cannot fit is refused before anything is written
    check "gen on a full disk: exit 2 (rc $rc)" test "$rc" -eq 2
    check "gen on a full disk: names the folder and the space" grep -qF "$W/full/g: the model would be" <<<"$out"
    check "gen on a full disk: never the temporary" bash -c '! grep -q "\.tmp\." <<<"$1"' _ "$out"
    check "gen on a full disk: nothing left behind" test -z "$(ls -A "$W/full")"
    dd if=/dev/zero of="$W/full/fill" bs=1k count=100 2>/dev/null
    for c in "cost $W/gl -o $W/full/c.html --format html" "cost $W/gl -o $W/full/c.txt" "plan $W/gl -o $W/full/p.json"; do
        out=$($HP $c 2>&1); rc=$?
        f=${c##*-o }; f=${f%% *}
        check "full disk: $c exits 1 (rc $rc)" test "$rc" -eq 1
        check "full disk: $c names $f once" test "$(grep -oF "$f" <<<"$out" | wc -l)" -eq 1
        check "full disk: $c one error, no temporary" test "$(grep -c 'hyperpar: error' <<<"$out")" -eq 1 -a \
              "$(grep -c '\.tmp\.' <<<"$out")" -eq 0
        check "full disk: $c leaves nothing" test "$(ls -A "$W/full")" = fill
    done
else
    echo "note: cannot mount a tmpfs here; the full-disk cases are skipped"
fi

# ---- gen says nothing about an expert layout for dense families ----
out=$("$HP" gen --family llama --out "$W/dense" 2>&1)
check "gen dense: no layout" bash -c '! grep -q "layout" <<<"$1"' _ "$out"
expect 0 "layout per-expert" -- "$HP" gen --family qwen3_moe --out "$W/sparse"
finish

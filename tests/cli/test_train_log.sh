# hyperpar train, what the user sees: --log-every 3 over 7 steps prints the lines of steps 3, 6 and 7 (and with
# --eval-every the evaluated steps too); the JSON log has every step with mfu, and the printed figures equal the
# log's (tokens/s and mfu as the means over the steps since the previous line); 0 < mfu < 1.5; the start lines name
# the model FLOPs, the GEMM limit and its kernels; no progress line when stderr is a file, one with the ETA on a
# terminal (through script(1), when installed); --plot writes a well-formed self-contained page with one polyline
# point per step of this run (after --stop-after, after --resume, at tp=2), the loss falling on it, a NaN norm
# left out; the page's output checks and bad --log-every values exit 2 and write nothing.
# (test_html.sh renders a --plot page in chromium.)
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
M=data/forward/llama
I="--input $M/forward_io.safetensors"
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe"

# Lines of stderr: "train: step t/N loss" lines' step numbers, one per line.
printed() { grep -o "^train: step [0-9]*/[0-9]* loss" "$1" | sed 's#train: step \([0-9]*\)/.*#\1#' | tr '\n' ' '; }

# page FILE LOSS NORM [EVAL [flat]]: well-formed (every non-void element closed in order), one polyline point per
# step of each curve (LOSS and NORM points, EVAL eval_loss points, 0: none), the falling loss drawn falling (SVG y
# grows downwards; "flat": drawn level), no NaN or Inf in a coordinate, the title and axis names there.
page() {
    python3 - "$@" <<'EOF'
import html.parser, re, sys
path, want = sys.argv[1], {"loss": int(sys.argv[2]), "grad_norm": int(sys.argv[3]),
                           "eval_loss": int(sys.argv[4]) if len(sys.argv) > 4 else 0}
flat = len(sys.argv) > 5 and sys.argv[5] == "flat"
text = open(path).read()
VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "source", "wbr"}
class P(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.stack = []; self.points = {}; self.texts = []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "polyline":
            pts = [tuple(map(float, p.split(","))) for p in a["points"].split()]
            self.points.setdefault(a["data-curve"], []).extend(pts)
        if tag not in VOID: self.stack.append(tag)
    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID: self.stack.pop()
    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, ("unbalanced", tag, self.stack[-3:])
        self.stack.pop()
    def handle_data(self, d): self.texts.append(d)
p = P(); p.feed(text); p.close()
assert not p.stack, ("unclosed", p.stack)
for k, n in want.items():
    got = len(p.points.get(k, []))
    assert got == n, (k, got, n)
loss = p.points["loss"]
if len(loss) > 1 and flat: assert loss[0][1] == loss[-1][1], ("the level loss is not drawn level", loss)
elif len(loss) > 1: assert loss[0][1] < loss[-1][1], ("the falling loss is not drawn falling", loss)
assert not re.search(r"(nan|inf)", " ".join(re.findall(r'points="([^"]*)"', text)), re.I)
body = " ".join(p.texts)
for w in ("hyperpar train: ", "step", "loss", "gradient norm"): assert w in body, w
EOF
}
offline() { # no address but the SVG namespace's, no external resource
    ! sed 's#xmlns="http://www.w3.org/2000/svg"##g' "$1" | grep -Eq 'https?://' &&
        ! grep -Eiq '<(link|img|iframe|object|embed)[ >]|src=|@import|url\(' "$1"
}

# --log-every 3 over 7 steps, stderr to a file (not a terminal). One thread: on a machine loaded past its cores a
# product split over threads waits for a descheduled one, so the limit measured with 2 would be far below what a
# tiny step reaches at times, and MFU's bound would test the machine's load, not the figure.
"$HP" train $M $I --steps 7 --log-every 3 --threads 1 --log-json "$WORK/l.jsonl" --plot "$WORK/p.html" \
    2>"$WORK/err" </dev/null
check "--log-every 3: exit 0" test $? -eq 0
check "--log-every 3 over 7: the lines of steps 3, 6, 7 ($(printed "$WORK/err"))" test "$(printed "$WORK/err")" = "3 6 7 "
check "the model FLOPs and the GEMM limit said once" test "$(grep -c "^train: model FLOPs .* G per step (6 x 8.192e+04 weights per token x 32 tokens); MFU limit .* GFLOP/s: an f32 512^3 GEMM, best of 10 on every rank at once, summed over 1 rank (slowest rank" "$WORK/err")" = 1
check "the limit's kernels said once" test "$(grep -c "^train: GEMM kernels: oneDNN" "$WORK/err")" = 1
check "no progress line when stderr is a file" bash -c '! grep -q "ETA" "$1" && ! grep -q $'"'"'\r'"'"' "$1"' _ "$WORK/err"
check "wrote the page" grep -q "^train: wrote $WORK/p.html (7 steps)" "$WORK/err"
check "log-json: 7 steps with mfu, equal to the printed lines" python3 - "$WORK/l.jsonl" "$WORK/err" 3 <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
every = int(sys.argv[3])
assert [r["step"] for r in rows] == list(range(1, 8)), rows
for r in rows:
    for k in ("loss", "grad_norm", "lr", "tokens_per_s", "step_s", "mfu"):  # %g may print a whole number
        assert isinstance(r[k], (int, float)) and not isinstance(r[k], bool), (k, r)
    assert 0 < r["mfu"] < 1.5, r
    assert abs(r["tokens_per_s"] * r["step_s"] - 30) < 1e-2 * 30, r  # B·(S−1) = 2·15 scored positions
lines = [l for l in open(sys.argv[2]) if re.match(r"train: step \d+/\d+ loss", l)]
pat = re.compile(r"train: step (\d+)/7 loss (\S+) grad-norm (\S+) lr (\S+) tokens/s (\S+) mfu (\S+) \((\S+) s/step\)")
prev = 0
for l in lines:
    m = pat.match(l)
    assert m, l
    t = int(m.group(1)); seg = rows[prev:t]; prev = t
    r = rows[t - 1]
    # the same figures, up to the printed digits (7 for the loss, 6 for the norm and lr)
    for g, k, rel in ((2, "loss", 1e-6), (3, "grad_norm", 1e-5), (4, "lr", 1e-5)):
        assert abs(float(m.group(g)) - r[k]) <= rel * abs(r[k]), (l, k, r)
    secs = sum(x["step_s"] for x in seg)
    tps = sum(x["tokens_per_s"] * x["step_s"] for x in seg) / secs
    mfu = sum(x["mfu"] * x["step_s"] for x in seg) / secs
    assert abs(float(m.group(5)) - tps) <= 1e-3 * tps + 0.1, (l, tps)
    assert abs(float(m.group(6)) - mfu) <= 1e-3 * mfu, (l, mfu)
    assert abs(float(m.group(7)) - secs / len(seg)) <= 1e-3 * secs + 5e-4, (l, secs / len(seg))
    assert 0 < float(m.group(6)) < 1.5, l
assert prev == 7
EOF
check "the page: well-formed, 7 points per curve, the loss falling" page "$WORK/p.html" 7 7
check "the page: body data-hp-ok=\"1\", an <svg>" grep -q '<body data-hp-ok="1">.*' "$WORK/p.html"
check "the page: no network address, no external resource" offline "$WORK/p.html"
check "the page: the title names the model and the mesh" grep -q "<h1>hyperpar train: $M on dp=1,cp=1,tp=1" "$WORK/p.html"

# One step: one point per curve, one tick on the step axis.
expect 0 "train: wrote $WORK/one.html (1 step)" -- "$HP" train $M $I --plot "$WORK/one.html"
check "one step: one point per curve" page "$WORK/one.html" 1 1
check "one step: its step the only tick" test "$(grep -c '<text [^>]*text-anchor="middle">1</text>' "$WORK/one.html")" = 2

# --data with --eval-every 3, --log-every 4 over 6 steps: lines at 3 (evaluated), 4, 6; the eval curve has 2 points.
python3 - "$WORK" <<'EOF'
import struct, sys
t = [(i * 5 + i // 7) % 128 for i in range(193)]
open(sys.argv[1] + "/f.bin", "wb").write(struct.pack("<193H", *t))
open(sys.argv[1] + "/e.bin", "wb").write(struct.pack("<33H", *t[:33]))
EOF
D="--data $WORK/f.bin --seq 15 --global-batch 4 --steps 6 --shuffle none"
"$HP" train $M $D --eval-data "$WORK/e.bin" --eval-every 3 --log-every 4 --plot "$WORK/e.html" 2>"$WORK/err" </dev/null
check "--eval-every 3 --log-every 4: the lines of steps 3, 4, 6 ($(printed "$WORK/err"))" test "$(printed "$WORK/err")" = "3 4 6 "
check "--eval-every 3: two eval lines" test "$(grep -c "eval loss" "$WORK/err")" = 2
check "the eval page: 6 loss and norm points, 2 eval points" page "$WORK/e.html" 6 6 2
check "the eval page: its key" grep -q "eval loss (--eval-data)" "$WORK/e.html"

# A skipped step always has its line; its NaN norm is left out of the curve.
HP_TEST_NAN_GRAD=model.norm.weight "$HP" train $M $I --steps 3 --log-every 5 --skip-nonfinite --plot "$WORK/nan.html" \
    2>"$WORK/err" </dev/null
check "--skip-nonfinite: every skipped step printed ($(printed "$WORK/err"))" test "$(printed "$WORK/err")" = "1 2 3 "
check "the NaN page: well-formed, 3 level loss points (no update), no norm point" page "$WORK/nan.html" 3 0 0 flat
check "the NaN page: says there is nothing finite to draw" grep -q "No finite value to draw" "$WORK/nan.html"

# --stop-after and --resume: the page holds the steps this run took.
expect 0 "train: wrote $WORK/s.html (2 steps)" -- "$HP" train $M $I --steps 4 --save-every 2 --stop-after 2 \
    --out "$WORK/run" --plot "$WORK/s.html"
check "--stop-after 2: 2 points" page "$WORK/s.html" 2 2
expect 0 "train: wrote $WORK/r.html (2 steps)" -- "$HP" train $M $I --steps 4 --save-every 2 --resume "$WORK/run" \
    --out "$WORK/run" --plot "$WORK/r.html"
check "--resume: 2 points, steps 3 to 4" page "$WORK/r.html" 2 2
check "--resume: the summary says so" grep -q "Steps 3 to 4 of 4, taken on 1 process after --resume" "$WORK/r.html"
# (--grad-out with --save-every: the run folder is not renamed, so G may be anywhere)
expect 0 "train: wrote $WORK/g.st" -- "$HP" train $M $I --steps 2 --save-every 1 --out "$WORK/run2" --grad-out "$WORK/g.st"

# tp=2: the lines, mfu and the page from rank 0.
$MPI -np 2 "$HP" train $M $I --tp 2 --steps 3 --log-every 2 --log-json "$WORK/tp.jsonl" --plot "$WORK/tp.html" \
    2>"$WORK/err" </dev/null
check "tp=2: exit 0 and the lines of steps 2, 3 ($(printed "$WORK/err"))" test "$(printed "$WORK/err")" = "2 3 "
check "tp=2: the limit is the sum over 2 ranks" grep -q "summed over 2 ranks (slowest rank" "$WORK/err"
check "tp=2: no progress line" bash -c '! grep -q "ETA" "$1"' _ "$WORK/err"
check "tp=2: 0 < mfu < 1.5" python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 3 and all(0 < x["mfu"] < 1.5 for x in r), r' "$WORK/tp.jsonl"
check "tp=2: the page has 3 points and names the mesh" bash -c 'grep -q "on dp=1,cp=1,tp=2" "$1"' _ "$WORK/tp.html"
check "tp=2: the page's curves" page "$WORK/tp.html" 3 3

# On a terminal (a pseudo-terminal from script(1)): the progress line with the ETA, rewritten in place.
if command -v script >/dev/null; then
    script -qec "'$HP' train $M $I --steps 4 --log-every 2" /dev/null >"$WORK/tty" 2>&1 </dev/null
    check "terminal: a progress line with the elapsed time and the ETA" grep -q "train: step 1/4, [0-9:]* elapsed, ETA [0-9:]*" "$WORK/tty"
    check "terminal: rewritten in place (carriage returns)" grep -q $'\r ' "$WORK/tty"
    check "terminal: the step lines still there ($(tr -d '\r' <"$WORK/tty" | printed /dev/stdin))" \
        test "$(tr -d '\r' <"$WORK/tty" | grep -o "train: step [0-9]*/4 loss" | wc -l)" = 2
else
    echo "SKIP script(1) not installed: the progress line on a terminal is not checked"
fi

# Errors: exit 2 with the reason, nothing written.
for bad in 0 -1 abc 1.5 ""; do
    expect 2 "--log-every expects a whole number of steps in [1, 1000000000], got '$bad'" -- "$HP" train $M $I --log-every "$bad"
done
expect 2 "--plot and --log-json name the same file $WORK/x.html" -- "$HP" train $M $I --plot "$WORK/x.html" --log-json "$WORK/x.html"
expect 2 "--plot and --grad-out name the same file $WORK/x.html" -- "$HP" train $M $I --plot "$WORK/x.html" --grad-out "$WORK/x.html"
expect 2 "--plot and --stats-json name the same file $WORK/y.json" -- "$HP" train $M $I --plot "$WORK/y.json" --stats-json "$WORK/./y.json"
check "one file spelled two ways: nothing written" test ! -e "$WORK/y.json"
expect 2 "is one of the inputs" -- "$HP" train $M $I --plot $M/config.json
expect 2 "the folder '$WORK/nodir/' does not exist" -- "$HP" train $M $I --plot "$WORK/nodir/p.html"
expect 2 "is a folder" -- "$HP" train $M $I --plot "$WORK"
mkdir "$WORK/empty"
expect 2 "--plot $WORK/empty/p.html is or lies inside --out $WORK/empty" -- "$HP" train $M $I --out "$WORK/empty" --plot "$WORK/empty/p.html"
check "nothing written by the refused runs" bash -c '! ls "$1" | grep -q "^x.html\|nodir" && test -z "$(ls -A "$1/empty")"' _ "$WORK"
expect 0 "--log-every N" -- "$HP" train --help
expect 0 "--plot FILE.html" -- "$HP" train --help
finish

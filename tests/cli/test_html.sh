# test_html.sh — the HTML pages of cost, advise and train --plot (tools/html.c): each is one self-contained page (inline SVG,
# no network address but the SVG namespace, the static data-hp-ok mark on <body>), and when chromium is
# installed it renders without a script error (no data-hp-error in the DOM) to a screenshot that is not blank
# (>= 1% non-white pixels, >= 4 distinct colours). The pages come from the unit program test_html (HP_TEST_HTML,
# set by tests/CMakeLists.txt) and, once `hyperpar cost|advise --format html` exist, from the CLI too.
# Without chromium the render is skipped (SKIP), unless HP_REQUIRE_CHROMIUM=1 (CI), which makes it a failure.
source "$(dirname "$0")/lib.sh"
cd "$TESTS"
UNIT="${HP_TEST_HTML:-$(dirname "$HP")/tests/test_html}"
PAGES=()

check "the unit program $UNIT exists" test -x "$UNIT"
expect 0 "" -- "$UNIT" "$WORK/cost.html" "$WORK/advise.html"
PAGES+=(cost advise)
# The CLI's own pages, once it writes them.
if "$HP" cost --help 2>&1 | grep -q html; then
    expect 0 "" -- "$HP" cost data/forward/llama --tp 2 --format html -o "$WORK/cli_cost.html"
    PAGES+=(cli_cost)
fi
if "$HP" advise --help 2>&1 | grep -q html; then
    expect 0 "" -- "$HP" advise data/forward/llama --world 4 --mem-per-rank 1GiB --format html -o "$WORK/cli_advise.html"
    PAGES+=(cli_advise)
fi
# An EP plan (what differs between ranks: their experts), and decode (serving) on both pages.
expect 0 "" -- "$HP" cost data/forward/qwen2_moe --dp 2 --tp 2 --ep 4 --overrides data/overrides/qwen2_moe_ep.yaml \
    --format html -o "$WORK/cli_cost_ep.html"
expect 0 "" -- "$HP" cost data/forward/llama --tp 2 --mode decode --context 64 --batch 4 --mem-per-rank 1GiB \
    --format html -o "$WORK/cli_cost_decode.html"
expect 0 "" -- "$HP" advise data/configs/llama-3-8b.json --world 8 --mem-per-rank 80GB --mode decode --batch 64 \
    --context 8192 --format html -o "$WORK/cli_advise_decode.html"
expect 0 "" -- "$HP" advise data/configs/mixtral-8x7b.json --world 8 --mem-per-rank 80GB --batch 8 --seq 1024 \
    --format html -o "$WORK/cli_advise_moe.html"
PAGES+=(cli_cost_ep cli_cost_decode cli_advise_decode cli_advise_moe)
if "$HP" train --help 2>&1 | grep -q -- "--plot"; then
    expect 0 "" -- "$HP" train data/forward/llama --input data/forward/llama/forward_io.safetensors --steps 4 --clip 4 \
        --plot "$WORK/cli_train.html"
    PAGES+=(cli_train)
fi

# No address but the SVG namespace's, which every <svg> carries.
offline() {
    local rest
    rest=$(sed 's#xmlns="http://www.w3.org/2000/svg"##g' "$1" | grep -Eo 'https?://' | head -1)
    [ -z "$rest" ]
}
for p in "${PAGES[@]}"; do
    f="$WORK/$p.html"
    check "$p: written" test -s "$f"
    check "$p: has an <svg>" grep -q '<svg' "$f"
    check "$p: body data-hp-ok=\"1\"" grep -qF '<body data-hp-ok="1">' "$f"
    check "$p: no network address" offline "$f"
    check "$p: no external resource" bash -c '! grep -Eiq "<(link|img|iframe|object|embed)[ >]|src=|@import|url\(" "$1"' _ "$f"
done

# Every legend entry of a page has its own colour (<span class="key"><i style="background:C"></i>label</span>).
legend_distinct() {
    python3 - "$1" <<'PY'
import re, sys
keys = re.findall(r'<span class="key"><i style="background:([^"]+)"></i>([^<]*)</span>', open(sys.argv[1]).read())
cols = [c.lower() for c, _ in keys]
dup = sorted({c for c in cols if cols.count(c) > 1})
if dup or len(keys) < 3:
    print("legend", keys, "shares", dup)
sys.exit(0 if keys and not dup and len(keys) >= 3 else 1)
PY
}
# No word-wrapping inside a token: identifiers keep-all, numbers and commands nowrap, every table in a scroller.
no_wrap() {
    python3 - "$1" <<'PY'
import re, sys
p = open(sys.argv[1]).read()
style = p[p.index("<style>"):p.index("</style>")]
ok = "word-break:keep-all" in style and re.search(r"code[^{]*\{[^}]*white-space:nowrap", style) is not None
ok &= "td.n{text-align:right;white-space:nowrap}" in style and "overflow-x:auto" in style
ok &= "break-all" not in style and p.count("<table") == p.count('<div class="scroll"><table')
sys.exit(0 if ok else 1)
PY
}
for p in "${PAGES[@]}"; do
    case "$p" in cli_train) continue ;; esac
    check "$p: every legend entry its own colour" legend_distinct "$WORK/$p.html"
    check "$p: no word-wrapping inside a token" no_wrap "$WORK/$p.html"
done
# The EP plan's page lists every rank with its experts: the EP slots' blocks of the experts, each once, covering
# them all (qwen2_moe's experts over ep=4 TP-extend: slot = rank), and the grid names each rank's slot.
check "EP page: every rank with its experts" python3 - "$WORK/cli_cost_ep.html" data/forward/qwen2_moe/config.json <<'PY'
import json, re, sys
p = open(sys.argv[1]).read(); E = json.load(open(sys.argv[2]))["num_experts"]
rows = dict(re.findall(r'<tr data-rank="(\d+)">.*?<td class="experts">([^<]*)</td>', p))
ok = sorted(map(int, rows)) == [0, 1, 2, 3]
covered = []
for r, cell in rows.items():
    m = re.fullmatch(r"EP slot (\d+)/4: experts (\d+)\.\.(\d+) \((\d+) of (\d+)\)", cell)
    q, a, b, n, e = map(int, m.groups()) if m else (-1,) * 5
    ok &= m is not None and q == int(r) and a == E * q // 4 and b == E * (q + 1) // 4 - 1 and n == b - a + 1 and e == E
    covered += range(a, b + 1)
ok &= sorted(covered) == list(range(E)) and all(f">e{q}</text>" in p for q in range(4))
ok &= all(f"tp {t}/2 of heads" in p for t in range(2)) and "dp 1/2" in p
sys.exit(0 if ok else 1)
PY
# Step-time bars: two meshes with different times have bars of different lengths, longer for slower, equal for equal.
bars_differ() {
    python3 - "$1" <<'PY'
import re, sys
bars = [(float(t), float(w)) for t, w in re.findall(r'<rect data-step="([^"]+)" x="[^"]+" y="[^"]+" width="([^"]+)"',
                                                     open(sys.argv[1]).read())]
ok = len({t for t, _ in bars}) >= 2
for t1, w1 in bars:
    for t2, w2 in bars:
        ok &= (t1 < t2) == (w1 < w2) and (t1 == t2) == (w1 == w2)
sys.exit(0 if ok else 1)
PY
}
for p in cli_advise cli_advise_decode cli_advise_moe; do
    check "$p: step-time bars differ as the times do" bars_differ "$WORK/$p.html"
done
check "decode cost page: its figures" grep -q "sequences that fit in 1.00 GiB per rank: " "$WORK/cli_cost_decode.html"
check "decode cost page: what bounds the step" grep -Eq "(memory|compute)-bound" "$WORK/cli_cost_decode.html"
check "decode advise page: its columns" grep -q "<th>sequences that fit\\*</th>" "$WORK/cli_advise_decode.html"

# Share of non-white pixels and distinct colours of a PNG (8-bit RGB or RGBA, not interlaced), stdlib only.
png_stats() {
    python3 - "$1" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, hdr = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR": hdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT": idat += body
    elif kind == b"IEND": break
    pos += 12 + n
w, h, depth, ctype, _, _, interlace = hdr
assert depth == 8 and ctype in (2, 6) and interlace == 0, "unsupported PNG %r" % (hdr,)
bpp = 3 if ctype == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
def unfilter(ft, line, prev):
    if ft == 0: return line
    if ft == 2: return bytearray((x + y) & 255 for x, y in zip(line, prev))
    if ft == 1 or ft == 3 or ft == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            if ft == 1: line[i] = (line[i] + a) & 255
            elif ft == 3: line[i] = (line[i] + (a + prev[i]) // 2) & 255
            else:
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        return line
    raise SystemExit("bad PNG filter %d" % ft)
prev, pos, nonwhite, colours = bytearray(stride), 0, 0, set()
for _ in range(h):
    line = unfilter(raw[pos], bytearray(raw[pos + 1:pos + 1 + stride]), prev)
    pos += 1 + stride
    px = [bytes(line[i:i + 3]) for i in range(0, stride, bpp)]
    colours.update(px)
    nonwhite += len(px) - px.count(b"\xff\xff\xff")
    prev = line
print("%.2f %d" % (100.0 * nonwhite / (w * h), len(colours)))
PY
}

CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
    echo "SKIP chromium not installed"
    check "chromium installed (HP_REQUIRE_CHROMIUM=1)" test "${HP_REQUIRE_CHROMIUM:-0}" != 1
    finish
    exit
fi
# A fresh profile per run; --no-sandbox because CI runs as root.
chrome() {
    timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
        --user-data-dir="$WORK/prof" --window-size=1280,1600 "$@" 2>>"$WORK/chromium.log" </dev/null
}
for p in "${PAGES[@]}"; do
    f="$WORK/$p.html"
    chrome --dump-dom "file://$f" >"$WORK/$p.dom"
    check "$p: chromium loads it (rc $?)" grep -q '</html>' "$WORK/$p.dom"
    check "$p: DOM has data-hp-ok=\"1\"" grep -qF 'data-hp-ok="1"' "$WORK/$p.dom"
    check "$p: no script error (data-hp-error on <body>)" bash -c '! grep -qF "data-hp-error=\"1\"" "$1"' _ "$WORK/$p.dom"
    rm -f "$WORK/x.png"
    chrome --screenshot="$WORK/x.png" "file://$f" >/dev/null
    check "$p: screenshot written" test -s "$WORK/x.png"
    stats=$(png_stats "$WORK/x.png" 2>&1)
    read -r pct colours <<<"$stats"
    echo "$p: rendered 1280x1600, ${pct:-?}% non-white pixels, ${colours:-?} distinct colours"
    check "$p: not blank (>= 1% non-white: $stats)" awk -v p="${pct:-0}" 'BEGIN { exit !(p + 0 >= 1) }'
    check "$p: >= 4 distinct colours ($stats)" test "${colours:-0}" -ge 4 2>/dev/null
done
[ "$FAILED" -eq 0 ] || tail -20 "$WORK/chromium.log"
finish

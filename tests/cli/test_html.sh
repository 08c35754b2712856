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

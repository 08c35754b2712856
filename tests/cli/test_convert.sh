# convert and inspect of GGUF files, with no Python package needed (the file is built with struct here): a tiny
# llama converts, inspect reads it, run takes the folder; usage errors; hostile and foreign files exit 2 naming the
# cause, and nothing is left behind. The numbers against transformers and the gguf package are in
# tests/python/test_gguf_convert.py.
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
# tiny.gguf: a one-layer llama (hidden 64, 2 heads of 32, 1 kv head, feed-forward 64, tied), a byte-level
# vocabulary of 4 tokens with one merge; F32 weights (a Q8_0 embedding) from a fixed formula.
python3 - <<'PY'
import struct

def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b

kv = []
def add(key, t, payload):
    kv.append(s(key) + struct.pack("<I", t) + payload)

add("general.architecture", 8, s("llama"))
for k, v in (("context_length", 64), ("embedding_length", 64), ("block_count", 1), ("feed_forward_length", 64),
             ("attention.head_count", 2), ("attention.head_count_kv", 1)):
    add("llama." + k, 4, struct.pack("<I", v))
add("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5))
add("tokenizer.ggml.model", 8, s("gpt2"))
add("tokenizer.ggml.pre", 8, s("gpt-2"))
toks = ["a", "b", "ab", "<|end|>"]
add("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(s(t) for t in toks))
add("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 4) + struct.pack("<4i", 1, 1, 1, 3))
add("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + s("a b"))
add("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 3))

shapes = [("token_embd.weight", [64, 4], 8), ("output_norm.weight", [64], 0), ("blk.0.attn_norm.weight", [64], 0),
          ("blk.0.ffn_norm.weight", [64], 0), ("blk.0.attn_q.weight", [64, 64], 0),
          ("blk.0.attn_k.weight", [64, 32], 0), ("blk.0.attn_v.weight", [64, 32], 0),
          ("blk.0.attn_output.weight", [64, 64], 0), ("blk.0.ffn_gate.weight", [64, 64], 0),
          ("blk.0.ffn_up.weight", [64, 64], 0), ("blk.0.ffn_down.weight", [64, 64], 0)]
infos, data = [], b""
for i, (name, ne, t) in enumerate(shapes):
    n = 1
    for d in ne:
        n *= d
    if t == 8:  # Q8_0: per block of 32 an f16 scale 1/64 (0x2400), then q = (j % 7) - 3
        blob = b"".join(struct.pack("<H", 0x2400) + bytes(((j % 7) - 3) & 0xff for j in range(32)) for _ in range(n // 32))
    else:
        blob = struct.pack("<%df" % n, *[1.0 if len(ne) == 1 else ((k * 7 + i) % 13 - 6) / 50.0 for k in range(n)])
    infos.append(s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) +
                 struct.pack("<IQ", t, len(data)))
    data += blob + b"\0" * (-len(blob) % 32)
head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kv)) + b"".join(kv) + b"".join(infos)
head += b"\0" * (-len(head) % 32)
open("tiny.gguf", "wb").write(head + data)
open("trunc.gguf", "wb").write((head + data)[:len(head) + 100])
big = bytearray(head + data)
big[8:16] = struct.pack("<Q", 1 << 60)  # tensor_count
open("count.gguf", "wb").write(bytes(big))
open("notgguf.gguf", "wb").write(b"PK\x03\x04" + b"\0" * 60)
PY

expect 0 "wrote hf (11 tensors" -- "$HP" convert tiny.gguf --out hf
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
    check "convert wrote $f" test -s "hf/$f"
done
expect 0 "\"tie_word_embeddings\": true" -- cat hf/config.json
expect 0 "architecture  LlamaForCausalLM" -- "$HP" inspect hf
expect 0 "Q8_0" -- "$HP" inspect tiny.gguf
expect 0 "model.layers.0.self_attn.k_proj.weight F32 [32, 64] <- blk.0.attn_k.weight (rotary rows permuted)" -- "$HP" inspect tiny.gguf --tensors
expect 0 "\"gguf_type\": \"Q8_0\"" -- "$HP" inspect tiny.gguf --json --tensors
expect 0 "loss" -- "$HP" run hf --ids "0,1,2,3,2"
expect 0 "" -- "$HP" convert tiny.gguf --out f32 --dtype f32
expect 0 "\"torch_dtype\": \"float32\"" -- cat f32/config.json
# an existing output: refused; --force replaces an earlier convert output only
expect 2 "convert: --out hf is not empty" -- "$HP" convert tiny.gguf --out hf
expect 0 "" -- "$HP" convert tiny.gguf --out hf --force
mkdir mine && echo keep > mine/notes.txt
expect 2 "is not empty and was not written by hyperpar" -- "$HP" convert tiny.gguf --out mine --force
check "a folder convert did not write stays as it was" test "$(ls mine)" = notes.txt
# usage
expect 2 "convert: expected MODEL.gguf" -- "$HP" convert --out x
expect 2 "convert: --out DIR is required" -- "$HP" convert tiny.gguf
expect 2 "--dtype must be bf16 or f32, got 'f16'" -- "$HP" convert tiny.gguf --out x --dtype f16
expect 2 "--expert-layout describes a config.json" -- "$HP" inspect tiny.gguf --expert-layout batched
# hostile and foreign files: exit 2 naming the file and the field; nothing written
expect 2 "trunc.gguf: tensor 'token_embd.weight': its 272 bytes at offset 0 run past the end of the 100-byte data section" -- "$HP" convert trunc.gguf --out x
expect 2 "trunc.gguf: tensor '" -- "$HP" inspect trunc.gguf
expect 2 "count.gguf: the header claims 1152921504606846976 tensors" -- "$HP" convert count.gguf --out x
expect 2 "not the GGUF magic 'GGUF'; not a GGUF file" -- "$HP" convert notgguf.gguf --out x
expect 2 "missing.gguf: cannot open" -- "$HP" convert missing.gguf --out x
check "nothing left behind" test ! -e x
check "no temporary folder" test -z "$(ls -d ./*.tmp.* 2>/dev/null)"
# A signal while model.safetensors is written (HP_TEST_PAUSE_MID_WRITE holds the writer at that point): the
# signal's exit status, and neither the folder nor its temporary stays.
set -m # background runs keep SIGINT
for sig in INT TERM; do
    HP_TEST_PAUSE_MID_WRITE="$WORK/p$sig" "$HP" convert tiny.gguf --out "sig$sig" >"p$sig.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do [ -e "$WORK/p$sig.ready" ] || ! kill -0 $pid 2>/dev/null && break; sleep 0.1; done
    check "SIG$sig: convert reached the pause point" test -e "$WORK/p$sig.ready"
    kill -s $sig $pid
    wait $pid; rc=$?
    check "SIG$sig: exit status $((128 + $(kill -l $sig))) (got $rc)" test "$rc" -eq $((128 + $(kill -l $sig)))
    check "SIG$sig: says it was interrupted" grep -q "interrupted by signal" "p$sig.log"
    check "SIG$sig: no folder, no temporary" test ! -e "sig$sig" -a -z "$(ls -d ./sig$sig.tmp.* 2>/dev/null)"
done
finish

"""to_bf16.py SRC DST: a safetensors file with every F32 tensor rounded to BF16 (nearest even), others as they are.

Tests use it to turn `hyperpar train --out`'s f32 master weights into the bf16 checkpoint the forward reads."""
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n]); base = 8 + n
h.pop('__metadata__', None); out = {}; blobs = []; off = 0
for k in sorted(h, key=lambda k: h[k]['data_offsets'][0]):
    v = h[k]; lo, hi = v['data_offsets']; raw = b[base+lo:base+hi]
    if v['dtype'] == 'F32':
        us = struct.unpack('<%dI' % (len(raw)//4), raw)
        raw = struct.pack('<%dH' % len(us), *[((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff for u in us])
        dt = 'BF16'
    else: dt = v['dtype']
    out[k] = {'dtype': dt, 'shape': v['shape'], 'data_offsets': [off, off+len(raw)]}; blobs.append(raw); off += len(raw)
hb = json.dumps(out).encode(); hb += b' ' * ((8 - len(hb) % 8) % 8)
open(dst, 'wb').write(struct.pack('<Q', len(hb)) + hb + b''.join(blobs))

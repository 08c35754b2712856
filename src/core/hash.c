/*
 * hash.c — hyperpar's one 64-bit hash of bytes (hp_hash64: XXH64, Yann Collet's xxHash 64-bit variant,
 * streaming), and FNV-1a 64 (hp_fnv1a64) kept only for values that files already store.
 *
 * hp_hash64 forms every 64-bit hash in the library: shard folder identities and rank-file checksums
 * (docs/shard-format.md specifies XXH64 there, so its values are part of the format), the ranks' agreement
 * fingerprints, the MoE weight identities, the input-ids check and the in-memory name tables.
 *
 * Why XXH64: a rank-file checksum is computed over every byte hyperpar writes (and `merge --verify` reads
 * them all again), so the hash must run at memory speed; XXH64 does ~10 GB/s on one core, where FNV-1a is
 * byte-serial (~1 GB/s) and SHA-256 without hardware support ~0.5 GB/s. It detects accidents (a rank file of
 * another folder, a truncated or bit-flipped file), not an adversary: it is not a cryptographic hash.
 *
 * State: four lanes over 32-byte stripes plus a buffer of up to 31 pending bytes; the digest is the same
 * as the reference XXH64(data, len, seed) whatever the pieces the data arrives in.
 */
#include <string.h>

#include "hyperpar/core.h"

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static uint64_t xround(uint64_t acc, uint64_t in)
{
    acc += in * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static uint64_t xmerge(uint64_t acc, uint64_t v)
{
    acc ^= xround(0, v);
    return acc * P1 + P4;
}

/* The four lanes' start from the seed. */
static void lanes_init(uint64_t v[4], uint64_t seed)
{
    v[0] = seed + P1 + P2, v[1] = seed + P2, v[2] = seed, v[3] = seed - P1;
}

/* One 32-byte stripe p into the lanes. */
static void stripe(uint64_t v[4], const uint8_t *p)
{
    for (int i = 0; i < 4; i++) v[i] = xround(v[i], rd64(p + 8 * i));
}

void hp_hash64_init(hp_hash64 *s, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    lanes_init(s->v, seed);
    s->seed = seed;
}

void hp_hash64_update(hp_hash64 *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->total += n;
    if (s->n_buf + n < 32) {
        memcpy(s->buf + s->n_buf, p, n);
        s->n_buf += (unsigned)n;
        return;
    }
    if (s->n_buf) {
        size_t take = 32 - s->n_buf;
        memcpy(s->buf + s->n_buf, p, take);
        stripe(s->v, s->buf);
        p += take;
        n -= take;
        s->n_buf = 0;
    }
    for (; n >= 32; p += 32, n -= 32) stripe(s->v, p);
    memcpy(s->buf, p, n);
    s->n_buf = (unsigned)n;
}

/* The four lanes folded into one (inputs of 32 bytes or more). */
static uint64_t lanes_fold(const uint64_t v[4])
{
    uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    for (int i = 0; i < 4; i++) h = xmerge(h, v[i]);
    return h;
}

/* The last n < 32 bytes p mixed into h, then the avalanche. */
static uint64_t finish(uint64_t h, const uint8_t *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        h ^= xround(0, rd64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (n >= 4) {
        h ^= (uint64_t)rd32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) {
        h ^= (*p) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t hp_hash64_final(const hp_hash64 *s)
{
    uint64_t h = s->total >= 32 ? lanes_fold(s->v) : s->seed + P5;
    return finish(h + s->total, s->buf, s->n_buf);
}

/* One pass straight over data, no state buffer: short keys (names, segments) are hashed often. */
uint64_t hp_hash64_bytes(const void *data, size_t n, uint64_t seed)
{
    const uint8_t *p = data;
    if (n < 32) return finish(seed + P5 + n, p, n);
    uint64_t v[4];
    lanes_init(v, seed);
    size_t left = n;
    for (; left >= 32; p += 32, left -= 32) stripe(v, p);
    return finish(lanes_fold(v) + n, p, left);
}

/* FNV-1a 64: byte-serial, h = (h ^ byte) * prime. Only where a file already stores its value. */
uint64_t hp_fnv1a64(uint64_t h, const void *data, size_t n)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * HP_FNV1A64_PRIME;
    return h;
}

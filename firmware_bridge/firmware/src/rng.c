/* Philox4x32-10 (Salmon et al., SC'11) and the draws built on it (docs/serial-protocol.md,
 * "The generator"); testbed/streams/counter_rng.py is the same in numpy. */
#include <math.h>

#include "fw.h"

void tb_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void tb_stream_init(tb_stream *s, uint64_t seed, uint32_t node, uint32_t round, uint32_t purpose) {
    s->key[0] = (uint32_t)seed;
    s->key[1] = (uint32_t)(seed >> 32);
    s->node = node;
    s->round = round;
    s->purpose = purpose;
    s->block = 0;
    s->used = 4;
}

uint32_t tb_next_word(tb_stream *s) {
    if (s->used == 4) {
        uint32_t ctr[4] = {s->block++, s->node, s->round, s->purpose};
        tb_philox(ctr, s->key, s->words);
        s->used = 0;
    }
    return s->words[s->used++];
}

uint32_t tb_uniform_below(tb_stream *s, uint32_t m) {
    uint64_t prod = (uint64_t)tb_next_word(s) * m;
    uint32_t low = (uint32_t)prod;
    if (low < m) {
        uint32_t threshold = (uint32_t)(0u - m) % m;
        while (low < threshold) {
            prod = (uint64_t)tb_next_word(s) * m;
            low = (uint32_t)prod;
        }
    }
    return (uint32_t)(prod >> 32);
}

void tb_gaussians(tb_stream *s, float *out, uint32_t count) {
    const float u24 = 1.0f / 16777216.0f, two_pi = 6.2831855f;
    for (uint32_t k = 0; k < count; k += 2) {
        uint32_t w0 = tb_next_word(s), w1 = tb_next_word(s);
        float u = (float)((w0 >> 8) + 1u) * u24, v = (float)(w1 >> 8) * u24;
        float r = sqrtf(-2.0f * logf(u)), a = two_pi * v;
        out[k] = r * cosf(a);
        if (k + 1 < count) out[k + 1] = r * sinf(a);
    }
}

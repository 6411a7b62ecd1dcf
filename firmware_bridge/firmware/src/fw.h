/* The portable firmware: framing, generator, node step, protocol loop (no heap, C99). */
#ifndef TB_FW_H
#define TB_FW_H

#include <stddef.h>
#include <stdint.h>

/* Capacity; a board's build may lower these (-DTB_MAX_ROWS=...) to fit its RAM. */
#ifndef TB_MAX_ROWS
#define TB_MAX_ROWS 2048
#endif
#ifndef TB_MAX_FEATURES
#define TB_MAX_FEATURES 32
#endif
#ifndef TB_MAX_CLASSES
#define TB_MAX_CLASSES 8
#endif
#ifndef TB_MAX_BATCH
#define TB_MAX_BATCH 64
#endif
#ifndef TB_MAX_PAYLOAD
#define TB_MAX_PAYLOAD 512
#endif
#ifndef TB_RX_CREDITS
#define TB_RX_CREDITS 2
#endif
#define TB_MAX_PARAMS (TB_MAX_FEATURES * TB_MAX_CLASSES + TB_MAX_CLASSES)

#define TB_FW_MAJOR 1
#define TB_FW_MINOR 0
#define TB_FW_PATCH 0
#define TB_PROTOCOL 1
#define TB_FORMAT_F32LE 1

/* Frame types (docs/serial-protocol.md). */
enum { T_HELLO = 1, T_PROVISION = 2, T_ROUND = 3, T_UPDATE = 4, T_LOG = 5, T_ERROR = 6, T_ACK = 7 };
/* Status and error codes. */
enum {
    E_OK = 0, E_BAD_CRC = 1, E_BAD_VERSION = 2, E_OVERSIZE = 3, E_TRUNCATED = 4, E_BAD_PAYLOAD = 5,
    E_UNKNOWN_TYPE = 6, E_TOO_LARGE = 7, E_NO_DATA = 8, E_BAD_DATA = 9, E_NO_ROUND = 10, E_BAD_MODEL = 11
};

#define TB_HEADER 6
#define TB_CRC 4

/* frame.c */
uint32_t tb_crc32(uint32_t crc, const uint8_t *p, size_t n); /* start with 0; zlib's CRC-32 */
size_t tb_cobs_encode(const uint8_t *in, size_t n, uint8_t *out);  /* out: n + n/254 + 1 bytes */
size_t tb_cobs_decode(const uint8_t *in, size_t n, uint8_t *out);  /* 0 on a malformed input */

/* rng.c: Philox4x32-10 streams keyed by (seed, node, round, purpose). */
enum { PURPOSE_BATCH = 3, PURPOSE_NOISE = 4 };
typedef struct {
    uint32_t key[2], node, round, purpose, block, words[4];
    unsigned used;
} tb_stream;
void tb_stream_init(tb_stream *s, uint64_t seed, uint32_t node, uint32_t round, uint32_t purpose);
uint32_t tb_next_word(tb_stream *s);
uint32_t tb_uniform_below(tb_stream *s, uint32_t m);
/* the next count normals of the stream, in (cos, sin) pairs: an odd count drops the last sine */
void tb_gaussians(tb_stream *s, float *out, uint32_t count);
void tb_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* step.c */
typedef struct {
    uint64_t seed;
    uint32_t node, round;
    uint16_t tau, batch;
    float lr, sigma;
} tb_task;
/* tau steps of DP-PASGD on logistic regression; theta (P = d*C + C) updated in place; cycles spent
 * per step added to *cycles. Returns 0, or an error code. */
int tb_node_step(const tb_task *task, float *theta, const float *x, const uint8_t *y, uint16_t rows,
                 uint8_t features, uint8_t classes, uint64_t *cycles);

/* node.c */
void tb_main(void); /* never returns */

#endif

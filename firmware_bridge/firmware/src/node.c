/* The board's side of the serial protocol (docs/serial-protocol.md): frames in, the node step,
 * frames out. One frame is handled to the end before the next is read, so the line's buffer (the
 * RX ring of TB_RX_CREDITS frames the board announces) never holds more than the bridge's credits. */
#include <math.h>
#include <string.h>

#include "bsp.h"
#include "fw.h"

#define MAX_BODY (TB_HEADER + TB_MAX_PAYLOAD + TB_CRC)
#define MAX_ENCODED (MAX_BODY + MAX_BODY / 254 + 2)

static float xs[(uint32_t)TB_MAX_ROWS * TB_MAX_FEATURES];
static uint8_t ys[TB_MAX_ROWS];
static float theta[TB_MAX_PARAMS];

static struct {
    uint32_t id, pending_id; /* id 0: no data */
    uint16_t rows;
    uint8_t features, classes;
} data;

static struct {
    int begun, done; /* done: theta holds the round's update, which a repeated go sends again */
    tb_task task;
    uint32_t dataset;
    uint16_t params;
    uint64_t cycles;
    uint32_t go_crc; /* the model's CRC its go carried: a repeated go of a done round resends */
} round_;

/* What a round frame asks for once it is acknowledged. */
enum { AFTER_NOTHING, AFTER_GO, AFTER_RESEND };

static uint8_t enc[MAX_ENCODED], body[MAX_ENCODED], out_body[MAX_BODY], out_enc[MAX_ENCODED + 1];
static uint8_t tx_seq;
static int damage_next; /* fault emulation: TB_FAULT_DAMAGE_*, the update frame to damage on the line */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static float getf(const uint8_t *p) {
    uint32_t u = get32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)v), put16(p + 2, (uint16_t)(v >> 16)); }
static void putf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put32(p, u);
}

static void send(uint8_t type, const uint8_t *payload, uint16_t len) {
    out_body[0] = TB_PROTOCOL;
    out_body[1] = type;
    out_body[2] = tx_seq++;
    out_body[3] = 0;
    put16(out_body + 4, len);
    if (len) memcpy(out_body + TB_HEADER, payload, len);
    put32(out_body + TB_HEADER + len, tb_crc32(0, out_body, TB_HEADER + len));
    size_t n = tb_cobs_encode(out_body, TB_HEADER + len + TB_CRC, out_enc);
    if (type == T_UPDATE && ((damage_next == TB_FAULT_DAMAGE_VALUES && payload[0] == 0) ||
                             (damage_next == TB_FAULT_DAMAGE_SUMMARY && payload[0] == 1))) {
        /* one bit flipped on the line, never into a delimiter */
        out_enc[n / 2] ^= out_enc[n / 2] == 0x01 ? 0x02 : 0x01;
        damage_next = 0;
    }
    out_enc[n++] = 0;
    bsp_write(out_enc, n);
}

static void ack(uint8_t seq, uint8_t status) {
    uint8_t p[2] = {seq, status};
    send(T_ACK, p, 2);
}

static void error(uint8_t code, const char *text) {
    uint8_t p[64];
    size_t n = strlen(text);
    if (n > sizeof p - 1) n = sizeof p - 1;
    p[0] = code;
    memcpy(p + 1, text, n);
    send(T_ERROR, p, (uint16_t)(n + 1));
}

static uint16_t put_text(uint8_t *p, const char *s, uint8_t max) {
    size_t n = strlen(s);
    if (n > max) n = max;
    p[0] = (uint8_t)n;
    memcpy(p + 1, s, n);
    return (uint16_t)(n + 1);
}

static void hello(uint32_t nonce) {
    uint8_t p[96];
    p[0] = TB_PROTOCOL, p[1] = TB_FW_MAJOR, p[2] = TB_FW_MINOR, p[3] = TB_FW_PATCH;
    p[4] = TB_FORMAT_F32LE, p[5] = TB_RX_CREDITS;
    put16(p + 6, TB_MAX_PAYLOAD);
    put16(p + 8, TB_MAX_ROWS);
    p[10] = TB_MAX_FEATURES, p[11] = TB_MAX_CLASSES;
    put16(p + 12, TB_MAX_BATCH);
    put32(p + 14, bsp_counter_hz());
    p[18] = bsp_counter_kind();
    put32(p + 19, nonce);
    put32(p + 23, data.id);
    uint16_t n = 27;
    n += put_text(p + n, bsp_board_id(), 32);
    n += put_text(p + n, bsp_profile(), 16);
    send(T_HELLO, p, n);
}

static uint32_t data_crc(void) {
    uint32_t crc = 0;
    uint8_t row[4 * TB_MAX_FEATURES + 1];
    for (uint32_t r = 0; r < data.rows; r++) {
        for (uint32_t i = 0; i < data.features; i++) putf(row + 4 * i, xs[r * data.features + i]);
        row[4u * data.features] = ys[r];
        crc = tb_crc32(crc, row, 4u * data.features + 1u);
    }
    return crc;
}

static uint8_t provision(const uint8_t *p, uint16_t len) {
    if (len < 1) return E_BAD_PAYLOAD;
    if (p[0] == 0) { /* begin: dataset id, rows, features, classes */
        if (len != 9) return E_BAD_PAYLOAD;
        uint16_t rows = get16(p + 5);
        if (rows == 0 || rows > TB_MAX_ROWS || p[7] == 0 || p[7] > TB_MAX_FEATURES || p[8] < 2 || p[8] > TB_MAX_CLASSES)
            return E_TOO_LARGE;
        data.id = 0, data.pending_id = get32(p + 1), data.rows = rows, data.features = p[7], data.classes = p[8];
        round_.begun = 0, round_.done = 0;
        return E_OK;
    }
    if (data.pending_id == 0) return E_NO_DATA;
    if (p[0] == 1) { /* rows: first, count, then count x (features float32, label) */
        if (len < 5) return E_BAD_PAYLOAD;
        uint16_t first = get16(p + 1), count = get16(p + 3);
        uint32_t width = 4u * data.features + 1u;
        if (len != 5u + count * width || (uint32_t)first + count > data.rows) return E_BAD_PAYLOAD;
        for (uint32_t r = 0; r < count; r++) {
            const uint8_t *row = p + 5 + r * width;
            for (uint32_t i = 0; i < data.features; i++) xs[(first + r) * data.features + i] = getf(row + 4 * i);
            ys[first + r] = row[4u * data.features];
        }
        return E_OK;
    }
    if (p[0] == 2) { /* commit: the CRC of every row as sent */
        if (len != 5) return E_BAD_PAYLOAD;
        if (data_crc() != get32(p + 1)) return E_BAD_DATA;
        for (uint32_t r = 0; r < data.rows; r++)
            if (ys[r] >= data.classes) return E_BAD_DATA;
        for (uint32_t i = 0; i < (uint32_t)data.rows * data.features; i++)
            if (!isfinite(xs[i])) return E_BAD_DATA;
        data.id = data.pending_id;
        return E_OK;
    }
    return E_BAD_PAYLOAD;
}

/* The round's update (theta after the step): its values, then its summary. */
static void send_update(void) {
    uint8_t p[TB_MAX_PAYLOAD];
    const uint16_t per = (TB_MAX_PAYLOAD - 9) / 4;
    for (uint16_t first = 0; first < round_.params; first += per) { /* values: round, first, count, floats */
        uint16_t count = round_.params - first < per ? round_.params - first : per;
        p[0] = 0;
        put32(p + 1, round_.task.round);
        put16(p + 5, first);
        put16(p + 7, count);
        for (uint16_t i = 0; i < count; i++) putf(p + 9 + 4 * i, theta[first + i]);
        send(T_UPDATE, p, (uint16_t)(9 + 4 * count));
    }
    p[0] = 1; /* done: round, steps, cycles (64 bit), params, CRC of the values */
    put32(p + 1, round_.task.round);
    put16(p + 5, round_.task.tau);
    put32(p + 7, (uint32_t)round_.cycles);
    put32(p + 11, (uint32_t)(round_.cycles >> 32));
    put16(p + 15, round_.params);
    uint32_t crc = 0;
    for (uint16_t i = 0; i < round_.params; i++) {
        uint8_t v[4];
        putf(v, theta[i]);
        crc = tb_crc32(crc, v, 4);
    }
    put32(p + 17, crc);
    send(T_UPDATE, p, 21);
}

static void run_round(void) {
    uint64_t cycles = 0;
    int status = tb_node_step(&round_.task, theta, xs, ys, data.rows, data.features, data.classes, &cycles);
    if (status != E_OK) {
        error((uint8_t)status, "node step refused");
        return;
    }
    round_.done = 1, round_.cycles = cycles;
    send_update();
}

static uint8_t round_frame(const uint8_t *p, uint16_t len, int *after) {
    if (len < 1) return E_BAD_PAYLOAD;
    if (p[0] == 0) { /* begin: round, seed, node, dataset, tau, batch, lr, sigma, params */
        if (len != 35) return E_BAD_PAYLOAD;
        tb_task t = {(uint64_t)get32(p + 5) | (uint64_t)get32(p + 9) << 32, get32(p + 13), get32(p + 1),
                     get16(p + 21), get16(p + 23), getf(p + 25), getf(p + 29)};
        uint32_t dataset = get32(p + 17);
        uint16_t params = get16(p + 33);
        if (data.id == 0 || dataset != data.id) return E_NO_DATA;
        if (params != (uint32_t)data.features * data.classes + data.classes || t.tau == 0 ||
            t.batch == 0 || t.batch > data.rows || t.batch > TB_MAX_BATCH || !isfinite(t.lr) ||
            !isfinite(t.sigma) || t.sigma < 0.0f)
            return E_BAD_PAYLOAD;
        round_.task = t, round_.dataset = dataset, round_.params = params, round_.begun = 1, round_.done = 0;
        return E_OK;
    }
    if (!round_.begun) return E_NO_ROUND;
    if (p[0] == 1) { /* model: first, count, floats */
        if (len < 5) return E_BAD_PAYLOAD;
        uint16_t first = get16(p + 1), count = get16(p + 3);
        if (len != 5u + 4u * count || (uint32_t)first + count > round_.params) return E_BAD_PAYLOAD;
        round_.done = 0;
        for (uint16_t i = 0; i < count; i++) theta[first + i] = getf(p + 5 + 4 * i);
        return E_OK;
    }
    if (p[0] == 2) { /* go: the CRC of the model as sent */
        if (len != 5) return E_BAD_PAYLOAD;
        if (round_.done && round_.go_crc == get32(p + 1)) { /* a repeat: the same update, not recomputed */
            *after = AFTER_RESEND;
            return E_OK;
        }
        uint32_t crc = 0;
        for (uint16_t i = 0; i < round_.params; i++) {
            uint8_t v[4];
            putf(v, theta[i]);
            crc = tb_crc32(crc, v, 4);
        }
        if (crc != get32(p + 1)) return E_BAD_MODEL;
        for (uint16_t i = 0; i < round_.params; i++)
            if (!isfinite(theta[i])) return E_BAD_MODEL;
        round_.go_crc = crc;
        *after = AFTER_GO;
        return E_OK;
    }
    return E_BAD_PAYLOAD;
}

static void boot(void) {
    memset(&data, 0, sizeof data);
    memset(&round_, 0, sizeof round_);
    if (bsp_own_data(xs, ys, TB_MAX_ROWS, TB_MAX_FEATURES, &data.rows, &data.features, &data.classes)) {
        data.id = 0xFFFFFFFFu; /* the board's own data */
        data.pending_id = data.id;
    }
    hello(0); /* unsolicited: the bridge learns the board (re)started */
}

/* One decoded frame: check it, act, acknowledge. */
static void handle(size_t n) {
    if (n < TB_HEADER + TB_CRC) {
        error(E_TRUNCATED, "truncated frame");
        return;
    }
    uint16_t len = get16(body + 4);
    if (len > TB_MAX_PAYLOAD) {
        error(E_OVERSIZE, "payload above the announced maximum");
        return;
    }
    if ((size_t)len + TB_HEADER + TB_CRC != n) {
        error(E_TRUNCATED, "length does not match the frame");
        return;
    }
    if (tb_crc32(0, body, TB_HEADER + len) != get32(body + TB_HEADER + len)) {
        error(E_BAD_CRC, "bad CRC");
        return;
    }
    if (body[0] != TB_PROTOCOL) {
        error(E_BAD_VERSION, "unknown protocol version");
        return;
    }
    uint8_t seq = body[2], status;
    const uint8_t *p = body + TB_HEADER;
    int after = AFTER_NOTHING;
    switch (body[1]) {
        case T_HELLO:
            if (len != 5) {
                ack(seq, E_BAD_PAYLOAD);
                return;
            }
            hello(get32(p + 1));
            return;
        case T_PROVISION: status = provision(p, len); break;
        case T_ROUND: status = round_frame(p, len, &after); break;
        default: status = E_UNKNOWN_TYPE; break;
    }
    ack(seq, status);
    if (after == AFTER_RESEND) send_update();
    if (after == AFTER_GO) {
        int fault = bsp_fault_at_go(round_.task.round);
        if (fault == TB_FAULT_RESET) {
            boot();
            return;
        }
        damage_next = fault;
        run_round();
    }
}

void tb_main(void) {
    size_t have = 0;
    int dropping = 0;
    uint8_t buf[64];
    bsp_init();
    boot();
    for (;;) {
        size_t got = bsp_read(buf, sizeof buf);
        for (size_t i = 0; i < got; i++) {
            uint8_t b = buf[i];
            if (b != 0) {
                if (have < sizeof enc)
                    enc[have++] = b;
                else if (!dropping) { /* longer than any frame: drop it up to its delimiter */
                    dropping = 1;
                    error(E_OVERSIZE, "oversized frame");
                }
                continue;
            }
            if (!dropping && have) {
                size_t n = tb_cobs_decode(enc, have, body);
                if (n == 0)
                    error(E_TRUNCATED, "malformed COBS");
                else
                    handle(n);
            }
            have = 0, dropping = 0;
        }
    }
}

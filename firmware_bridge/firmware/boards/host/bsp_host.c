/* The virtual board: the firmware as a process on the host, its UART a pseudo-terminal.
 *
 * At start it prints the pseudo-terminal's device path on stdout (one line), then serves it like a
 * board serves its UART. The slave side stays open here, so the line exists while the process
 * lives (killing the process is unplugging the board). Environment: TB_BOARD_ID, TB_BOARD_PROFILE;
 * fault emulation for tests, each once, at the go of round R: TB_RESET_AT_ROUND=R resets the board
 * (RAM lost, boot HELLO); TB_STALL_AT_ROUND=R blocks it TB_STALL_S seconds (it neither reads nor
 * writes, then runs the round); TB_DAMAGE_AT_ROUND=R damages the first frame of its update
 * (with TB_DAMAGE_SUMMARY=1: its summary, the last). */
#define _XOPEN_SOURCE 600
#define _DEFAULT_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "bsp.h"
#include "fw.h"

static int master = -1;
static long reset_at = -1, stall_at = -1, damage_at = -1;
static double stall_s = 0.0;
static int damage_summary;

static long env_round(const char *name) {
    const char *v = getenv(name);
    return v ? strtol(v, NULL, 10) : -1;
}

void bsp_init(void) {
    master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
        perror("board: pseudo-terminal");
        exit(1);
    }
    const char *path = ptsname(master);
    int slave = open(path, O_RDWR | O_NOCTTY);
    struct termios t;
    if (slave < 0 || tcgetattr(slave, &t)) {
        perror("board: pseudo-terminal slave");
        exit(1);
    }
    cfmakeraw(&t); /* no echo, no line editing: a UART carries bytes */
    tcsetattr(slave, TCSANOW, &t);
    reset_at = env_round("TB_RESET_AT_ROUND");
    stall_at = env_round("TB_STALL_AT_ROUND");
    damage_at = env_round("TB_DAMAGE_AT_ROUND");
    const char *s = getenv("TB_STALL_S");
    if (s) stall_s = strtod(s, NULL);
    damage_summary = getenv("TB_DAMAGE_SUMMARY") != NULL;
    printf("%s\n", path);
    fflush(stdout);
}

size_t bsp_read(uint8_t *buf, size_t max) {
    struct pollfd p = {master, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) return 0;
    ssize_t n = read(master, buf, max);
    if (n < 0 && errno != EAGAIN && errno != EINTR && errno != EIO) {
        perror("board: read");
        exit(1);
    }
    return n > 0 ? (size_t)n : 0;
}

void bsp_write(const uint8_t *buf, size_t n) {
    while (n) {
        ssize_t k = write(master, buf, n);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            perror("board: write");
            exit(1);
        }
        buf += k, n -= (size_t)k;
    }
}

uint32_t bsp_cycles(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint32_t)((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}

uint32_t bsp_counter_hz(void) { return 1000000000u; }
uint8_t bsp_counter_kind(void) { return TB_COUNTER_HOST; }

const char *bsp_board_id(void) {
    const char *id = getenv("TB_BOARD_ID");
    return id ? id : "host";
}

const char *bsp_profile(void) {
    const char *p = getenv("TB_BOARD_PROFILE");
    return p ? p : "rp2040";
}

int bsp_own_data(float *x, uint8_t *y, uint16_t max_rows, uint8_t max_features, uint16_t *rows,
                 uint8_t *features, uint8_t *classes) {
    (void)x, (void)y, (void)max_rows, (void)max_features, (void)rows, (void)features, (void)classes;
    return 0; /* provisioned by the bridge */
}

/* Whether a fault emulation at `*at` fires for `round` (once). */
static int fires(long *at, uint32_t round) {
    if (*at < 0 || (uint32_t)*at != round) return 0;
    *at = -1;
    return 1;
}

int bsp_fault_at_go(uint32_t round) {
    if (fires(&stall_at, round)) {
        struct timespec t = {(time_t)stall_s, (long)((stall_s - (double)(time_t)stall_s) * 1e9)};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {
        }
    }
    if (fires(&reset_at, round)) return TB_FAULT_RESET;
    if (fires(&damage_at, round)) return damage_summary ? TB_FAULT_DAMAGE_SUMMARY : TB_FAULT_DAMAGE_VALUES;
    return TB_FAULT_NONE;
}

int main(void) {
    tb_main();
}

/* The board-support layer: everything the portable firmware needs from a board.
 *
 * A port provides these functions in boards/<board>/ (see docs/serial-protocol.md, "Porting to
 * a board"). Nothing else of the firmware touches hardware; it uses no heap and no stdio.
 */
#ifndef TB_BSP_H
#define TB_BSP_H

#include <stddef.h>
#include <stdint.h>

/* Counter kinds reported in HELLO: how bsp_cycles() counts. */
#define TB_COUNTER_CYCLES 0u   /* a core cycle counter (DWT CYCCNT, CCOUNT) */
#define TB_COUNTER_TIMER 1u    /* a hardware timer (SysTick, a peripheral timer) */
#define TB_COUNTER_HOST 2u     /* a virtual board's host clock: not the board's time */
#define TB_COUNTER_EMULATED 3u /* an emulator's timer (QEMU): not a real board's time either */

/* Set up the serial line, the counter and the clock. Called once at boot. */
void bsp_init(void);
/* Up to max received bytes into buf without waiting long; returns how many (0: none yet). */
size_t bsp_read(uint8_t *buf, size_t max);
/* Send n bytes; returns when they are queued for the line. */
void bsp_write(const uint8_t *buf, size_t n);
/* The free-running counter (wraps at 2^32) and its rate in Hz. */
uint32_t bsp_cycles(void);
uint32_t bsp_counter_hz(void);
uint8_t bsp_counter_kind(void);
/* Identity reported in HELLO: a stable board id (serial number) and its device profile name. */
const char *bsp_board_id(void);
const char *bsp_profile(void);
/* The data hook: a board that has its own data (flash, sensors) writes up to max_rows rows of
 * features (row-major float32) and labels, sets *rows, *features, *classes and returns 1; a board
 * provisioned by its bridge returns 0. */
int bsp_own_data(float *x, uint8_t *y, uint16_t max_rows, uint8_t max_features, uint16_t *rows,
                 uint8_t *features, uint8_t *classes);
/* Fault emulation (virtual boards only; real boards return TB_FAULT_NONE at once), asked at the
 * "go" of round `round`: TB_FAULT_RESET, the board resets itself now; TB_FAULT_DAMAGE_VALUES
 * (TB_FAULT_DAMAGE_SUMMARY), the first values frame (the summary frame) of the round's update is
 * damaged on the line. A virtual board may also block here for a while (a stall: the board
 * neither reads nor writes). */
#define TB_FAULT_NONE 0
#define TB_FAULT_RESET 1
#define TB_FAULT_DAMAGE_VALUES 2
#define TB_FAULT_DAMAGE_SUMMARY 3
int bsp_fault_at_go(uint32_t round);

#endif

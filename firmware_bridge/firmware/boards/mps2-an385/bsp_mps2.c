/* Arm MPS2 with the AN385 image (Cortex-M3, 25 MHz) as QEMU's mps2-an385 models it: UART0 is a
 * CMSDK APB UART at 0x40004000, the counter is SysTick at the core clock (QEMU has no DWT cycle
 * counter), extended to 32 bits by counting its wraps. */
#include "bsp.h"
#include "fw.h"

#define UART0 0x40004000u
#define UART_DATA (*(volatile uint32_t *)(UART0 + 0x00))
#define UART_STATE (*(volatile uint32_t *)(UART0 + 0x04)) /* bit 0 TX full, bit 1 RX full */
#define UART_CTRL (*(volatile uint32_t *)(UART0 + 0x08))  /* bit 0 TX enable, bit 1 RX enable */
#define UART_BAUDDIV (*(volatile uint32_t *)(UART0 + 0x10))

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define CORE_HZ 25000000u

#ifndef TB_PROFILE
#define TB_PROFILE "stm32l4"
#endif

static volatile uint32_t wraps;

void SysTick_Handler(void) { wraps++; }

void bsp_init(void) {
    UART_BAUDDIV = 16; /* the smallest divider the UART accepts; QEMU ignores the rate */
    UART_CTRL = 3u;
    SYST_RVR = 0x00FFFFFFu;
    SYST_CVR = 0;
    SYST_CSR = 7u; /* enable, interrupt on wrap, core clock */
}

size_t bsp_read(uint8_t *buf, size_t max) {
    size_t n = 0;
    while (n < max && (UART_STATE & 2u)) buf[n++] = (uint8_t)UART_DATA;
    return n;
}

void bsp_write(const uint8_t *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        while (UART_STATE & 1u) {
        }
        UART_DATA = buf[i];
    }
}

uint32_t bsp_cycles(void) {
    uint32_t w, v;
    do { /* a wrap between the two reads shows as a changed count: read again */
        w = wraps;
        v = SYST_CVR;
    } while (w != wraps);
    return (w << 24) | (0x00FFFFFFu - v);
}

uint32_t bsp_counter_hz(void) { return CORE_HZ; }
uint8_t bsp_counter_kind(void) { return TB_COUNTER_EMULATED; }
const char *bsp_board_id(void) { return "qemu-mps2-an385"; }
const char *bsp_profile(void) { return TB_PROFILE; }

int bsp_own_data(float *x, uint8_t *y, uint16_t max_rows, uint8_t max_features, uint16_t *rows,
                 uint8_t *features, uint8_t *classes) {
    (void)x, (void)y, (void)max_rows, (void)max_features, (void)rows, (void)features, (void)classes;
    return 0; /* provisioned by the bridge */
}

int bsp_fault_at_go(uint32_t round) {
    (void)round;
    return TB_FAULT_NONE;
}

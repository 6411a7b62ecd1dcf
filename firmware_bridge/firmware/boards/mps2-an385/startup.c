/* Reset handler and vector table for a Cortex-M3: copy .data, zero .bss, run the firmware. */
#include <stdint.h>

#include "fw.h"

extern uint32_t _sidata, _sdata, _edata, _sbss, _ebss, _estack;
void SysTick_Handler(void);

void Reset_Handler(void) {
    uint32_t *src = &_sidata, *dst = &_sdata;
    while (dst < &_edata) *dst++ = *src++;
    for (dst = &_sbss; dst < &_ebss;) *dst++ = 0;
    tb_main();
}

static void Fault_Handler(void) {
    for (;;) {
    }
}

__attribute__((section(".vectors"), used)) static void (*const vectors[16])(void) = {
    (void (*)(void))(&_estack), Reset_Handler, Fault_Handler, Fault_Handler, Fault_Handler, Fault_Handler,
    Fault_Handler, 0, 0, 0, 0, Fault_Handler, Fault_Handler, 0, Fault_Handler, SysTick_Handler};

# The Cortex-M3 firmware for QEMU's mps2-an385 machine (`make mps2-an385`).
.PHONY: mps2-an385
mps2-an385: $(BUILD)/mps2-an385/board.elf

ARM_CC ?= arm-none-eabi-gcc
ARM_FLAGS := -mcpu=cortex-m3 -mthumb -ffunction-sections -fdata-sections -DTB_PROFILE=\"stm32l4\"

$(BUILD)/mps2-an385/board.elf: $(SRC) boards/mps2-an385/bsp_mps2.c boards/mps2-an385/startup.c boards/mps2-an385/link.ld include/bsp.h src/fw.h
	mkdir -p $(@D)
	$(ARM_CC) $(CFLAGS_COMMON) $(ARM_FLAGS) -nostartfiles -Tboards/mps2-an385/link.ld -Wl,--gc-sections \
		-o $@ $(SRC) boards/mps2-an385/bsp_mps2.c boards/mps2-an385/startup.c -lm -lc -lgcc -lnosys

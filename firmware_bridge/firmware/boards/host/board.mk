# The virtual board's firmware: a host process (`make host`).
.PHONY: host
host: $(BUILD)/host/board

$(BUILD)/host/board: $(SRC) boards/host/bsp_host.c include/bsp.h src/fw.h
	mkdir -p $(@D)
	$(CC) $(CFLAGS_COMMON) -o $@ $(SRC) boards/host/bsp_host.c -lm

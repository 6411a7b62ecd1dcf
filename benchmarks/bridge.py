"""The serial bridge's cost per round against the raw time of its payload on the line.

For each line rate (115200 and 921600 baud) and model size, one round is framed exactly as the
bridge sends it (round header, model chunks, go) and as the board answers (acks, update chunks,
summary); the raw time is the payload bytes alone at 10 bits a byte, the framed time all bytes on
the line (headers, CRCs, COBS, acks). The bridge's own CPU time per round is measured on a virtual
board (the host build behind a pseudo-terminal, which ignores the baud rate), and the QEMU
Cortex-M3 board's round time is measured end to end.

    .venv/bin/python benchmarks/bridge.py
"""

from __future__ import annotations

import shutil
import time

import numpy as np

from firmware_bridge.board import Board
from firmware_bridge.link import Link
from firmware_bridge.port import open_port
from firmware_bridge.virtual import HostBoard, QemuBoard
from testbed.algorithms.contract import McuTask

ROUNDS = 30


def _data(d: int, c: int, n: int = 200):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)) / np.sqrt(d)
    return x.astype(np.float32), rng.integers(0, c, n), np.zeros(d * c + c, np.float32)


def _measure(board: Board, d: int, c: int, tau: int = 5) -> dict:
    x, y, theta = _data(d, c)
    board.provision(x, y, c)
    link = board.link
    out0, in0 = link.stats["bytes_out"], link.stats["bytes_in"]
    wall, cpu, board_s = [], [], []
    for r in range(ROUNDS):
        task = McuTask(seed=1, node=0, round_index=r, tau=tau, batch=16, lr=0.1, sigma=1.0, n_classes=c)
        t0, c0 = time.perf_counter(), time.process_time()
        result = board.run(task, theta)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        board_s.append(result.cycles / result.counter_hz)
    p = d * c + c
    return {"params": p, "line_bytes": (link.stats["bytes_out"] - out0 + link.stats["bytes_in"] - in0) / ROUNDS,
            "payload_bytes": 2 * 4 * p, "wall_s": float(np.median(wall)), "cpu_s": float(np.median(cpu)),
            "board_s": float(np.median(board_s))}


def main() -> None:
    print("Bridge overhead per round (virtual board; τ = 5, B = 16)")
    print(f"{'P':>5} {'payload B':>9} {'on line B':>9} {'framing':>8} | {'115200 raw':>11} {'framed':>9} |"
          f" {'921600 raw':>11} {'framed':>9} | {'bridge CPU':>10} {'round wall':>10}")
    with HostBoard() as process:
        board = Board(Link(open_port(process.url)))
        board.hello()
        for d, c in ((8, 2), (32, 2), (32, 8)):
            r = _measure(board, d, c)
            cells = []
            for baud in (115200, 921600):
                cells += [f"{r['payload_bytes'] * 10 / baud * 1e3:9.2f}ms", f"{r['line_bytes'] * 10 / baud * 1e3:7.2f}ms"]
            print(f"{r['params']:>5} {r['payload_bytes']:>9} {r['line_bytes']:>9.0f} {r['line_bytes'] / r['payload_bytes']:>7.2f}x |"
                  f" {cells[0]:>11} {cells[1]:>9} | {cells[2]:>11} {cells[3]:>9} | {r['cpu_s'] * 1e3:8.2f}ms {r['wall_s'] * 1e3:8.2f}ms")
        board.link.close()
    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        print("QEMU board: skipped (needs qemu-system-arm and gcc-arm-none-eabi)")
        return
    print("\nQEMU mps2-an385 board (Cortex-M3, soft float) round time, τ = 5, B = 16")
    with QemuBoard() as process:
        board = Board(Link(open_port(process.url)))
        board.hello()
        for d, c in ((8, 2), (32, 2)):
            r = _measure(board, d, c)
            print(f"  P = {r['params']:>3}: round {r['wall_s'] * 1e3:7.1f} ms wall (bridge CPU {r['cpu_s'] * 1e3:.2f} ms,"
                  f" step on the emulated counter {r['board_s'] * 1e3:.1f} ms)")
        board.link.close()


if __name__ == "__main__":
    main()

"""Orchestration: what runs an experiment. The runner's pipeline, the coordinator of an MQTT run,
sim's nodes, the channel emulator of over-the-air algorithms, sweeps, and board provisioning. It may
import every layer below it (docs/design.md: the assembly, the boards, the firmware bridge, reports);
only the CLI and the public API import it."""

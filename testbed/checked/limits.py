"""The ranges every number a user types is held to, in experiment files (testbed.checked.sections) and on
the command line (testbed.checked.arguments) alike: a number outside them is refused in one line.

Kept free of imports, so the command line reads them without loading pydantic or numpy.
"""

#: The largest integer a count, size or id takes unless it declares its own bound: a C int (BLAS
#: threads, sizes handed to C and numpy, the firmware's node ids), and far beyond any count this
#: testbed can hold in memory.
MAX_INT = 2**31 - 1
#: The largest magnitude of a float unless it declares its own bound: far beyond any rate, budget,
#: frequency or duration in use, and small enough that squares and products of a few such values
#: stay finite in float64.
MAX_FLOAT = 1e15
#: The smallest value of a float that must be positive (> 0): far below any rate, noise power or
#: bound in use, and large enough that its inverse square stays finite in float64 (1e-308 is not).
MIN_POSITIVE = 1e-30
#: The largest seed: its two 32-bit halves key the Philox streams (testbed.streams.counter_rng, the
#: firmware's uint64 seed), and a sweep's repeats add to it within int64.
MAX_SEED = 2**63 - 1
#: The longest wait a user may set, in seconds (a week): far below threading.TIMEOUT_MAX.
MAX_WAIT_S = 7 * 86400.0
#: The range of an MQTT chunk, in bytes: a message of up to 64 MiB (testbed.mqtt.wire.DEFAULT_MAX_BYTES)
#: fits in the 16,384 chunks a publish may take (testbed.mqtt.client), header included, and a chunk
#: stays under MQTT's 256 MiB packet limit.
MIN_CHUNK_BYTES = 8192
MAX_CHUNK_BYTES = 2**27
#: The largest process id Linux hands out (/proc/sys/kernel/pid_max at most 2**22).
MAX_PID = 2**22
#: The largest ε in nats a calibration takes: past ~709, exp(ε) overflows float64 (and the noise it
#: calibrates is below float64's resolution long before).
MAX_EPSILON_NATS = 700.0
#: The largest text file a user or an inventory names that is read whole (an experiment file, an
#: inventory, a node file, a credentials or calibration file): a PADPFL weight per node for a
#: million nodes fits; /dev/zero or a runaway file does not.
MAX_TEXT_FILE_BYTES = 64 * 2**20
#: The largest log file of a run read whole (metrics.csv, asked.csv, refusals.csv): years of
#: rounds; a device, a FIFO or a runaway file is refused before it is read.
MAX_RUN_FILE_BYTES = 4 * 2**30

"""The serial framing: round trips, and a line of garbage never crashes the decoder or loses a good frame."""

import numpy as np
import pytest

from firmware_bridge import messages as m
from firmware_bridge.framing import Frame, FrameDecoder, cobs_decode, cobs_encode, encode_frame


@pytest.mark.parametrize("size", [0, 1, 253, 254, 255, 508, 1000])
def test_cobs_round_trip_and_no_zero_bytes(size):
    data = bytes(np.random.default_rng(size).integers(0, 3, size).astype(np.uint8))  # many zeros
    encoded = cobs_encode(data)
    assert 0 not in encoded
    assert cobs_decode(encoded) == data


def test_frames_round_trip_in_any_split():
    frames = [Frame(t, i, bytes(range(i * 7 % 256)) * 2) for i, t in enumerate([1, 2, 3, 4, 7] * 4)]
    line = b"".join(encode_frame(f) for f in frames)
    for step in (1, 3, 64, len(line)):
        dec = FrameDecoder()
        got = [f for i in range(0, len(line), step) for f in dec.feed(line[i : i + step])]
        assert got == frames and not dec.errors


def test_each_kind_of_bad_frame_is_counted_and_dropped():
    good = encode_frame(Frame(m.ACK, 1, b"\x01\x00"))
    body = cobs_decode(good[:-1])
    wrong_crc = cobs_encode(body[:-1] + bytes([body[-1] ^ 1])) + b"\x00"
    other_version = bytearray(body)
    other_version[0] = 9
    import struct, zlib
    other_version = bytes(other_version[:-4]) + struct.pack("<I", zlib.crc32(bytes(other_version[:-4])))
    dec = FrameDecoder(max_payload=64)
    line = (b"\x05\x01" + b"\x00"            # malformed COBS
            + good[: len(good) // 2] + b"\x00"  # truncated
            + wrong_crc
            + cobs_encode(other_version) + b"\x00"
            + b"\x7f" * 500 + b"\x00"         # oversized
            + cobs_encode(b"\x01\x07") + b"\x00"  # too short for a header
            + good)
    assert dec.feed(line) == [Frame(m.ACK, 1, b"\x01\x00")]
    assert dec.errors["bad_crc"] == 1 and dec.errors["bad_version"] == 1 and dec.errors["oversize"] == 1
    assert sum(dec.errors.values()) >= 5


def test_fuzz_random_bytes_between_good_frames():
    rng = np.random.default_rng(7)
    dec = FrameDecoder(max_payload=512)
    sent, got = [], []
    for i in range(300):
        frame = Frame(int(rng.integers(1, 8)), i & 0xFF, bytes(rng.integers(0, 256, int(rng.integers(0, 300))).astype(np.uint8)))
        sent.append(frame)
        noise = bytes(rng.integers(0, 256, int(rng.integers(0, 200))).astype(np.uint8))
        # garbage, then a delimiter (a receiver resynchronises there), then the frame
        got += dec.feed(noise + b"\x00" + encode_frame(frame))
    # random bytes may form a "frame" only if they pass a CRC-32: practically never
    assert got == sent


def test_board_payloads_are_checked_before_use():
    with pytest.raises(m.BadPayload):
        m.parse_hello(b"\x01" * 10)
    with pytest.raises(m.BadPayload):
        m.parse_ack(b"\x01\x63")  # unknown status
    with pytest.raises(m.BadPayload):
        m.parse_update(b"\x00" + bytes(8) + b"\x01")  # values not a multiple of 4 bytes
    with pytest.raises(m.BadPayload):
        m.parse_update(b"\x00\x00\x00\x00\x00\x00\x00\x05\x00" + bytes(8))  # says 5 values, carries 2
    with pytest.raises(m.BadPayload):
        m.parse_update(b"\x09")


def test_config_knows_every_board_profile():
    from testbed.assembly.config import NodesSection
    from testbed.devices.profiles import load_mcu_profile, mcu_profile_names
    from testbed.checked.sections import field_choices

    assert set(field_choices(NodesSection, "mcu_profile")) == set(mcu_profile_names())
    assert all(load_mcu_profile(name).sources for name in mcu_profile_names())

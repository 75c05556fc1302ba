#!/usr/bin/env python3
"""Writes the seed corpus for fuzz_roce_parse: real RoCEv2 packets (IP header .. ICRC) from the rxe
captures in tests/data/captures, one per interesting shape, plus one converted to IPv6 with its ICRC
recomputed. Run from the repository root: tests/fuzz/make_roce_corpus.py"""
import struct, zlib, os

CAP = "tests/data/captures/"
OUT = "tests/fuzz/corpus/fuzz_roce_parse/"

def frames(path):
    d = open(path, "rb").read()
    off = 24
    while off + 16 <= len(d):
        incl = struct.unpack_from("<I", d, off + 8)[0]
        yield d[off + 16: off + 16 + incl]
        off += 16 + incl

def roce(path, pick):
    """First IPv4 RoCE packet in the capture for which pick(opcode, aeth_syndrome, bth_pad) is true."""
    for f in frames(CAP + path):
        if f[12:14] != b"\x08\x00" or f[14 + 9] != 17: continue
        ip = f[14:]
        ihl = (ip[0] & 15) * 4
        if struct.unpack_from(">H", ip, ihl + 2)[0] != 4791: continue
        total = struct.unpack_from(">H", ip, 2)[0]
        ip = ip[:total]  # drop Ethernet padding
        bth = ip[ihl + 8:]
        if pick(bth[0], bth[12] if len(bth) > 12 else None, (bth[1] >> 4) & 3): return ip
    raise SystemExit("no packet in " + path)

def icrc(ip):
    v6 = ip[0] >> 4 == 6
    hl = 40 if v6 else (ip[0] & 15) * 4
    m = bytearray(ip[:-4])
    if v6:
        m[0] |= 0x0f; m[1] = m[2] = m[3] = 0xff; m[7] = 0xff
    else:
        m[1] = m[8] = m[10] = m[11] = 0xff
    m[hl + 6] = m[hl + 7] = 0xff
    m[hl + 8 + 4] = 0xff
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(m)))

def to_v6(ip4):
    udp = ip4[20:]
    hdr = struct.pack(">IHBB", 6 << 28 | 0x12 << 20 | 0xabcde, len(udp), 17, 64)
    src = bytes.fromhex("fd000000000000000000000000000003")
    dst = bytes.fromhex("fd000000000000000000000000000002")
    ip6 = hdr + src + dst + udp
    return ip6[:-4] + icrc(ip6)

seeds = {
    "rc-send-first": roce("rxe-rc-send.pcap", lambda o, s, p: o == 0),
    "rc-send-only-pad3": roce("rxe-rc-send-only.pcap", lambda o, s, p: o == 4 and p == 3),
    "rc-write-first-reth": roce("rxe-rc-write.pcap", lambda o, s, p: o == 6),
    "rc-write-only-imm": roce("rxe-rc-write-imm.pcap", lambda o, s, p: o == 11),
    "rc-send-last-imm": roce("rxe-rc-send-imm.pcap", lambda o, s, p: o == 3),
    "rc-read-request": roce("rxe-rc-read.pcap", lambda o, s, p: o == 12),
    "rc-read-response-last": roce("rxe-rc-read.pcap", lambda o, s, p: o == 15),
    "rc-ack": roce("rxe-rc-send.pcap", lambda o, s, p: o == 17),
    "rc-nak-psn-seq": roce("rxe-rc-write-loss.pcap", lambda o, s, p: o == 17 and s == 0x60),
    "rc-rnr-nak": roce("rxe-rc-rnr.pcap", lambda o, s, p: o == 17 and s == 0x2c),
    "rc-fetch-add": roce("rxe-rc-atomic.pcap", lambda o, s, p: o == 20),
    "rc-cmp-swap": roce("rxe-rc-atomic-cmpswap.pcap", lambda o, s, p: o == 19),
    "rc-atomic-ack": roce("rxe-rc-atomic.pcap", lambda o, s, p: o == 18),
    "ud-send-only-cm-mad": roce("rxe-rdmacm-rping.pcap", lambda o, s, p: o == 100),
    "uc-send-last": roce("rxe-uc-send.pcap", lambda o, s, p: o == 34),
}
seeds["rc-ack-ipv6"] = to_v6(seeds["rc-ack"])
for k, v in list(seeds.items()):
    if v[0] >> 4 == 4: assert icrc(v) == v[-4:], k  # the captures' ICRCs are right
os.makedirs(OUT, exist_ok=True)
for k, v in seeds.items():
    open(OUT + k, "wb").write(v)

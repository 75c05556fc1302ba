#!/usr/bin/env python3
"""Checks every RoCEv2 frame (UDP port 4791) of classic Ethernet pcap files: one packet per datagram.

  roce_pcap_check.py FILE.pcap...   prints the counts; exit 1 if a frame is bad or none is RoCE

A frame is good when its ICRC (IBA Annex A17: CRC-32 over 8 bytes of ones for the LRH, the IP and UDP
headers with their variant fields set to ones, the BTH with its reserved byte set to ones, and the
rest up to the ICRC) matches the last four bytes of the datagram, stored least significant byte
first, and when tshark's InfiniBand dissector finds a BTH in it and nothing malformed. Two packets in
one datagram fail the ICRC: it covers the whole datagram. The CRC is zlib's, not MelonDMA's.
"""
import os
import re
import struct
import subprocess
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def frames(path):
    data = open(path, 'rb').read()
    order = {b'\xd4\xc3\xb2\xa1': '<', b'\xa1\xb2\xc3\xd4': '>'}.get(data[:4])
    if not order or struct.unpack(order + 'I', data[20:24])[0] != 1:
        raise SystemExit('%s: not a classic Ethernet pcap' % path)
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack(order + 'I', data[off + 8:off + 12])[0]
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def icrc_ok(f):
    """None if f is not RoCEv2, else whether its ICRC is right."""
    l3 = 14
    kind = struct.unpack('>H', f[12:14])[0]
    if kind == 0x0800 and f[l3 + 9] == 17:
        ihl = (f[l3] & 15) * 4
        end = l3 + struct.unpack('>H', f[l3 + 2:l3 + 4])[0]
        ip = bytearray(f[l3:l3 + ihl])
        ip[1] = ip[8] = 0xff  # TOS, TTL
        ip[10:12] = b'\xff\xff'  # header checksum
    elif kind == 0x86dd and f[l3 + 6] == 17:
        ihl = 40
        end = l3 + 40 + struct.unpack('>H', f[l3 + 4:l3 + 6])[0]
        ip = bytearray(f[l3:l3 + 40])
        ip[0] |= 0x0f  # traffic class and flow label
        ip[1:4] = b'\xff\xff\xff'
        ip[7] = 0xff  # hop limit
    else:
        return None
    udp = bytearray(f[l3 + ihl:l3 + ihl + 8])
    if len(udp) < 8 or struct.unpack('>H', udp[2:4])[0] != 4791:
        return None
    udp[6:8] = b'\xff\xff'
    body = bytearray(f[l3 + ihl + 8:end])
    if len(body) < 16:
        return False
    body[4] = 0xff  # BTH resv8a
    crc = zlib.crc32(b'\xff' * 8 + bytes(ip) + bytes(udp) + bytes(body[:-4])) & 0xffffffff
    return crc == struct.unpack('<I', bytes(body[-4:]))[0]


def tshark_bad(path):
    """Frames tshark's dissector finds no BTH in, or calls malformed."""
    names = re.findall(r'"([^"]+)"', open(os.path.join(HERE, '..', 'common', 'tshark_payload_protocols.inc')).read())
    cmd = ['tshark', '-n', '-r', path, '-d', 'udp.port==4791,infiniband', '-Y', 'udp.port == 4791',
           '-T', 'fields', '-e', 'frame.number', '-e', 'infiniband.bth.opcode', '-e', '_ws.malformed']
    for n in names:
        cmd += ['--disable-protocol', n]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    bad = []
    for line in out.splitlines():
        cols = line.split('\t') + ['', '', '']
        if not cols[1] or cols[2]:
            bad.append(cols[0])
    return bad


def main(paths):
    status = 0
    for path in paths:
        good = bad = 0
        first_bad = []
        for i, f in enumerate(frames(path), 1):
            ok = icrc_ok(f)
            if ok is None:
                continue
            if ok:
                good += 1
            else:
                bad += 1
                first_bad.append(str(i))
        dissect = tshark_bad(path)
        print('%s: %d RoCEv2 frames, %d with a wrong ICRC%s; %d that tshark cannot dissect as one packet%s'
              % (path, good + bad, bad, ' (frames %s)' % ','.join(first_bad[:10]) if bad else '',
                 len(dissect), ' (frames %s)' % ','.join(dissect[:10]) if dissect else ''))
        if bad or dissect or not good:
            status = 1
    return status


if __name__ == '__main__':
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# The pcap checker of the peer gate (roce_pcap_check.py) against captures whose answer is known:
# every rxe capture in tests/data passes; the frame with two packets in it (soft-merged-ack-send.pcap)
# and a copy of an rxe capture with one payload byte flipped fail.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
caps=$here/../data/captures
check=$here/roce_pcap_check.py
command -v tshark >/dev/null || { echo "SKIPPED: no tshark"; exit 77; }
fail=0
for f in "$caps"/rxe-*.pcap; do
  "$check" "$f" >/dev/null || { echo "FAIL: refused $(basename "$f"): $("$check" "$f")"; fail=1; }
done
if "$check" "$caps/soft-merged-ack-send.pcap" >/dev/null; then echo "FAIL: accepted soft-merged-ack-send.pcap"; fail=1; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$caps/rxe-rc-send.pcap" "$tmp/flipped.pcap" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], 'rb').read())
off = 24
while off + 16 <= len(d):  # the first RoCEv2 frame with a payload: flip its last payload byte
    n = struct.unpack('<I', d[off + 8:off + 12])[0]
    f = off + 16
    if n > 80 and d[f + 12:f + 14] == b'\x08\x00' and struct.unpack('>H', d[f + 36:f + 38])[0] == 4791:
        d[f + n - 5] ^= 1
        break
    off = f + n
open(sys.argv[2], 'wb').write(d)
PY
if "$check" "$tmp/flipped.pcap" >/dev/null; then echo "FAIL: accepted a frame with a flipped payload byte"; fail=1; fi
[ "$fail" = 0 ] && echo "ok: roce_pcap_check.py passes the rxe captures and refuses the bad ones"
exit "$fail"

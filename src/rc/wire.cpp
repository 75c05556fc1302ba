#include "rc/wire.h"

#include <string.h>

namespace melon::rc {

roce::IpUdp tx_ip(const TxPacket& tx) {
  roce::IpUdp ip;
  const AddressVector& av = *tx.av;
  ip.v6 = !roce::gid_is_v4_mapped(av.dgid);
  memcpy(ip.src, av.sgid, 16);
  memcpy(ip.dst, av.dgid, 16);
  ip.tclass = av.traffic_class;
  ip.ttl = av.hop_limit;
  ip.flow_label = av.flow_label;
  ip.sport = tx.udp_sport;
  return ip;
}

}  // namespace melon::rc

// Wireshark's payload heuristics switched off for tests that check RoCE, not the data it carries.
#pragma once
#include <string>

namespace melon::test {

inline const char* const kTsharkPayloadProtocols[] = {
#include "common/tshark_payload_protocols.inc"
};

// " --disable-protocol P" for each of them.
inline std::string tshark_plain_payloads() {
  std::string s;
  for (const char* p : kTsharkPayloadProtocols) s += std::string(" --disable-protocol ") + p;
  return s;
}

}  // namespace melon::test

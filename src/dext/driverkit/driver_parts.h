// What MlxPCIDriver shares with its user clients in the same process (MlxPCIDriver::CoreDevice
// returns one of these; iig's LOCAL methods take no project types, hence the void*).
#pragma once

namespace melon::dext {

class DextDevice;
class QueueMemory;

struct DriverParts {
  DextDevice* dev;
  QueueMemory* queues;
};

}  // namespace melon::dext

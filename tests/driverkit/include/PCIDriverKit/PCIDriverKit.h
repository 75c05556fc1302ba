// Stand-in: see DriverKit/standin.h.
#pragma once
#include "PCIDriverKit/IOPCIDevice.h"

// Stand-in: see DriverKit/standin.h.
#pragma once
#include "DriverKit/standin.h"

// What iig adds to every generated header, as the stand-in build spells it: IMPL names the
// implementation of an RPC method, SUPERDISPATCH calls the superclass's, and each class registers
// a factory so IOService::Create can instantiate it by its IOUserClass name.
#pragma once

#include "DriverKit/standin.h"

// iig's IMPL expands to the qualified name and the parameter list of the method as the .iig
// declares it (<class>_<method>_Args below, one per method, with the .iig's parameter names).
#define IMPL(cls, method) cls::method##_Impl(cls##_##method##_Args)
struct MelonSuperDispatch {};
#define SUPERDISPATCH \
  MelonSuperDispatch {}
#define kIOServiceDefaultQueueName "Default"

typedef IOService* (*MelonStandinFactory)();
bool melon_standin_register_class(const char* name, MelonStandinFactory make);

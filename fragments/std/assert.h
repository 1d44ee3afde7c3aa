// fraglink stand-in for <assert.h> under NVRTC: libcu++'s <cuda/std/cassert>
// (device assert; NDEBUG turns it off as usual).
#pragma once
#include <cuda/std/cassert>

// fraglink stand-in for <limits.h> under NVRTC: libcu++'s <cuda/std/climits>.
#pragma once
#include <cuda/std/climits>

// fraglink stand-in for <stdlib.h> under NVRTC: libcu++'s <cuda/std/cstdlib>
// (abs, div, ...). malloc and free are NVRTC built-ins in device code.
#pragma once
#include <cuda/std/cstdlib>

// fraglink stand-in for <string.h> under NVRTC: memcpy and memset are NVRTC
// built-ins in device code.
#pragma once

// fraglink stand-in for <stddef.h> under NVRTC: libcu++'s <cuda/std/cstddef>.
#pragma once
#include <cuda/std/cstddef>
typedef ::cuda::std::size_t size_t;
typedef ::cuda::std::ptrdiff_t ptrdiff_t;

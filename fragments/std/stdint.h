// fraglink stand-in for <stdint.h> under NVRTC: libcu++'s <cuda/std/cstdint>
// with the C names in the global namespace.
#pragma once
#include <cuda/std/cstdint>
#include <cuda/std/climits>
typedef ::cuda::std::int8_t int8_t;
typedef ::cuda::std::int16_t int16_t;
typedef ::cuda::std::int32_t int32_t;
typedef ::cuda::std::int64_t int64_t;
typedef ::cuda::std::uint8_t uint8_t;
typedef ::cuda::std::uint16_t uint16_t;
typedef ::cuda::std::uint32_t uint32_t;
typedef ::cuda::std::uint64_t uint64_t;
typedef ::cuda::std::intptr_t intptr_t;
typedef ::cuda::std::uintptr_t uintptr_t;
typedef ::cuda::std::intmax_t intmax_t;
typedef ::cuda::std::uintmax_t uintmax_t;

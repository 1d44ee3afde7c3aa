// fraglink: `std::X` resolves to libcu++'s `cuda::std::X` in NVRTC builds,
// so code written for the host standard library compiles unchanged.
#pragma once
namespace cuda { namespace std {} }
namespace std { using namespace ::cuda::std; }

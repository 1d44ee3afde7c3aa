// fraglink stand-in for <float.h> under NVRTC: libcu++'s <cuda/std/cfloat>,
// plus the common limits it leaves undefined under NVRTC.
#pragma once
#include <cuda/std/cfloat>
#ifndef FLT_MAX
#define FLT_MAX 3.40282346638528859812e+38F
#define FLT_MIN 1.17549435082228750797e-38F
#define FLT_EPSILON 1.1920928955078125e-07F
#define FLT_DIG 6
#define FLT_MANT_DIG 24
#endif
#ifndef DBL_MAX
#define DBL_MAX 1.79769313486231570815e+308
#define DBL_MIN 2.22507385850720138309e-308
#define DBL_EPSILON 2.22044604925031308085e-16
#define DBL_DIG 15
#define DBL_MANT_DIG 53
#endif

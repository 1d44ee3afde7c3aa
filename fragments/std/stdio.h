// fraglink stand-in for <stdio.h> under NVRTC: device printf is an NVRTC
// built-in, so there is nothing to declare.
#pragma once

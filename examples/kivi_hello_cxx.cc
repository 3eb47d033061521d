// kivi_hello compiled as C++: proves kivi.h is usable from C++ (extern "C", no C-only syntax).
#include "kivi_hello.c"

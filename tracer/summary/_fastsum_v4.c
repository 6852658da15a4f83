/* The summary kernel built for the x86-64-v4 instruction level (setup.py passes the flags; the
 * loader in kernel.py uses this build only where the baseline build's gs_cpu_level() allows). Its
 * own file so that each build has its own object file. */
#include "_fastsum.c"

/* exec.h: connections that live on across exec (exec.c). */
#pragma once

/* exec_adopt, at the library's start, takes over the connections an exec passed
 * (SMCR_INHERIT) and installs them at their fds. */
void exec_adopt(void);

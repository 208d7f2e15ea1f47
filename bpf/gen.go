package bpf

// Fixed flags and relative paths keep the output byte-for-byte reproducible
// (make check-generate). The asm/ headers of linux-libc-dev live in the multiarch
// directory; BPF code uses nothing architecture-specific from them.
//go:generate go tool bpf2go -target bpfel -cflags "-O2 -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -type app_opts smcr c/smcr.c

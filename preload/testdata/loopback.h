/* loopback.h: what the test programs share: CHECK, and a listener on loopback. */
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, strerror(errno)); exit(2); } } while (0)

/* listen_loopback listens on a free loopback port (type: SOCK_STREAM and its flags)
 * and stores its address in a. */
static inline int listen_loopback(int type, struct sockaddr_in *a)
{
	int l = socket(AF_INET, type, 0);
	CHECK(l >= 0);
	*a = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	CHECK(bind(l, (struct sockaddr *)a, sizeof(*a)) == 0);
	socklen_t al = sizeof(*a);
	CHECK(getsockname(l, (struct sockaddr *)a, &al) == 0);
	CHECK(listen(l, 4) == 0);
	return l;
}
